//! A rank's synchronization state ([`EngineState`]): what [`Engine::save_state`] takes and
//! [`Engine::load_state`] restores, so that a training that stops resumes bit for bit, and
//! its binary form ([`EngineState::to_bytes`], [`EngineState::from_bytes`]).
//!
//! What a rank carries from one step to the next, per registered tensor: the state of its
//! codec, or of its strategy's all-reduce (the quantized ring's and the stripes' codecs,
//! PowerSGD's `Q`s, error and step count), and its momentum-correction velocity; and the
//! engine's progress ([`Engine::set_progress`]). A selection unit's (`topk:scope=global`)
//! single codec is saved with the unit's first tensor; its other tensors carry no codec
//! state. The state is per rank: it names the rank, world size and seed it was saved under,
//! and loads only there.
//!
//! ## Format (version 1)
//!
//! All integers little-endian. A 20-byte header, then the body:
//!
//! ```text
//! header  magic        4 bytes  "GWES"
//!         version      u32      1
//!         body length  u64      bytes after the header
//!         checksum     u32      CRC-32 (IEEE, as zlib.crc32) of the body
//! body    rank         u64
//!         world size   u64      rank < world size
//!         seed         u64      EngineConfig::seed
//!         step         u64      } Engine::set_progress
//!         epoch        f32      } (finite)
//!         tensors      u32      count, then per tensor, in registration order:
//!           name       u32 length + UTF-8
//!           policy     u32 length + UTF-8    codec@strategy, role, momentum (as negotiated)
//!           shape      u32 rank + u64 each   the element count is their product
//!           velocity   u8 0 | 1              1: u64 count (= elements) + f32 each
//!           state      u64 length + bytes    the codec's or all-reduce's own saved state
//! ```
//!
//! The decoder is total: every input gives an [`EngineState`] or a [`StateFormatError`],
//! never a panic, and it allocates no more than a small multiple of the input's length
//! (every announced length is checked against the bytes that remain before anything is
//! read or reserved).
//!
//! [`Engine::save_state`]: crate::Engine::save_state
//! [`Engine::load_state`]: crate::Engine::load_state
//! [`Engine::set_progress`]: crate::Engine::set_progress

/// The first four bytes of a saved [`EngineState`].
pub const STATE_MAGIC: [u8; 4] = *b"GWES";
/// The format version [`EngineState::to_bytes`] writes (and the only one read).
pub const STATE_VERSION: u32 = 1;
/// Bytes before the body: magic, version, body length, checksum.
const HEADER: usize = 20;

/// The synchronization state of one rank's engine, between steps (see the [module
/// doc](self) for what it holds and its binary form).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineState {
    /// The rank it was saved on.
    pub rank: usize,
    /// The world size it was saved in.
    pub world_size: usize,
    /// [`EngineConfig::seed`](crate::EngineConfig::seed) of the engine that saved it (the
    /// codecs' random streams are keyed by it).
    pub seed: u64,
    /// The step last given to [`Engine::set_progress`](crate::Engine::set_progress).
    pub step: u64,
    /// The epoch last given to [`Engine::set_progress`](crate::Engine::set_progress).
    pub epoch: f32,
    /// Every registered tensor's state, in registration order.
    pub tensors: Vec<SavedTensor>,
}

/// One registered tensor's saved state.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedTensor {
    /// Its name.
    pub name: String,
    /// Its policy as the ranks agreed on it at start: codec, strategy, role and momentum
    /// settings (a state loads only under the same policy).
    pub policy: String,
    /// Its shape.
    pub shape: Vec<u64>,
    /// The momentum-correction velocity (`None` without
    /// [`EngineConfig::momentum`](crate::EngineConfig::momentum)).
    pub velocity: Option<Vec<f32>>,
    /// The state of its codec or of its strategy's all-reduce, in their own format
    /// (`Codec::save_state`, `QuantizedAllReduce::save_state`, ...); empty for a dense
    /// tensor and for the tensors of a selection unit but its first.
    pub state: Vec<u8>,
}

impl SavedTensor {
    /// The number of elements (the product of the shape; `None` if it overflows).
    pub fn numel(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
    }
}

/// Why bytes are not a saved [`EngineState`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateFormatError {
    /// Shorter than the header, or than a length it announces.
    #[error("engine state truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// Bytes after the announced end.
    #[error("engine state has {extra} trailing bytes")]
    TrailingBytes {
        /// Bytes after the end.
        extra: usize,
    },
    /// Not a saved engine state.
    #[error("bad magic {found:02x?} (not a gradwire engine state)")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// A format version this build does not read.
    #[error("unsupported engine state version {found} (this build reads {STATE_VERSION})")]
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// The body's checksum does not match: the bytes were damaged.
    #[error("engine state checksum {found:#010x} does not match the header's {expected:#010x}")]
    BadChecksum {
        /// The checksum in the header.
        expected: u32,
        /// The checksum of the body as read.
        found: u32,
    },
    /// A field holds an impossible value.
    #[error("engine state field {field}: {reason}")]
    InvalidField {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl EngineState {
    /// The binary form (see the [module doc](self)).
    pub fn to_bytes(&self) -> Vec<u8> {
        let body = encode_body(self);
        let mut out = Vec::with_capacity(HEADER + body.len());
        out.extend_from_slice(&STATE_MAGIC);
        out.extend_from_slice(&STATE_VERSION.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Reads what [`EngineState::to_bytes`] wrote: a state, or a typed error for anything
    /// else (truncated, trailing bytes, another magic or version, a damaged body, an
    /// impossible field); never a panic.
    pub fn from_bytes(bytes: &[u8]) -> Result<EngineState, StateFormatError> {
        if bytes.len() < 4 {
            return Err(StateFormatError::Truncated {
                need: HEADER,
                have: bytes.len(),
            });
        }
        let magic: [u8; 4] = bytes[..4].try_into().expect("4 bytes");
        if magic != STATE_MAGIC {
            return Err(StateFormatError::BadMagic { found: magic });
        }
        if bytes.len() < HEADER {
            return Err(StateFormatError::Truncated {
                need: HEADER,
                have: bytes.len(),
            });
        }
        let mut r = Reader { rest: &bytes[4..] };
        let version = r.u32()?;
        if version != STATE_VERSION {
            return Err(StateFormatError::UnsupportedVersion { found: version });
        }
        let len = r.u64()?;
        let expected = r.u32()?;
        let have = (bytes.len() - HEADER) as u64;
        if len > have {
            return Err(StateFormatError::Truncated {
                need: HEADER.saturating_add(usize::try_from(len).unwrap_or(usize::MAX)),
                have: bytes.len(),
            });
        }
        if len < have {
            return Err(StateFormatError::TrailingBytes {
                extra: (have - len) as usize,
            });
        }
        let body = &bytes[HEADER..];
        let found = crc32(body);
        if found != expected {
            return Err(StateFormatError::BadChecksum { expected, found });
        }
        decode_body(body)
    }
}

/// The body (see the module doc).
pub(crate) fn encode_body(s: &EngineState) -> Vec<u8> {
    let size = 40
        + s.tensors
            .iter()
            .map(|t| {
                21 + t.name.len()
                    + t.policy.len()
                    + 8 * t.shape.len()
                    + t.velocity.as_ref().map_or(0, |v| 8 + 4 * v.len())
                    + t.state.len()
            })
            .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(s.rank as u64).to_le_bytes());
    out.extend_from_slice(&(s.world_size as u64).to_le_bytes());
    out.extend_from_slice(&s.seed.to_le_bytes());
    out.extend_from_slice(&s.step.to_le_bytes());
    out.extend_from_slice(&s.epoch.to_le_bytes());
    out.extend_from_slice(&(s.tensors.len() as u32).to_le_bytes());
    for t in &s.tensors {
        for text in [&t.name, &t.policy] {
            out.extend_from_slice(&(text.len() as u32).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for d in &t.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        match &t.velocity {
            None => out.push(0),
            Some(v) => {
                out.push(1);
                out.extend_from_slice(&(v.len() as u64).to_le_bytes());
                for x in v {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        out.extend_from_slice(&(t.state.len() as u64).to_le_bytes());
        out.extend_from_slice(&t.state);
    }
    out
}

/// Reads a body (no header, no checksum): total, as [`EngineState::from_bytes`].
pub(crate) fn decode_body(body: &[u8]) -> Result<EngineState, StateFormatError> {
    let invalid = |field, reason| StateFormatError::InvalidField { field, reason };
    let mut r = Reader { rest: body };
    let rank = r.u64()?;
    let world = r.u64()?;
    if world == 0 || rank >= world {
        return Err(invalid("rank", "not below the world size"));
    }
    let (Ok(rank), Ok(world_size)) = (usize::try_from(rank), usize::try_from(world)) else {
        return Err(invalid("world size", "does not fit this machine's usize"));
    };
    let seed = r.u64()?;
    let step = r.u64()?;
    let epoch = f32::from_bits(r.u32()?);
    if !epoch.is_finite() {
        return Err(invalid("epoch", "not finite"));
    }
    let count = r.u32()?;
    // Each tensor takes at least 21 bytes: no announced count reserves more than that.
    let mut tensors = Vec::with_capacity((count as usize).min(r.rest.len() / 21));
    for _ in 0..count {
        let name = r.text("name")?;
        let policy = r.text("policy")?;
        let dims = r.u32()?;
        let dims = r.len(dims.into(), 8)?;
        let shape = (0..dims)
            .map(|_| r.u64())
            .collect::<Result<Vec<u64>, _>>()?;
        let numel = shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or(invalid("shape", "element count overflows u64"))?;
        let velocity = match r.take(1)?[0] {
            0 => None,
            1 => {
                let n = r.u64()?;
                if n != numel {
                    return Err(invalid("velocity", "length differs from the shape's"));
                }
                let n = r.len(n, 4)?;
                Some(
                    r.take(4 * n)?
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                )
            }
            _ => return Err(invalid("velocity", "flag is neither 0 nor 1")),
        };
        let n = r.u64()?;
        let n = r.len(n, 1)?;
        let state = r.take(n)?.to_vec();
        tensors.push(SavedTensor {
            name,
            policy,
            shape,
            velocity,
            state,
        });
    }
    if !r.rest.is_empty() {
        return Err(StateFormatError::TrailingBytes {
            extra: r.rest.len(),
        });
    }
    Ok(EngineState {
        rank,
        world_size,
        seed,
        step,
        epoch,
        tensors,
    })
}

/// Reads little-endian fields, refusing every length larger than what remains.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StateFormatError> {
        if self.rest.len() < n {
            return Err(StateFormatError::Truncated {
                need: n,
                have: self.rest.len(),
            });
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, StateFormatError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, StateFormatError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    /// An announced count of `elem`-byte elements, when that many bytes remain.
    fn len(&self, n: u64, elem: usize) -> Result<usize, StateFormatError> {
        if n > (self.rest.len() / elem) as u64 {
            return Err(StateFormatError::Truncated {
                need: usize::try_from(n)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(elem),
                have: self.rest.len(),
            });
        }
        Ok(n as usize)
    }

    /// A `u32` length and that many bytes of UTF-8.
    fn text(&mut self, field: &'static str) -> Result<String, StateFormatError> {
        let n = self.u32()? as usize;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| StateFormatError::InvalidField {
            field,
            reason: "not UTF-8",
        })
    }
}

/// CRC-32 (IEEE 802.3, reflected, as zlib's `crc32` and `crc32fast` compute it).
pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    !bytes.iter().fold(!0u32, |c, &b| {
        TABLE[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EngineState {
        EngineState {
            rank: 1,
            world_size: 2,
            seed: 7,
            step: 3,
            epoch: 1.5,
            tensors: vec![
                SavedTensor {
                    name: "w".into(),
                    policy: "topk@sparse role=weight".into(),
                    shape: vec![2, 3],
                    velocity: Some(vec![0.5, -1.0, 0.0, 2.0, -0.0, 3.25]),
                    state: b"GWS\x0cabc".to_vec(),
                },
                SavedTensor {
                    name: "b\u{e9}".into(),
                    policy: "none@dense".into(),
                    shape: vec![],
                    velocity: None,
                    state: vec![],
                },
            ],
        }
    }

    #[test]
    fn crc32_is_zlibs() {
        // zlib.crc32(b"123456789") == 0xCBF43926, the standard check value.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn round_trips_and_is_canonical() {
        let s = sample();
        let b = s.to_bytes();
        assert_eq!(&b[..4], b"GWES");
        let back = EngineState::from_bytes(&b).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.to_bytes(), b);
        assert_eq!(back.tensors[0].numel(), Some(6));
        assert_eq!(back.tensors[1].numel(), Some(1));
    }

    /// Every prefix is refused as truncated (or, under 4 bytes, as too short for the magic),
    /// every single-byte change is refused, and so is every appended byte.
    #[test]
    fn truncated_damaged_and_padded_bytes_are_refused() {
        let b = sample().to_bytes();
        for cut in 0..b.len() {
            match EngineState::from_bytes(&b[..cut]) {
                Err(StateFormatError::Truncated { .. }) => {}
                Err(StateFormatError::BadMagic { .. }) if cut < 4 => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
        for at in 0..b.len() {
            for bit in [0x01u8, 0x80] {
                let mut bad = b.clone();
                bad[at] ^= bit;
                assert!(
                    EngineState::from_bytes(&bad).is_err(),
                    "byte {at} ^ {bit:#x}"
                );
            }
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(
            EngineState::from_bytes(&long),
            Err(StateFormatError::TrailingBytes { extra: 1 })
        );
        let mut v2 = b.clone();
        v2[4] = 2;
        assert_eq!(
            EngineState::from_bytes(&v2),
            Err(StateFormatError::UnsupportedVersion { found: 2 })
        );
        let mut other = b.clone();
        other[..4].copy_from_slice(b"GWS\x01");
        assert!(matches!(
            EngineState::from_bytes(&other),
            Err(StateFormatError::BadMagic { .. })
        ));
        let mut body = b.clone();
        body[HEADER + 30] ^= 1;
        assert!(matches!(
            EngineState::from_bytes(&body),
            Err(StateFormatError::BadChecksum { .. })
        ));
    }

    /// Bodies with impossible fields, their checksums right: typed errors, and announced
    /// lengths far beyond the input allocate nothing.
    #[test]
    fn impossible_fields_are_refused() {
        let body = encode_body(&sample());
        let refused = |edit: &dyn Fn(&mut Vec<u8>), what: &str| {
            let mut b = body.clone();
            edit(&mut b);
            assert!(decode_body(&b).is_err(), "{what}");
        };
        refused(
            &|b| b[0..8].copy_from_slice(&2u64.to_le_bytes()),
            "rank = world",
        );
        refused(
            &|b| b[8..16].copy_from_slice(&0u64.to_le_bytes()),
            "world 0",
        );
        refused(
            &|b| b[32..36].copy_from_slice(&f32::NAN.to_le_bytes()),
            "NaN epoch",
        );
        refused(
            &|b| b[36..40].copy_from_slice(&u32::MAX.to_le_bytes()),
            "count",
        );
        // The first tensor's name length.
        refused(
            &|b| b[40..44].copy_from_slice(&u32::MAX.to_le_bytes()),
            "name",
        );
        refused(&|b| b[44] = 0xFF, "name not UTF-8");
        // The first tensor's velocity flag, and its count.
        let flag = 40 + 4 + 1 + 4 + "topk@sparse role=weight".len() + 4 + 16;
        refused(&|b| b[flag] = 2, "flag 2");
        refused(&|b| b[flag + 1] = 7, "velocity of the wrong length");
        refused(
            &|b| b[flag + 1..flag + 9].copy_from_slice(&u64::MAX.to_le_bytes()),
            "huge",
        );
        // A shape whose element count overflows.
        refused(
            &|b| {
                b[flag - 16..flag - 8].copy_from_slice(&u64::MAX.to_le_bytes());
            },
            "overflowing shape",
        );
        assert!(decode_body(&body).is_ok());
    }
}
