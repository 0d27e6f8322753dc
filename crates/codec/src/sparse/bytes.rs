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

/// Reads a little-endian u64 count at `at` that may not exceed `n` (the element count):
/// `InvalidField { field, reason }` where it does, `Truncated` where the buffer is short.
pub(crate) fn read_count(
    b: &[u8],
    at: usize,
    n: usize,
    field: &'static str,
    reason: &'static str,
) -> Result<usize, DecodeError> {
    match read_u64(b, at)? {
        c if c > n as u64 => Err(invalid(field, reason)),
        c => Ok(c as usize),
    }
}

/// Reads a little-endian f32 at `at` that must be finite and positive (a scale or a
/// threshold): `InvalidField { field, .. }` where it is not, `Truncated` where the buffer is
/// short.
pub(crate) fn read_positive_f32(
    b: &[u8],
    at: usize,
    field: &'static str,
) -> Result<f32, DecodeError> {
    match read_f32(b, at)? {
        v if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(invalid(field, "not a finite positive number")),
    }
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
