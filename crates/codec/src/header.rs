//! The header every payload starts with.
//!
//! Wire layout (little-endian, 12 bytes):
//! ```text
//! 0..2   magic   u16 = 0x5747 ("GW")
//! 2      version u8  = 2
//! 3      codec   u8  (CodecId)
//! 4..12  count   u64 number of f32 elements of the gradient
//! ```
//!
//! Version 2 (shapes reach the codecs): 1-bit SGD and adaptive quantization group by the
//! tensors' columns, QSGD's buckets stay inside tensors, TernGrad may send the output layer in
//! float; a version-1 payload is refused rather than misread.

use crate::DecodeError;

/// Magic number at the start of every payload ("GW" little-endian).
pub const MAGIC: u16 = 0x5747;
/// Wire-format version written by this build.
pub const VERSION: u8 = 2;
/// Length of the header in bytes.
pub const HEADER_LEN: usize = 12;

/// Identifies a codec on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CodecId {
    /// Uncompressed fp32.
    None = 0,
    /// IEEE half precision.
    Fp16 = 1,
    /// bfloat16.
    Bf16 = 2,
    /// 1-bit SGD (Seide 2014).
    OneBit = 3,
    /// Threshold quantization (Strom 2015).
    Threshold = 4,
    /// Adaptive quantization (Dryden 2016).
    Adaptive = 5,
    /// Top-k gradient dropping (Aji & Heafield 2017).
    TopK = 6,
    /// QSGD (Alistarh 2017).
    Qsgd = 7,
    /// TernGrad (Wen 2017).
    TernGrad = 8,
    /// Deep Gradient Compression (Lin 2018).
    Dgc = 9,
    /// Random-k sparsification.
    RandomK = 10,
    /// signSGD with error feedback (Karimireddy 2019).
    SignSgd = 11,
    /// PowerSGD (Vogels 2019).
    PowerSgd = 12,
}

impl CodecId {
    /// Whether the codec sends a chosen subset of the entries (Strom's threshold, Dryden's
    /// adaptive, top-k, random-k, DGC): what momentum factor masking applies to (DGC,
    /// section 3.2). Every entry it does not send decodes to zero.
    pub fn sparsifies(self) -> bool {
        matches!(
            self,
            CodecId::Threshold
                | CodecId::Adaptive
                | CodecId::TopK
                | CodecId::RandomK
                | CodecId::Dgc
        )
    }

    /// The spec-string name of this codec.
    pub fn name(self) -> &'static str {
        match self {
            CodecId::None => "none",
            CodecId::Fp16 => "fp16",
            CodecId::Bf16 => "bf16",
            CodecId::OneBit => "onebit",
            CodecId::Threshold => "threshold",
            CodecId::Adaptive => "adaptive",
            CodecId::TopK => "topk",
            CodecId::Qsgd => "qsgd",
            CodecId::TernGrad => "terngrad",
            CodecId::Dgc => "dgc",
            CodecId::RandomK => "randomk",
            CodecId::SignSgd => "signsgd",
            CodecId::PowerSgd => "powersgd",
        }
    }
}

impl std::fmt::Display for CodecId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A parsed payload header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The codec that wrote the payload.
    pub codec: CodecId,
    /// Number of gradient elements.
    pub count: u64,
}

impl Header {
    /// Clears `out` and writes the header for `count` elements of `codec`.
    pub fn write(out: &mut Vec<u8>, codec: CodecId, count: usize) {
        out.clear();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.push(VERSION);
        out.push(codec as u8);
        out.extend_from_slice(&(count as u64).to_le_bytes());
    }

    /// Clears `out`, writes the header for `count` elements of `codec` and makes room for a
    /// body of `body_len` bytes after it, zeroed; returns the body.
    pub fn write_sized(
        out: &mut Vec<u8>,
        codec: CodecId,
        count: usize,
        body_len: usize,
    ) -> &mut [u8] {
        Header::write(out, codec, count);
        out.resize(HEADER_LEN + body_len, 0);
        &mut out[HEADER_LEN..]
    }

    /// Checks the header of `payload` for `expected` codec and an accumulator of
    /// `acc_len` elements; returns the bytes after the header.
    pub fn check(payload: &[u8], expected: CodecId, acc_len: usize) -> Result<&[u8], DecodeError> {
        if payload.len() < HEADER_LEN {
            return Err(DecodeError::Truncated {
                need: HEADER_LEN,
                have: payload.len(),
            });
        }
        let magic = u16::from_le_bytes([payload[0], payload[1]]);
        if magic != MAGIC {
            return Err(DecodeError::BadMagic { found: magic });
        }
        if payload[2] != VERSION {
            return Err(DecodeError::BadVersion { found: payload[2] });
        }
        if payload[3] != expected as u8 {
            return Err(DecodeError::WrongCodec {
                expected,
                found: payload[3],
            });
        }
        let mut count = [0u8; 8];
        count.copy_from_slice(&payload[4..12]);
        let count = u64::from_le_bytes(count);
        if count != acc_len as u64 {
            return Err(DecodeError::LengthMismatch {
                expected: acc_len,
                found: count,
            });
        }
        Ok(&payload[HEADER_LEN..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_rejects() {
        let mut out = Vec::new();
        Header::write(&mut out, CodecId::Qsgd, 7);
        assert_eq!(out.len(), HEADER_LEN);
        assert_eq!(Header::check(&out, CodecId::Qsgd, 7).unwrap().len(), 0);
        assert!(matches!(
            Header::check(&out, CodecId::TopK, 7),
            Err(DecodeError::WrongCodec { .. })
        ));
        assert!(matches!(
            Header::check(&out, CodecId::Qsgd, 8),
            Err(DecodeError::LengthMismatch {
                expected: 8,
                found: 7
            })
        ));
        assert!(matches!(
            Header::check(&out[..5], CodecId::Qsgd, 7),
            Err(DecodeError::Truncated { .. })
        ));
        out[0] ^= 1;
        assert!(matches!(
            Header::check(&out, CodecId::Qsgd, 7),
            Err(DecodeError::BadMagic { .. })
        ));
    }
}
