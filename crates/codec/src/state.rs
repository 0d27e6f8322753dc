//! Codec state (residuals, RNG position, warm-start matrices) to and from bytes.
//!
//! Layout: a 4-byte tag (`b"GWS"` + the codec id), then fields in the order the codec writes
//! them, little-endian: `u64`s, and `f32` vectors and byte strings as a `u64` length followed
//! by the values. The reader is total: a wrong tag, a short buffer or a length larger than
//! what remains gives a [`DecodeError`], and it never allocates more than the bytes it was
//! given. Other state in the same layout (gradwire-collective's compressed all-reduces) takes
//! its own tag: [`StateWriter::tagged`], [`StateReader::tagged`].

use crate::{CodecId, DecodeError};

/// Writes codec state.
#[derive(Debug, Default)]
pub struct StateWriter {
    buf: Vec<u8>,
}

impl StateWriter {
    /// Starts the state of `codec`.
    pub fn new(codec: CodecId) -> Self {
        Self::tagged(&codec_tag(codec))
    }

    /// Starts a state of something other than a codec, tagged `tag`.
    pub fn tagged(tag: &[u8; 4]) -> Self {
        StateWriter { buf: tag.to_vec() }
    }

    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends an `f32` vector (length, then values).
    pub fn f32s(&mut self, v: &[f32]) -> &mut Self {
        self.u64(v.len() as u64);
        self.buf.reserve(v.len() * 4);
        for x in v {
            self.buf.extend_from_slice(&x.to_le_bytes());
        }
        self
    }

    /// Appends raw bytes with their length (a nested codec's state).
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u64(v.len() as u64);
        self.buf.extend_from_slice(v);
        self
    }

    /// The state bytes.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// Reads codec state written by [`StateWriter`].
#[derive(Debug)]
pub struct StateReader<'a> {
    rest: &'a [u8],
}

/// The tag of `codec`'s state.
fn codec_tag(codec: CodecId) -> [u8; 4] {
    [b'G', b'W', b'S', codec as u8]
}

/// The 4-byte tag of `state` and what follows it.
fn split_tag(state: &[u8]) -> Result<(&[u8], &[u8]), DecodeError> {
    if state.len() < 4 {
        return Err(DecodeError::Truncated {
            need: 4,
            have: state.len(),
        });
    }
    Ok(state.split_at(4))
}

impl<'a> StateReader<'a> {
    /// Checks the tag of `state` for `codec`.
    pub fn new(state: &'a [u8], codec: CodecId) -> Result<Self, DecodeError> {
        let (tag, rest) = split_tag(state)?;
        if tag[..3] != codec_tag(codec)[..3] {
            return Err(DecodeError::invalid_state("not a gradwire codec state"));
        }
        if tag[3] != codec as u8 {
            return Err(DecodeError::WrongCodec {
                expected: codec,
                found: tag[3],
            });
        }
        Ok(StateReader { rest })
    }

    /// Checks that `state` is tagged `tag` (a state written by [`StateWriter::tagged`]); `what`
    /// is the error's reason when it is not.
    pub fn tagged(state: &'a [u8], tag: &[u8; 4], what: &'static str) -> Result<Self, DecodeError> {
        let (found, rest) = split_tag(state)?;
        if found != tag {
            return Err(DecodeError::invalid_state(what));
        }
        Ok(StateReader { rest })
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
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// Reads a length that must fit in what remains, at `elem` bytes per element.
    fn len(&mut self, elem: usize) -> Result<usize, DecodeError> {
        let n = self.u64()?;
        let have = self.rest.len() / elem;
        if n > have as u64 {
            return Err(DecodeError::Truncated {
                need: usize::try_from(n)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(elem),
                have: self.rest.len(),
            });
        }
        Ok(n as usize)
    }

    /// Reads an `f32` vector into `out` (cleared first).
    pub fn f32s_into(&mut self, out: &mut Vec<f32>) -> Result<(), DecodeError> {
        let n = self.len(4)?;
        let b = self.take(n * 4)?;
        out.clear();
        out.extend(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
        Ok(())
    }

    /// Reads an `f32` vector.
    pub fn f32s(&mut self) -> Result<Vec<f32>, DecodeError> {
        let mut v = Vec::new();
        self.f32s_into(&mut v)?;
        Ok(v)
    }

    /// Reads raw bytes written by [`StateWriter::bytes`].
    pub fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = self.len(1)?;
        self.take(n)
    }

    /// Checks that nothing is left.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                extra: self.rest.len(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let s = StateWriter::new(CodecId::Qsgd)
            .u64(7)
            .f32s(&[1.0, -2.5])
            .bytes(b"ab")
            .finish();
        let mut r = StateReader::new(&s, CodecId::Qsgd).unwrap();
        assert_eq!(r.u64().unwrap(), 7);
        assert_eq!(r.f32s().unwrap(), vec![1.0, -2.5]);
        assert_eq!(r.bytes().unwrap(), b"ab");
        r.finish().unwrap();
        assert!(StateReader::new(&s, CodecId::TopK).is_err());
        for cut in 0..s.len() {
            let r = StateReader::new(&s[..cut], CodecId::Qsgd).and_then(|mut r| {
                r.u64()?;
                r.f32s()?;
                r.bytes()?;
                r.finish()
            });
            assert!(r.is_err());
        }
        // A huge announced length is refused without allocating.
        let mut bad = StateWriter::new(CodecId::Qsgd).u64(u64::MAX).finish();
        bad.extend_from_slice(&[0; 8]);
        assert!(StateReader::new(&bad, CodecId::Qsgd)
            .unwrap()
            .f32s()
            .is_err());
        assert!(StateReader::new(&bad, CodecId::Qsgd)
            .unwrap()
            .bytes()
            .is_err());
    }

    #[test]
    fn tagged_states() {
        let s = StateWriter::tagged(b"GWQR").u64(9).finish();
        let mut r = StateReader::tagged(&s, b"GWQR", "x").unwrap();
        assert_eq!(r.u64().unwrap(), 9);
        r.finish().unwrap();
        assert!(matches!(
            StateReader::tagged(&s, b"GWSR", "not a stripe state"),
            Err(DecodeError::InvalidField {
                reason: "not a stripe state",
                ..
            })
        ));
        assert!(StateReader::tagged(&s[..3], b"GWQR", "x").is_err());
        assert!(StateReader::new(&s, CodecId::Qsgd).is_err());
    }
}
