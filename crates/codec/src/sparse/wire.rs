//! The sparse payload of top-k and DGC: (index, value) pairs with delta-varint or plain
//! indices and f32 or f16 values, its writer and its validating reader.
//!
//! # Wire layout
//! ```text
//! 0..12   Header (codec id, element count n)
//! 12      index coding u8: 0 = plain u32 LE per index, 1 = delta LEB128 (see below)
//! 13      value coding u8: 0 = f32 LE, 1 = f16 LE (IEEE half)
//! 14..16  reserved u16 = 0
//! 16..24  nnz u64: number of (index, value) pairs, <= n
//! 24..    nnz values (4 or 2 bytes each)
//! then    the nnz indices, strictly increasing, each < n:
//!           plain: u32 LE each
//!           delta: LEB128 varints (1..5 bytes): first index, then (index - previous - 1)
//! ```
//! The writer picks whichever index coding is shorter. Decoders check every field and the
//! exact length before touching the accumulator, so a bad payload leaves it unchanged. The
//! same reader gives the payload back as its pairs ([`decode_sparse_pairs`]).

use half::f16;

use super::bytes::{check_len, invalid, read_count};
use crate::{CodecId, DecodeError, Header, SparseGrad, HEADER_LEN};

/// How the values of a sparse payload travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValueFormat {
    /// 32-bit IEEE floats.
    #[default]
    Fp32,
    /// 16-bit IEEE floats (the rounding error stays in the residual).
    Fp16,
}

impl ValueFormat {
    /// The spec-string spelling (`fp32`, `fp16`).
    pub fn name(self) -> &'static str {
        match self {
            ValueFormat::Fp32 => "fp32",
            ValueFormat::Fp16 => "fp16",
        }
    }

    pub(crate) fn from_name(s: &str) -> Self {
        if s == "fp16" {
            ValueFormat::Fp16
        } else {
            ValueFormat::Fp32
        }
    }

    /// Bytes per value on the wire.
    pub fn bytes(self) -> usize {
        match self {
            ValueFormat::Fp32 => 4,
            ValueFormat::Fp16 => 2,
        }
    }

    /// The value as the receiver will see it.
    #[inline]
    pub fn round(self, v: f32) -> f32 {
        match self {
            ValueFormat::Fp32 => v,
            ValueFormat::Fp16 => to_f16(v).to_f32(),
        }
    }
}

/// `v` as f16, saturating finite values at +-65504 instead of overflowing to infinity.
#[inline]
pub(crate) fn to_f16(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.is_infinite() && v.is_finite() {
        if v > 0.0 {
            f16::MAX
        } else {
            f16::MIN
        }
    } else {
        h
    }
}

/// Bytes of the sparse payload before the values.
pub(crate) const SPARSE_PREFIX: usize = HEADER_LEN + 12;

fn varint_len(v: u32) -> usize {
    match v {
        0..=0x7f => 1,
        0x80..=0x3fff => 2,
        0x4000..=0x1f_ffff => 3,
        0x20_0000..=0xfff_ffff => 4,
        _ => 5,
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn gaps(indices: &[u32]) -> impl Iterator<Item = u32> + '_ {
    let mut prev: Option<u32> = None;
    indices.iter().map(move |&i| {
        let g = match prev {
            None => i,
            Some(p) => i - p - 1,
        };
        prev = Some(i);
        g
    })
}

/// Bytes the index section of a sparse payload will take (the shorter coding).
#[cfg(test)]
pub(crate) fn index_bytes(indices: &[u32]) -> usize {
    let delta: usize = gaps(indices).map(varint_len).sum();
    delta.min(4 * indices.len())
}

/// Writes the payload of a selection as top-k and DGC do: [`write_sparse`] with the shorter
/// index coding.
pub(crate) fn write_selection(
    out: &mut Vec<u8>,
    codec: CodecId,
    n: usize,
    sel: &SparseGrad,
    vf: ValueFormat,
) {
    write_sparse(out, codec, n, &sel.indices, &sel.values, vf, true)
}

/// Writes a whole sparse payload (layout in the module doc). `indices` strictly increasing,
/// each `< n`; `values` already rounded to `vf`. The index coding is the shorter of the two
/// (plain only, if `!allow_delta`).
pub(crate) fn write_sparse(
    out: &mut Vec<u8>,
    codec: CodecId,
    n: usize,
    indices: &[u32],
    values: &[f32],
    vf: ValueFormat,
    allow_delta: bool,
) {
    debug_assert_eq!(indices.len(), values.len());
    let delta: usize = gaps(indices).map(varint_len).sum();
    let use_delta = allow_delta && delta < 4 * indices.len();
    Header::write(out, codec, n);
    out.reserve(12 + values.len() * vf.bytes() + delta.min(4 * indices.len()));
    out.push(use_delta as u8);
    out.push(match vf {
        ValueFormat::Fp32 => 0,
        ValueFormat::Fp16 => 1,
    });
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&(indices.len() as u64).to_le_bytes());
    match vf {
        ValueFormat::Fp32 => {
            for v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        ValueFormat::Fp16 => {
            for v in values {
                out.extend_from_slice(&to_f16(*v).to_le_bytes());
            }
        }
    }
    if use_delta {
        for g in gaps(indices) {
            put_varint(out, g);
        }
    } else {
        for i in indices {
            out.extend_from_slice(&i.to_le_bytes());
        }
    }
}

/// A validated view of a sparse payload.
struct SparseView<'a> {
    nnz: usize,
    vf: ValueFormat,
    values: &'a [u8],
    indices: &'a [u8],
    delta: bool,
}

impl SparseView<'_> {
    fn value(&self, j: usize) -> f32 {
        match self.vf {
            ValueFormat::Fp32 => {
                let b = &self.values[4 * j..4 * j + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }
            ValueFormat::Fp16 => {
                let b = &self.values[2 * j..2 * j + 2];
                f16::from_le_bytes([b[0], b[1]]).to_f32()
            }
        }
    }

    /// Visits every index in order (validated already, or validating: `f` may fail).
    fn for_each_index(&self, n: usize, mut f: impl FnMut(usize, usize)) -> Result<(), DecodeError> {
        if self.delta {
            let b = self.indices;
            let mut pos = 0;
            let mut next: u64 = 0;
            for j in 0..self.nnz {
                let mut v: u64 = 0;
                let mut shift = 0;
                loop {
                    let byte = *b.get(pos).ok_or(DecodeError::Truncated {
                        need: SPARSE_PREFIX + self.values.len() + pos + 1,
                        have: SPARSE_PREFIX + self.values.len() + b.len(),
                    })?;
                    pos += 1;
                    if shift == 28 && byte > 0x0f {
                        return Err(invalid("index", "varint longer than 32 bits"));
                    }
                    v |= u64::from(byte & 0x7f) << shift;
                    if byte & 0x80 == 0 {
                        break;
                    }
                    shift += 7;
                }
                let idx = next + v;
                if idx >= n as u64 {
                    return Err(DecodeError::IndexOutOfRange { index: idx, len: n });
                }
                f(j, idx as usize);
                next = idx + 1;
            }
            if pos != b.len() {
                return Err(DecodeError::TrailingBytes {
                    extra: b.len() - pos,
                });
            }
        } else {
            let mut next: u64 = 0;
            for (j, c) in self.indices.chunks_exact(4).enumerate() {
                let idx = u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                if idx >= n as u64 {
                    return Err(DecodeError::IndexOutOfRange { index: idx, len: n });
                }
                if idx < next {
                    return Err(invalid("index", "indices not strictly increasing"));
                }
                f(j, idx as usize);
                next = idx + 1;
            }
        }
        Ok(())
    }
}

fn parse_sparse(payload: &[u8], codec: CodecId, n: usize) -> Result<SparseView<'_>, DecodeError> {
    Header::check(payload, codec, n)?;
    if payload.len() < SPARSE_PREFIX {
        return Err(DecodeError::Truncated {
            need: SPARSE_PREFIX,
            have: payload.len(),
        });
    }
    let delta = match payload[HEADER_LEN] {
        0 => false,
        1 => true,
        _ => return Err(invalid("index_coding", "must be 0 (plain) or 1 (delta)")),
    };
    let vf = match payload[HEADER_LEN + 1] {
        0 => ValueFormat::Fp32,
        1 => ValueFormat::Fp16,
        _ => return Err(invalid("value_coding", "must be 0 (fp32) or 1 (fp16)")),
    };
    if payload[HEADER_LEN + 2] != 0 || payload[HEADER_LEN + 3] != 0 {
        return Err(invalid("reserved", "must be zero"));
    }
    let nnz = read_count(
        payload,
        HEADER_LEN + 4,
        n,
        "nnz",
        "more pairs than elements",
    )?;
    let vend = SPARSE_PREFIX + nnz * vf.bytes();
    if payload.len() < vend {
        return Err(DecodeError::Truncated {
            need: vend,
            have: payload.len(),
        });
    }
    if !delta {
        check_len(vend + 4 * nnz, payload.len())?;
    } else if payload.len() - vend > 5 * nnz {
        return Err(DecodeError::TrailingBytes {
            extra: payload.len() - vend - 5 * nnz,
        });
    }
    Ok(SparseView {
        nnz,
        vf,
        values: &payload[SPARSE_PREFIX..vend],
        indices: &payload[vend..],
        delta,
    })
}

/// Decodes a sparse payload of `codec` and adds `scale * value` at each index into `acc`.
/// Validates everything first: on error `acc` is unchanged.
pub(crate) fn decode_sparse_add(
    payload: &[u8],
    codec: CodecId,
    acc: &mut [f32],
) -> Result<(), DecodeError> {
    let n = acc.len();
    let view = parse_sparse(payload, codec, n)?;
    view.for_each_index(n, |_, _| {})?;
    view.for_each_index(n, |j, i| acc[i] += view.value(j))
}

/// Reads a sparse payload of `codec` for `n` elements into its pairs (`out`, emptied first):
/// the indices and the values as `decode_sparse_add` would add them (f16 widened as it
/// widens them), so the pairs of the selection the payload was written from, bit for bit
/// (the writer's values are already rounded to the payload's format). Validates everything
/// first: on error `out` is empty.
pub(crate) fn decode_sparse_pairs(
    payload: &[u8],
    codec: CodecId,
    n: usize,
    out: &mut SparseGrad,
) -> Result<(), DecodeError> {
    out.start_pairs(n)?;
    let view = parse_sparse(payload, codec, n)?;
    view.for_each_index(n, |_, _| {})?;
    out.indices.reserve_exact(view.nnz);
    out.values.reserve_exact(view.nnz);
    // Indices are below `n`, which fits u32 (`start_pairs`).
    view.for_each_index(n, |j, i| {
        out.indices.push(i as u32);
        out.values.push(view.value(j));
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_round_trip_both_codings() {
        let n = 100_000;
        for idx in [vec![0u32, 5, 99_999], (0..2000).map(|i| i * 3).collect()] {
            let vals: Vec<f32> = idx.iter().map(|&i| i as f32 * 0.5 - 3.0).collect();
            for vf in [ValueFormat::Fp32, ValueFormat::Fp16] {
                let mut out = Vec::new();
                write_sparse(&mut out, CodecId::TopK, n, &idx, &vals, vf, true);
                assert_eq!(
                    out.len(),
                    SPARSE_PREFIX + idx.len() * vf.bytes() + index_bytes(&idx)
                );
                let mut acc = vec![0.0; n];
                decode_sparse_add(&out, CodecId::TopK, &mut acc).unwrap();
                for (&i, &v) in idx.iter().zip(&vals) {
                    assert_eq!(acc[i as usize], vf.round(v));
                }
            }
        }
    }

    #[test]
    fn sparse_decoder_rejects_malformed() {
        let n = 100;
        let mut plain = Vec::new();
        write_sparse(
            &mut plain,
            CodecId::TopK,
            n,
            &[1, 70],
            &[1.0, 2.0],
            ValueFormat::Fp32,
            false,
        );
        assert_eq!(plain[HEADER_LEN], 0);
        let mut acc = vec![0.0; n];
        let d = |p: &[u8], acc: &mut [f32]| decode_sparse_add(p, CodecId::TopK, acc);
        for cut in 0..plain.len() {
            assert!(d(&plain[..cut], &mut acc).is_err(), "cut {cut}");
        }
        let mut p = plain.clone();
        p.push(0);
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::TrailingBytes { .. })
        ));
        let mut p = plain.clone();
        let at = p.len() - 4;
        p[at..].copy_from_slice(&100u32.to_le_bytes());
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::IndexOutOfRange { index: 100, .. })
        ));
        let mut p = plain.clone();
        p[at..].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::InvalidField { .. })
        ));
        let mut p = plain.clone();
        p[HEADER_LEN + 4..HEADER_LEN + 12].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::InvalidField { .. })
        ));
        let mut p = plain.clone();
        p[HEADER_LEN + 1] = 7;
        assert!(d(&p, &mut acc).is_err());
        assert!(acc.iter().all(|&v| v == 0.0), "errors leave acc unchanged");

        let mut delta = Vec::new();
        write_sparse(
            &mut delta,
            CodecId::TopK,
            n,
            &[1, 2, 3],
            &[1.0; 3],
            ValueFormat::Fp16,
            true,
        );
        assert_eq!(delta[HEADER_LEN], 1);
        for cut in 0..delta.len() {
            assert!(d(&delta[..cut], &mut acc).is_err(), "cut {cut}");
        }
        let mut p = delta.clone();
        let last = p.len() - 1;
        p[last] = 0x7f; // 2 + 1 + 127 > n
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::IndexOutOfRange { .. })
        ));
        p[last] = 0x80; // unterminated varint
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::Truncated { .. })
        ));
        assert!(acc.iter().all(|&v| v == 0.0));
    }
}
