//! How a flat gradient splits into tensors (from [`crate::BuildContext::layout`]), the
//! tensors' shapes and roles ([`TensorInfo`]), how a tensor splits into the columns the
//! column-wise quantizers of Seide 2014 and Dryden 2016 use ([`Columns`]), and small byte
//! helpers shared by the codecs.
//!
//! Columns. Both papers quantize "each column of each gradient matrix": CNTK and LBANN store
//! a fully connected layer's weight as an `[out, in]` matrix in column-major order, so one
//! column is one input unit's `out` outgoing weights, contiguous in memory. burn stores a
//! Linear weight as `[in, out]` row-major: the same `out` weights are one row of burn's
//! tensor, contiguous too. So a column here is a contiguous run of `shape[1..].product()`
//! elements, one per index of the leading axis: one input unit of a burn Linear weight
//! (`out` elements), one output channel's filter of a conv weight `[c_out, c_in, kh, kw]`
//! (`c_in * kh * kw` elements, PyTorch's `[c_out, c_in*kh*kw]` matrix view), and the whole
//! tensor for 1-D tensors (a bias is one column vector, as in CNTK).

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

/// What a tensor is, for codecs whose paper treats kinds of tensors differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TensorRole {
    /// The weight of a fully connected layer (burn: `[in, out]`).
    LinearWeight,
    /// A convolution kernel (burn: `[c_out, c_in, kh, kw]`).
    ConvWeight,
    /// A bias (1-D).
    Bias,
    /// A tensor (weight or bias) of the output (classification) layer; TernGrad keeps it in
    /// float by default. Its shape still gives its columns.
    Output,
    /// Anything else (norm scales, embeddings, recurrent weights, unknown).
    #[default]
    Other,
}

/// One tensor of the flat gradient: its shape (burn's, row-major) and role.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct TensorInfo {
    /// Dimensions, outermost first (empty: a scalar).
    pub shape: Vec<usize>,
    /// What the tensor is.
    pub role: TensorRole,
}

impl TensorInfo {
    /// A tensor of `shape` playing `role`.
    pub fn new(shape: impl Into<Vec<usize>>, role: TensorRole) -> Self {
        TensorInfo {
            shape: shape.into(),
            role,
        }
    }

    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has more than one dimension (DGC compresses only these).
    pub fn is_matrix(&self) -> bool {
        self.shape.len() > 1
    }

    /// Elements per column (see the module doc): `shape[1..].product()` for tensors of two
    /// or more dimensions, the whole tensor otherwise; at least 1.
    pub fn column_len(&self) -> usize {
        if self.shape.len() > 1 {
            self.shape[1..].iter().product::<usize>().max(1)
        } else {
            self.numel().max(1)
        }
    }

    /// The piece of this tensor made of `rows` leading-axis indices (`rows * column_len()`
    /// elements): same role, shape `[rows, shape[1..]]`, or `[rows]` for a 1-D tensor.
    pub fn rows(&self, rows: usize) -> TensorInfo {
        let mut shape = self.shape.clone();
        if shape.is_empty() {
            shape.push(rows);
        } else {
            shape[0] = rows;
        }
        TensorInfo {
            shape,
            role: self.role,
        }
    }
}

/// The tensors of a flat gradient of `len` elements, when `tensors` describes it exactly.
pub fn tensors_for(tensors: &[TensorInfo], len: usize) -> Option<&[TensorInfo]> {
    (!tensors.is_empty()
        && tensors
            .iter()
            .try_fold(0usize, |a, t| a.checked_add(t.numel()))
            == Some(len))
    .then_some(tensors)
}

/// Each of `tensors` with its range in the flat gradient they make up, in order.
pub fn tensor_ranges(
    tensors: &[TensorInfo],
) -> impl Iterator<Item = (Range<usize>, &TensorInfo)> + '_ {
    tensors.iter().scan(0usize, |at, t| {
        let r = *at..*at + t.numel();
        *at = r.end;
        Some((r, t))
    })
}

/// How a column-wise quantizer (1-bit SGD, adaptive) groups elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Columns {
    /// The paper's columns, from the tensors' shapes (see the module doc); when the shapes
    /// are unknown, runs of the given number of elements inside each tensor of the layout.
    Shape(usize),
    /// One column per tensor of the layout.
    Tensor,
    /// Runs of this many consecutive elements inside each tensor of the layout.
    Run(usize),
}

impl Columns {
    /// Parses `shape`, `tensor` or a positive count (`0` is read as `tensor`).
    pub fn parse(v: &str, unknown_run: usize) -> Option<Columns> {
        match v.to_ascii_lowercase().as_str() {
            "shape" => Some(Columns::Shape(unknown_run)),
            "tensor" | "0" => Some(Columns::Tensor),
            n => n
                .parse::<usize>()
                .ok()
                .filter(|&n| (1..=1 << 30).contains(&n))
                .map(Columns::Run),
        }
    }

    /// The column ranges of a flat gradient of `len` elements.
    pub fn ranges(self, tensors: &[TensorInfo], layout: &[usize], len: usize) -> Vec<Range<usize>> {
        let shaped = match self {
            Columns::Shape(_) => tensors_for(tensors, len),
            _ => None,
        };
        let segs: Vec<(Range<usize>, usize)> = match shaped {
            Some(ts) => tensor_ranges(ts)
                .map(|(r, t)| (r, t.column_len()))
                .collect(),
            None => segments(layout, len)
                .map(|r| {
                    let step = match self {
                        Columns::Shape(n) | Columns::Run(n) => n,
                        Columns::Tensor => r.len(),
                    };
                    (r, step.max(1))
                })
                .collect(),
        };
        segs.into_iter()
            .flat_map(|(r, step)| {
                let (s, e) = (r.start, r.end);
                (s..e).step_by(step).map(move |a| a..(a + step).min(e))
            })
            .collect()
    }

    /// The elements per column of `tensor` (`None`: shape unknown) in this mode: the
    /// multiple at which the tensor can be cut into pieces that, encoded as tensors of
    /// their own, form the same columns (`usize::MAX`: never cut).
    pub fn grain(self, tensor: Option<&TensorInfo>) -> usize {
        match (self, tensor) {
            (Columns::Shape(_), Some(t)) => t.column_len(),
            (Columns::Shape(n), None) | (Columns::Run(n), _) => n.max(1),
            (Columns::Tensor, _) => usize::MAX,
        }
    }
}

impl std::fmt::Display for Columns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Columns::Shape(_) => f.write_str("shape"),
            Columns::Tensor => f.write_str("tensor"),
            Columns::Run(n) => write!(f, "{n}"),
        }
    }
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
