//! The binary form of one rank's training checkpoint ([`Checkpoint`]): everything a rank
//! needs to continue a run exactly where it stopped.
//!
//! This file depends on nothing of gradwire (only `std`, `thiserror` and `crc32fast`), so
//! the fuzz target compiles it on its own.
//!
//! ## Format (version 1)
//!
//! All integers little-endian. A 24-byte header, then the body:
//!
//! ```text
//! header  magic          8 bytes  "GWCKPT\r\n"
//!         version        u32      1
//!         checksum       u32      CRC-32 (IEEE, as zlib.crc32) of the body
//!         body length    u64      bytes after the header
//! body    rank           u32
//!         world size     u32      rank < world size
//!         epoch          u64      the epoch being run (0-based)
//!         step in epoch  u64      steps of that epoch already taken
//!         global step    u64      steps taken since the start of the run
//!         loss sum       f64      sum of this epoch's step losses so far
//!         config         u64 length + UTF-8   the run's resolved configuration (JSON)
//!         software       u64 length + UTF-8   gradwire version and git revision
//!         params         u64 count + f32 each the flat parameters
//!         optimizer      u64 length + bytes   OptimizerState::to_bytes
//!         sync           u64 length + bytes   the gradient sync's state (EngineState::to_bytes)
//! ```
//!
//! The data order needs no bytes of its own: each epoch's permutation is a pure function of
//! the seed (in `config`) and the epoch, and the models here draw no random numbers after
//! their initialization; the codecs' random streams are in the sync's state.
//!
//! The decoder is total: every input gives a [`Checkpoint`] or a [`CheckpointFormatError`],
//! never a panic, and every announced length is checked against the bytes that remain
//! before anything is allocated, so it allocates no more than the input's size.

/// The first eight bytes of a checkpoint file.
pub const CHECKPOINT_MAGIC: [u8; 8] = *b"GWCKPT\r\n";
/// The format version [`Checkpoint::to_bytes`] writes (and the only one read).
pub const CHECKPOINT_VERSION: u32 = 1;
/// Bytes before the body: magic, version, checksum, body length.
const HEADER: usize = 24;

/// One rank's state at a step boundary (see the [module doc](self) for the binary form).
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The rank that wrote it.
    pub rank: u32,
    /// The world size it was written in.
    pub world_size: u32,
    /// The epoch being run (0-based).
    pub epoch: u64,
    /// Steps of that epoch already taken (equal to the epoch's step count when the epoch's
    /// steps are done but its evaluation is not).
    pub step_in_epoch: u64,
    /// Steps taken since the start of the run.
    pub global_step: u64,
    /// The sum of this epoch's step losses so far (the epoch's mean loss continues).
    pub loss_sum: f64,
    /// The run's resolved configuration, as JSON text (compared on resume).
    pub config: String,
    /// The software that wrote it: gradwire's version and git revision.
    pub software: String,
    /// The flat parameters.
    pub params: Vec<f32>,
    /// The optimizer's state (`OptimizerState::to_bytes`).
    pub optimizer: Vec<u8>,
    /// The gradient sync's state (the engine's `EngineState::to_bytes`).
    pub sync: Vec<u8>,
}

/// Why bytes are not a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointFormatError {
    /// Shorter than the header, or than the body length the header announces.
    #[error("truncated: {len} bytes, {needed} needed")]
    Truncated {
        /// The bytes there are.
        len: u64,
        /// The bytes the header calls for.
        needed: u64,
    },
    /// Does not start with [`CHECKPOINT_MAGIC`]: not a gradwire checkpoint.
    #[error("not a gradwire checkpoint (bad magic)")]
    BadMagic,
    /// Written by a format version this build does not read.
    #[error("format version {found} (this build reads version {CHECKPOINT_VERSION})")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// The body's CRC-32 differs from the header's: the file is corrupted.
    #[error("corrupted: checksum {found:#010x}, expected {expected:#010x}")]
    Checksum {
        /// The CRC-32 of the body as read.
        found: u32,
        /// The CRC-32 the header records.
        expected: u32,
    },
    /// Bytes follow the announced body.
    #[error("{extra} bytes after the announced body")]
    Trailing {
        /// How many.
        extra: u64,
    },
    /// A field of the body is malformed (its length overruns the body, a string is not
    /// UTF-8, the rank is outside the world).
    #[error("malformed {field}: {what}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        what: &'static str,
    },
}

impl Checkpoint {
    /// The binary form (version [`CHECKPOINT_VERSION`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let len = 48
            + 8 * 5
            + self.config.len()
            + self.software.len()
            + 4 * self.params.len()
            + self.optimizer.len()
            + self.sync.len();
        let mut body = Vec::with_capacity(len);
        body.extend_from_slice(&self.rank.to_le_bytes());
        body.extend_from_slice(&self.world_size.to_le_bytes());
        body.extend_from_slice(&self.epoch.to_le_bytes());
        body.extend_from_slice(&self.step_in_epoch.to_le_bytes());
        body.extend_from_slice(&self.global_step.to_le_bytes());
        body.extend_from_slice(&self.loss_sum.to_le_bytes());
        for b in [self.config.as_bytes(), self.software.as_bytes()] {
            body.extend_from_slice(&(b.len() as u64).to_le_bytes());
            body.extend_from_slice(b);
        }
        body.extend_from_slice(&(self.params.len() as u64).to_le_bytes());
        for p in &self.params {
            body.extend_from_slice(&p.to_le_bytes());
        }
        for b in [&self.optimizer, &self.sync] {
            body.extend_from_slice(&(b.len() as u64).to_le_bytes());
            body.extend_from_slice(b);
        }
        let mut out = Vec::with_capacity(HEADER + body.len());
        out.extend_from_slice(&CHECKPOINT_MAGIC);
        out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes [`Checkpoint::to_bytes`]: every input gives a value or a typed error.
    pub fn from_bytes(bytes: &[u8]) -> Result<Checkpoint, CheckpointFormatError> {
        let len = bytes.len() as u64;
        if bytes.len() < 8 || bytes[..8] != CHECKPOINT_MAGIC {
            // A file cut inside its magic is truncated, not foreign.
            if bytes.len() < 8 && CHECKPOINT_MAGIC.starts_with(bytes) {
                return Err(CheckpointFormatError::Truncated {
                    len,
                    needed: HEADER as u64,
                });
            }
            return Err(CheckpointFormatError::BadMagic);
        }
        if bytes.len() < HEADER {
            return Err(CheckpointFormatError::Truncated {
                len,
                needed: HEADER as u64,
            });
        }
        let version = u32::from_le_bytes(take(bytes, 8));
        if version != CHECKPOINT_VERSION {
            return Err(CheckpointFormatError::Version { found: version });
        }
        let expected = u32::from_le_bytes(take(bytes, 12));
        let body_len = u64::from_le_bytes(take(bytes, 16));
        let avail = len - HEADER as u64;
        if body_len > avail {
            return Err(CheckpointFormatError::Truncated {
                len,
                needed: (HEADER as u64).saturating_add(body_len),
            });
        }
        if body_len < avail {
            return Err(CheckpointFormatError::Trailing {
                extra: avail - body_len,
            });
        }
        let body = &bytes[HEADER..];
        let found = crc32fast::hash(body);
        if found != expected {
            return Err(CheckpointFormatError::Checksum { found, expected });
        }
        decode_body(body)
    }
}

/// The `N` bytes of `b` at `at` (the caller checked that they are there).
fn take<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

/// Reads the body's fields in order, each checked against what remains.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: u64, field: &'static str) -> Result<&'a [u8], CheckpointFormatError> {
        if n > self.rest.len() as u64 {
            return Err(CheckpointFormatError::Field {
                field,
                what: "length overruns the body",
            });
        }
        let (head, tail) = self.rest.split_at(n as usize);
        self.rest = tail;
        Ok(head)
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, CheckpointFormatError> {
        Ok(u64::from_le_bytes(take(self.bytes(8, field)?, 0)))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, CheckpointFormatError> {
        Ok(u32::from_le_bytes(take(self.bytes(4, field)?, 0)))
    }

    fn section(&mut self, field: &'static str) -> Result<&'a [u8], CheckpointFormatError> {
        let n = self.u64(field)?;
        self.bytes(n, field)
    }

    fn text(&mut self, field: &'static str) -> Result<String, CheckpointFormatError> {
        let b = self.section(field)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| CheckpointFormatError::Field {
                field,
                what: "not UTF-8",
            })
    }
}

fn decode_body(body: &[u8]) -> Result<Checkpoint, CheckpointFormatError> {
    let mut r = Reader { rest: body };
    let rank = r.u32("rank")?;
    let world_size = r.u32("world size")?;
    if rank >= world_size {
        return Err(CheckpointFormatError::Field {
            field: "rank",
            what: "not below the world size",
        });
    }
    let epoch = r.u64("epoch")?;
    let step_in_epoch = r.u64("step in epoch")?;
    let global_step = r.u64("global step")?;
    let loss_sum = f64::from_bits(r.u64("loss sum")?);
    let config = r.text("config")?;
    let software = r.text("software")?;
    let count = r.u64("params")?;
    let raw = r.bytes(count.saturating_mul(4), "params")?;
    let params = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(take(c, 0)))
        .collect();
    let optimizer = r.section("optimizer")?.to_vec();
    let sync = r.section("sync")?.to_vec();
    if !r.rest.is_empty() {
        return Err(CheckpointFormatError::Field {
            field: "sync",
            what: "bytes follow the last field",
        });
    }
    Ok(Checkpoint {
        rank,
        world_size,
        epoch,
        step_in_epoch,
        global_step,
        loss_sum,
        config,
        software,
        params,
        optimizer,
        sync,
    })
}

/// For the fuzz target: decodes `data` (which must not panic) and, when it decodes, checks
/// that it encodes back to the same bytes.
#[cfg(fuzzing)]
pub fn fuzz_checkpoint(data: &[u8]) {
    if let Ok(c) = Checkpoint::from_bytes(data) {
        assert_eq!(
            c.to_bytes(),
            data,
            "a decoded checkpoint re-encodes as read"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            rank: 1,
            world_size: 4,
            epoch: 2,
            step_in_epoch: 7,
            global_step: 27,
            loss_sum: 3.25,
            config: r#"{"model":"lenet"}"#.into(),
            software: "gradwire 0.1.0 (abc)".into(),
            params: vec![1.0, -2.5, f32::MIN_POSITIVE],
            optimizer: vec![9, 8, 7],
            sync: vec![1, 2, 3, 4, 5],
        }
    }

    #[test]
    fn round_trips_bit_for_bit() {
        let c = sample();
        let b = c.to_bytes();
        assert_eq!(Checkpoint::from_bytes(&b).unwrap(), c);
        assert_eq!(Checkpoint::from_bytes(&b).unwrap().to_bytes(), b);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_a_typed_error() {
        let b = sample().to_bytes();
        for n in 0..b.len() {
            let e = Checkpoint::from_bytes(&b[..n]).unwrap_err();
            assert!(
                matches!(e, CheckpointFormatError::Truncated { .. }),
                "cut at {n}: {e}"
            );
        }
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(Checkpoint::from_bytes(&c).is_err(), "flip at {i} accepted");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert_eq!(
            Checkpoint::from_bytes(&longer),
            Err(CheckpointFormatError::Trailing { extra: 1 })
        );
    }

    #[test]
    fn lengths_past_the_body_are_refused_before_allocating() {
        // A body whose param count claims 2^62 floats, with a correct checksum.
        let mut c = sample();
        c.params.clear();
        let b = c.to_bytes();
        let body = &b[HEADER..];
        let at = 8 + 8 * 4 + 8 + c.config.len() + 8 + c.software.len();
        let mut body = body.to_vec();
        body[at..at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
        let mut forged = b[..HEADER].to_vec();
        forged[12..16].copy_from_slice(&crc32fast::hash(&body).to_le_bytes());
        forged.extend_from_slice(&body);
        assert_eq!(
            Checkpoint::from_bytes(&forged),
            Err(CheckpointFormatError::Field {
                field: "params",
                what: "length overruns the body"
            })
        );
    }
}
