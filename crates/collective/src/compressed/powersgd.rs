//! PowerSGD as published (Vogels, Karimireddy, Jaggi, NeurIPS 2019, Algorithms 1 and 2), as
//! PyTorch's `powerSGD_hook` runs it: two all-reduces per step.
//!
//! ```text
//! per rank i, per matrix tensor (viewed as [d0, d1*d2*..], PyTorch's view(shape[0], -1)):
//!   M_i = grad_i + e_i                       error feedback (ef=true, the default)
//!   P_i = M_i Q                              Q: the same on every rank
//!   P   = all-reduce-sum(P_i)                ── all-reduce 1 (with the dense tensors) ──
//!   P^  = orthogonalize(P)                   Gram-Schmidt on P's r columns
//!   Q_i = M_i^T P^
//!   Q   = all-reduce-mean(Q_i)               ── all-reduce 2 ──
//!   out = P^ Q^T  (times P with Reduce::Sum)
//!   e_i = M_i - P^ Q^T                       what this rank's gradient lost
//!   Q is kept for the next step (warm start, warm=true)
//! 1-D tensors (biases), and matrices that rank r does not shrink ((d0 + d1) r >= d0 d1, the
//! hook's `_should_compress` at compression rate 1), travel uncompressed in all-reduce 1.
//! ```
//! `P` is summed (as the hook does; its scale does not survive orthogonalization) and `Q`
//! averaged, so the output is the mean's rank-`r` approximation, `P` times it with
//! [`Reduce::Sum`]. Gram-Schmidt is the hook's: column `k` is divided by `||p_k|| + 1e-8` and
//! subtracted from the later columns.
//!
//! The first `Q` (and every `Q` with `warm=false`) comes from [`initial_q`]: uniform in
//! `[-1, 1)` from the seed, the tensor's index and (without warm start) the step, the same on
//! every rank. Deviation: the hook draws `torch.randn` (normal); any full-rank start works.
//! When the shapes are unknown (only `layout`), each tensor is viewed as the `n x m` matrix
//! with `m` the largest divisor of its length not above its square root (the local codec's
//! rule), and 1-D-ness cannot be told: the byte rule alone decides.
//!
//! Bytes per step and rank: the ring all-reduces of `sum (d0 + d1) r` floats plus the dense
//! tensors, instead of all the gradient's floats.

use std::ops::Range;

use gradwire_codec::{segments, BuildContext, PowerSgdConfig};
use gradwire_transport::Transport;

use super::Reduce;
use crate::{Algorithm, Error, ReduceOp, Result};

/// One tensor's role in the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerSgdTensor {
    /// Compressed as the `rows x cols` matrix; its `P` is `rows x r`, its `Q` `cols x r`.
    LowRank {
        /// The tensor's elements in the flat gradient.
        range: Range<usize>,
        /// `d0`.
        rows: usize,
        /// `d1 * d2 * ..`.
        cols: usize,
    },
    /// Sent uncompressed.
    Dense {
        /// The tensor's elements in the flat gradient.
        range: Range<usize>,
    },
}

/// The deterministic starting `Q` (`cols x r`, row-major) of tensor `tensor` at `step`
/// (`step` is 0 with warm start): uniform in `[-1, 1)`, the same on every rank.
pub fn initial_q(seed: u64, tensor: usize, step: u64, cols: usize, r: usize) -> Vec<f32> {
    let mut s = seed ^ (tensor as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ step.rotate_left(32);
    (0..cols * r)
        .map(|_| {
            // splitmix64
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// The hook's Gram-Schmidt on the `r` columns of the row-major `rows x r` matrix `p`.
pub fn orthogonalize(p: &mut [f32], rows: usize, r: usize) {
    for k in 0..r {
        let norm = (0..rows)
            .map(|i| p[i * r + k] * p[i * r + k])
            .sum::<f32>()
            .sqrt();
        let inv = 1.0 / (norm + 1e-8);
        for i in 0..rows {
            p[i * r + k] *= inv;
        }
        for l in k + 1..r {
            let c: f32 = (0..rows).map(|i| p[i * r + k] * p[i * r + l]).sum();
            for i in 0..rows {
                p[i * r + l] -= c * p[i * r + k];
            }
        }
    }
}

/// PowerSGD's compressed all-reduce for a gradient of one length on one world, with its
/// state: the warm-start `Q`s (identical on every rank) and this rank's error.
pub struct PowerSgdAllReduce {
    cfg: PowerSgdConfig,
    seed: u64,
    len: usize,
    tensors: Vec<PowerSgdTensor>,
    /// Per low-rank tensor (in order), its `Q` (`cols x r`, row-major).
    q: Vec<Vec<f32>>,
    error: Vec<f32>,
    m: Vec<f32>,
    buf1: Vec<f32>,
    buf2: Vec<f32>,
    step: u64,
    bytes: u64,
}

impl PowerSgdAllReduce {
    /// The exchange for a gradient of `len` elements whose tensors `ctx` describes.
    pub fn new(cfg: &PowerSgdConfig, ctx: &BuildContext, len: usize) -> Self {
        let r = cfg.rank.max(1);
        let shrinks = |rows: usize, cols: usize| {
            (rows + cols)
                .checked_mul(r)
                .is_some_and(|x| x < rows.saturating_mul(cols))
        };
        let mut tensors = Vec::new();
        match ctx.tensors_for(len) {
            Some(ts) => {
                let mut at = 0;
                for t in ts {
                    let range = at..at + t.numel();
                    at = range.end;
                    let (rows, cols) = (t.shape.first().copied().unwrap_or(1), t.column_len());
                    tensors.push(if t.is_matrix() && shrinks(rows, cols) {
                        PowerSgdTensor::LowRank { range, rows, cols }
                    } else {
                        PowerSgdTensor::Dense { range }
                    });
                }
            }
            None => {
                for range in segments(&ctx.layout, len) {
                    let n = range.len();
                    let mut m = (n as f64).sqrt() as usize;
                    while m > 1 && n % m != 0 {
                        m -= 1;
                    }
                    tensors.push(if m > 0 && shrinks(n / m, m) {
                        PowerSgdTensor::LowRank {
                            range,
                            rows: n / m,
                            cols: m,
                        }
                    } else {
                        PowerSgdTensor::Dense { range }
                    });
                }
            }
        }
        let q = tensors
            .iter()
            .enumerate()
            .filter_map(|(i, t)| match t {
                PowerSgdTensor::LowRank { cols, .. } => Some(initial_q(ctx.seed, i, 0, *cols, r)),
                PowerSgdTensor::Dense { .. } => None,
            })
            .collect();
        PowerSgdAllReduce {
            cfg: PowerSgdConfig {
                rank: r,
                ..cfg.clone()
            },
            seed: ctx.seed,
            len,
            tensors,
            q,
            error: Vec::new(),
            m: Vec::new(),
            buf1: Vec::new(),
            buf2: Vec::new(),
            step: 0,
            bytes: 0,
        }
    }

    /// How each tensor travels.
    pub fn tensors(&self) -> &[PowerSgdTensor] {
        &self.tensors
    }

    /// This rank's error-feedback memory (empty before the first step or with `ef=false`).
    pub fn error(&self) -> &[f32] {
        &self.error
    }

    /// Payload bytes this rank has sent so far (both all-reduces).
    pub fn bytes_sent(&self) -> u64 {
        self.bytes
    }

    /// Replaces `grad` by the rank-`r` approximation of the mean (or sum) over ranks.
    pub fn all_reduce<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        grad: &mut [f32],
        reduce: Reduce,
    ) -> Result<()> {
        if grad.len() != self.len {
            return Err(Error::BadOutputLength {
                expected: self.len,
                got: grad.len(),
            });
        }
        let (r, world) = (self.cfg.rank, t.world_size());
        let seg = crate::select::segment_bytes();
        let before = t.bytes_sent();
        // M = grad + e.
        self.m.clear();
        self.m.extend_from_slice(grad);
        if self.cfg.ef && self.error.len() == grad.len() {
            for (m, e) in self.m.iter_mut().zip(&self.error) {
                *m += e;
            }
        }
        if !self.cfg.warm {
            let mut k = 0;
            for (i, tn) in self.tensors.iter().enumerate() {
                if let PowerSgdTensor::LowRank { cols, .. } = tn {
                    self.q[k] = initial_q(self.seed, i, self.step + 1, *cols, r);
                    k += 1;
                }
            }
        }
        // All-reduce 1: every P_i = M_i Q, then the dense tensors.
        self.buf1.clear();
        let mut k = 0;
        for tn in &self.tensors {
            if let PowerSgdTensor::LowRank { range, rows, cols } = tn {
                let m = &self.m[range.clone()];
                let q = &self.q[k];
                for i in 0..*rows {
                    let row = &m[i * cols..(i + 1) * cols];
                    for c in 0..r {
                        self.buf1
                            .push((0..*cols).map(|j| row[j] * q[j * r + c]).sum::<f32>());
                    }
                }
                k += 1;
            }
        }
        for tn in &self.tensors {
            if let PowerSgdTensor::Dense { range } = tn {
                self.buf1.extend_from_slice(&self.m[range.clone()]);
            }
        }
        crate::all_reduce(t, &mut self.buf1, ReduceOp::Sum, Algorithm::Auto, seg)?;
        // Orthogonalize each P; all-reduce 2: every Q_i = M_i^T P^.
        self.buf2.clear();
        let mut at = 0;
        for tn in &self.tensors {
            if let PowerSgdTensor::LowRank { range, rows, cols } = tn {
                let p = &mut self.buf1[at..at + rows * r];
                orthogonalize(p, *rows, r);
                let m = &self.m[range.clone()];
                let q0 = self.buf2.len();
                self.buf2.resize(q0 + cols * r, 0.0);
                let q = &mut self.buf2[q0..];
                for i in 0..*rows {
                    let row = &m[i * cols..(i + 1) * cols];
                    for c in 0..r {
                        let pic = p[i * r + c];
                        for j in 0..*cols {
                            q[j * r + c] += row[j] * pic;
                        }
                    }
                }
                at += rows * r;
            }
        }
        crate::all_reduce(t, &mut self.buf2, ReduceOp::Sum, Algorithm::Auto, seg)?;
        let inv = 1.0 / world as f32;
        self.buf2.iter_mut().for_each(|v| *v *= inv);
        // out = P^ Q^T (the mean), e = M - out; dense tensors: the all-reduced values.
        let scale = if reduce == Reduce::Sum {
            world as f32
        } else {
            1.0
        };
        let (mut pat, mut qat, mut k) = (0, 0, 0);
        let mut dat = at;
        for tn in &self.tensors {
            match tn {
                PowerSgdTensor::LowRank { range, rows, cols } => {
                    let p = &self.buf1[pat..pat + rows * r];
                    let q = &self.buf2[qat..qat + cols * r];
                    let out = &mut grad[range.clone()];
                    for i in 0..*rows {
                        for j in 0..*cols {
                            out[i * cols + j] =
                                (0..r).map(|c| p[i * r + c] * q[j * r + c]).sum::<f32>();
                        }
                    }
                    self.q[k].copy_from_slice(q);
                    pat += rows * r;
                    qat += cols * r;
                    k += 1;
                }
                PowerSgdTensor::Dense { range } => {
                    grad[range.clone()].copy_from_slice(&self.buf1[dat..dat + range.len()]);
                    dat += range.len();
                    reduce.finish(&mut grad[range.clone()], world);
                }
            }
        }
        if self.cfg.ef {
            self.error.clear();
            self.error.resize(grad.len(), 0.0);
            for tn in &self.tensors {
                if let PowerSgdTensor::LowRank { range, .. } = tn {
                    for i in range.clone() {
                        self.error[i] = self.m[i] - grad[i];
                    }
                }
            }
        }
        if scale != 1.0 {
            for tn in &self.tensors {
                if let PowerSgdTensor::LowRank { range, .. } = tn {
                    grad[range.clone()].iter_mut().for_each(|v| *v *= scale);
                }
            }
        }
        self.step += 1;
        self.bytes += t.bytes_sent() - before;
        Ok(())
    }
}
