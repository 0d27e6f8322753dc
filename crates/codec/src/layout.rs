//! How a flat gradient splits into tensors (from [`crate::BuildContext::layout`]), and small
//! byte helpers shared by the codecs.

use std::ops::Range;

use crate::simd::multiversion;
use crate::DecodeError;

/// The tensors of a flat gradient of `len` elements: the ranges of `layout` when its counts
/// sum to `len`, else one tensor covering everything (so a codec stays usable on fused or
/// partial buffers). Encoder and decoder derive the same ranges from the same `len`.
pub fn segments(layout: &[usize], len: usize) -> impl Iterator<Item = Range<usize>> + '_ {
    let fits =
        !layout.is_empty() && layout.iter().try_fold(0usize, |a, &n| a.checked_add(n)) == Some(len);
    let one: &[usize] = if fits { layout } else { &[] };
    let single = (!fits).then_some(0..len);
    one.iter()
        .scan(0usize, |start, &n| {
            let r = *start..*start + n;
            *start += n;
            Some(r)
        })
        .chain(single)
}

/// Reads a little-endian f32 at `at` (the caller has checked the length).
#[inline(always)]
pub(crate) fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

multiversion! {
    /// Adds little-endian f32s from `body` into `acc` (as many as both hold).
    pub(crate) fn add_f32_le(body: &[u8], acc: &mut [f32]) {
        for (a, c) in acc.iter_mut().zip(body.chunks_exact(4)) {
            *a += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
}

/// Checks that `body` (the payload after the header) is exactly `need` bytes.
pub(crate) fn expect_len(body: &[u8], need: usize) -> Result<(), DecodeError> {
    use std::cmp::Ordering::*;
    match body.len().cmp(&need) {
        Equal => Ok(()),
        Less => Err(DecodeError::Truncated {
            need: need + crate::HEADER_LEN,
            have: body.len() + crate::HEADER_LEN,
        }),
        Greater => Err(DecodeError::TrailingBytes {
            extra: body.len() - need,
        }),
    }
}

/// Checks that a scale read from the wire is finite.
pub(crate) fn finite(v: f32, field: &'static str) -> Result<f32, DecodeError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(DecodeError::InvalidField {
            field,
            reason: "not finite",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_follow_layout_or_cover_all() {
        let s: Vec<_> = segments(&[2, 0, 3], 5).collect();
        assert_eq!(s, vec![0..2, 2..2, 2..5]);
        let s: Vec<_> = segments(&[2, 3], 7).collect();
        assert_eq!(s, vec![0..7]);
        let s: Vec<_> = segments(&[], 4).collect();
        assert_eq!(s, vec![0..4]);
        let s: Vec<_> = segments(&[usize::MAX, 2], 1).collect();
        assert_eq!(s, vec![0..1]);
    }
}
