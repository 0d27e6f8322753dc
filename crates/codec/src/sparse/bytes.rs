//! Little-endian field readers and the exact-length check shared by the sparse codecs'
//! decoders: every read is bounds-checked and a short buffer gives `Truncated`.

use crate::DecodeError;

/// An `InvalidField` error.
pub(crate) fn invalid(field: &'static str, reason: &'static str) -> DecodeError {
    DecodeError::InvalidField { field, reason }
}

/// The `N` bytes at `at`, or `Truncated`.
fn field<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], DecodeError> {
    b.get(at..at + N)
        .map(|s| s.try_into().expect("N bytes"))
        .ok_or(DecodeError::Truncated {
            need: at + N,
            have: b.len(),
        })
}

/// Reads a little-endian u64 at `at`, or `Truncated`.
pub(crate) fn read_u64(b: &[u8], at: usize) -> Result<u64, DecodeError> {
    field(b, at).map(u64::from_le_bytes)
}

/// Reads a little-endian u32 at `at`, or `Truncated`.
pub(crate) fn read_u32(b: &[u8], at: usize) -> Result<u32, DecodeError> {
    field(b, at).map(u32::from_le_bytes)
}

/// Reads a little-endian f32 at `at`, or `Truncated`.
pub(crate) fn read_f32(b: &[u8], at: usize) -> Result<f32, DecodeError> {
    read_u32(b, at).map(f32::from_bits)
}

/// Checks that a payload of `total` bytes is exactly `need` long.
pub(crate) fn check_len(need: usize, total: usize) -> Result<(), DecodeError> {
    if total < need {
        Err(DecodeError::Truncated { need, have: total })
    } else if total > need {
        Err(DecodeError::TrailingBytes {
            extra: total - need,
        })
    } else {
        Ok(())
    }
}
