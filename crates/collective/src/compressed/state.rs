//! The state the compressed all-reduces carry across steps, to and from bytes (a training
//! that stops resumes bit for bit).
//!
//! Layout: a 4-byte tag naming the all-reduce (`GWQR` quantized ring, `GWSR` stripes, `GWPS`
//! PowerSGD), then its fields in the order it writes them, little-endian: `u64`s, byte
//! strings (a nested codec's [`Codec::save_state`](gradwire_codec::Codec::save_state)) and
//! `f32` vectors, each of the last two as a `u64` length followed by the bytes or values.
//! The reader is total: a wrong tag, a short buffer or a length larger than what remains
//! gives a [`DecodeError`], and it never allocates more than the bytes it was given.

use gradwire_codec::{Codec, DecodeError};

/// Writes an all-reduce's state.
pub(crate) struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// Starts a state tagged `tag`.
    pub(crate) fn new(tag: &[u8; 4]) -> Self {
        Writer { buf: tag.to_vec() }
    }

    /// Appends a `u64`.
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends bytes with their length.
    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u64(v.len() as u64);
        self.buf.extend_from_slice(v);
        self
    }

    /// Appends an `f32` vector (length, then values).
    pub(crate) fn f32s(&mut self, v: &[f32]) -> &mut Self {
        self.u64(v.len() as u64);
        self.buf.reserve(4 * v.len());
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
        self
    }

    /// The state bytes.
    pub(crate) fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// Reads a state written by [`Writer`].
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

/// A field of a state holds an impossible value.
pub(crate) const fn invalid(reason: &'static str) -> DecodeError {
    DecodeError::InvalidField {
        field: "state",
        reason,
    }
}

impl<'a> Reader<'a> {
    /// Checks the tag of `state` (`what` names the all-reduce in the error).
    pub(crate) fn new(
        state: &'a [u8],
        tag: &[u8; 4],
        what: &'static str,
    ) -> Result<Self, DecodeError> {
        if state.len() < 4 {
            return Err(DecodeError::Truncated {
                need: 4,
                have: state.len(),
            });
        }
        if &state[..4] != tag {
            return Err(invalid(what));
        }
        Ok(Reader { rest: &state[4..] })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < n {
            return Err(DecodeError::Truncated {
                need: n,
                have: self.rest.len(),
            });
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Ok(a)
    }

    /// Reads a `u64`.
    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// Reads a length that must fit in what remains at `elem` bytes per element.
    fn len(&mut self, elem: usize) -> Result<usize, DecodeError> {
        let n = self.u64()?;
        if n > (self.rest.len() / elem) as u64 {
            return Err(DecodeError::Truncated {
                need: usize::try_from(n)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(elem),
                have: self.rest.len(),
            });
        }
        Ok(n as usize)
    }

    /// Reads bytes written by [`Writer::bytes`].
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.len(1)?;
        self.take(n)
    }

    /// Reads an `f32` vector.
    pub(crate) fn f32s(&mut self) -> Result<Vec<f32>, DecodeError> {
        let n = self.len(4)?;
        Ok(self
            .take(4 * n)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Checks that nothing is left.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                extra: self.rest.len(),
            })
        }
    }
}

/// Loads `states[i]` into `codecs[i]`, all or nothing: when one refuses its state, those
/// already loaded get back what they held before (their own saved state), and the error is
/// returned.
pub(crate) fn load_all(
    codecs: &mut [&mut Box<dyn Codec>],
    states: &[&[u8]],
) -> Result<(), DecodeError> {
    debug_assert_eq!(codecs.len(), states.len());
    let before: Vec<Vec<u8>> = codecs.iter().map(|c| c.save_state()).collect();
    for i in 0..codecs.len() {
        if let Err(e) = codecs[i].load_state(states[i]) {
            for (c, b) in codecs[..=i].iter_mut().zip(&before) {
                // A codec's own state, of its own configuration: loads back.
                let _ = c.load_state(b);
            }
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let s = Writer::new(b"GWQR")
            .u64(9)
            .bytes(b"abc")
            .f32s(&[1.5, -0.0])
            .finish();
        let mut r = Reader::new(&s, b"GWQR", "x").unwrap();
        assert_eq!(r.u64().unwrap(), 9);
        assert_eq!(r.bytes().unwrap(), b"abc");
        let v = r.f32s().unwrap();
        assert_eq!(v[0], 1.5);
        assert_eq!(v[1].to_bits(), (-0.0f32).to_bits());
        r.finish().unwrap();
        assert!(Reader::new(&s, b"GWSR", "x").is_err());
        for cut in 0..s.len() {
            let r = Reader::new(&s[..cut], b"GWQR", "x").and_then(|mut r| {
                r.u64()?;
                r.bytes()?;
                r.f32s()?;
                r.finish()
            });
            assert!(r.is_err(), "cut at {cut}");
        }
        // A huge announced length is refused without allocating.
        let mut bad = Writer::new(b"GWQR").u64(u64::MAX).finish();
        bad.extend_from_slice(&[0; 8]);
        assert!(Reader::new(&bad, b"GWQR", "x").unwrap().f32s().is_err());
        assert!(Reader::new(&bad, b"GWQR", "x").unwrap().bytes().is_err());
    }
}
