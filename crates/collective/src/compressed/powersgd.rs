//! PowerSGD as published (Vogels, Karimireddy, Jaggi, NeurIPS 2019, Algorithms 1 and 2), as
//! PyTorch's `powerSGD_hook` runs it: two all-reduces per step.
//!
//! ```text
//! per rank i, per matrix tensor (viewed as PyTorch's view(shape[0], -1) of its tensor:
//! a conv kernel [c_out, c_in*kh*kw]; a Linear weight [out, in], i.e. burn's [in, out]
//! transposed, the roles LinearWeight and 2-D Output):
//!   M_i = grad_i + e_i                       error feedback (ef=true, the default)
//!   P_i = M_i Q                              Q: the same on every rank
//!   P   = all-reduce-sum(P_i)                ── all-reduce 1 (with the dense tensors) ──
//!   P^  = orthogonalize(P)                   Gram-Schmidt on P's r columns
//!   Q_i = M_i^T P^
//!   Q   = all-reduce-mean(Q_i)               ── all-reduce 2 ──
//!   out = P^ Q^T  (times P with Reduce::Sum)
//!   e_i = M_i - P^ Q^T                       what this rank's gradient lost
//!   Q is kept for the next step (warm start, warm=true)
//! 1-D tensors (biases), and matrices that rank r does not shrink enough
//! ((d0 + d1) r min_rate >= d0 d1, the hook's `_should_compress`; min_rate 1 by default),
//! travel uncompressed in all-reduce 1.
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
//! Bytes per step and rank: `2 (P-1)/P` times `4 (sum (d0 + d1) r + dense)` bytes, the
//! volume of a ring all-reduce of the factors and the dense tensors ([`factor_algorithm`]:
//! Rabenseifner on power-of-two worlds, the ring otherwise; never recursive doubling, which
//! sends `log2 P` times the buffer), instead of all the gradient's floats. An empty buffer
//! (no matrix, or no dense tensor) is not exchanged.
//!
//! Options beyond the paper, both PyTorch's (`PowerSGDState`), both off by default:
//! `start=N` runs a plain all-reduce (fp32, no error kept, `Q` untouched) for the first `N`
//! steps (`start_powerSGD_iter`, 1000 in PyTorch, which refuses fewer than 2 with error
//! feedback or warm start); `min_rate=X` compresses a matrix only when
//! `(d0 + d1) r X < d0 d1` (`min_compression_rate`, 2 in PyTorch; default 1 here).
//!
//! Compared with PyTorch's `powerSGD_hook` (2.x), the same algorithm up to rounding: the hook
//! also orthogonalizes `Q` before `P = M Q` (this changes neither span(`P`) nor its
//! Gram-Schmidt basis: `Q R^-1` for an upper-triangular `R`) and uses `epsilon = 0` by
//! default (1e-8 here, as the paper's code); it keeps an error for the 1-D tensors too (this
//! rank's value minus the mean, whose mean over ranks is zero: the averaged result is
//! unchanged); it all-reduces one bucket (the dense tensors, all `P`s, all `Q`s: three
//! collectives) where the engine calls this once per tensor.

use std::ops::Range;

use gradwire_codec::{
    segments, tensor_ranges, BuildContext, DecodeError, PowerSgdConfig, StateReader, StateWriter,
    TensorRole,
};
use gradwire_transport::Transport;

use super::Reduce;
use crate::{Algorithm, ReduceOp, Result};

/// One tensor's role in the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerSgdTensor {
    /// Compressed as the `rows x cols` matrix; its `P` is `rows x r`, its `Q` `cols x r`.
    LowRank {
        /// The tensor's elements in the flat gradient.
        range: Range<usize>,
        /// `d0` (a Linear weight's `out`).
        rows: usize,
        /// `d1 * d2 * ..` (a Linear weight's `in`).
        cols: usize,
        /// Stored transposed, `cols x rows` row-major: burn's Linear weight `[in, out]`,
        /// viewed as PyTorch's `[out, in]`.
        transposed: bool,
    },
    /// Sent uncompressed.
    Dense {
        /// The tensor's elements in the flat gradient.
        range: Range<usize>,
    },
}

impl PowerSgdTensor {
    /// `(range, rows, cols, transposed)` of a low-rank tensor; `None` for a dense one.
    fn low_rank(&self) -> Option<(&Range<usize>, usize, usize, bool)> {
        match self {
            PowerSgdTensor::LowRank {
                range,
                rows,
                cols,
                transposed,
            } => Some((range, *rows, *cols, *transposed)),
            PowerSgdTensor::Dense { .. } => None,
        }
    }
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

/// The algorithm of both factor all-reduces on `world` ranks: the bandwidth-optimal volume
/// `2 (P-1)/P` of the floats whatever their size (Rabenseifner on power-of-two worlds, in
/// `2 log2 P` steps; the ring otherwise), as the paper's NCCL / gloo ring all-reduce sends.
/// Recursive doubling, which size-based selection would pick for these small buffers, sends
/// `log2 P` times the buffer.
pub fn factor_algorithm(world: usize) -> Algorithm {
    if world.is_power_of_two() {
        Algorithm::Rabenseifner
    } else {
        Algorithm::Ring
    }
}

/// Every low-rank tensor's `M`, in order, as a row-major `rows x cols` matrix
/// `(rows, cols, M)`: in place in `m` (the error-fed gradient), or, for one stored
/// transposed, the next one in `view`.
fn row_major<'a>(
    tensors: &'a [PowerSgdTensor],
    m: &'a [f32],
    view: &'a [f32],
) -> impl Iterator<Item = (usize, usize, &'a [f32])> + 'a {
    let mut vat = 0;
    tensors.iter().filter_map(PowerSgdTensor::low_rank).map(
        move |(range, rows, cols, transposed)| {
            if transposed {
                vat += rows * cols;
                (rows, cols, &view[vat - rows * cols..vat])
            } else {
                (rows, cols, &m[range.clone()])
            }
        },
    )
}

/// The tag of a [`PowerSgdAllReduce`]'s saved state.
const TAG: &[u8; 4] = b"GWPS";

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
    /// The transposed low-rank tensors' `M`s as row-major `rows x cols` matrices, one after
    /// another (the others are read in place from `m`).
    view: Vec<f32>,
    buf1: Vec<f32>,
    buf2: Vec<f32>,
    step: u64,
    bytes: u64,
}

impl PowerSgdAllReduce {
    /// The exchange for a gradient of `len` elements whose tensors `ctx` describes.
    pub fn new(cfg: &PowerSgdConfig, ctx: &BuildContext, len: usize) -> Self {
        let r = cfg.rank.max(1);
        let mut tensors = Vec::new();
        match ctx.tensors_for(len) {
            Some(ts) => {
                for (range, t) in tensor_ranges(ts) {
                    let (mut rows, mut cols) =
                        (t.shape.first().copied().unwrap_or(1), t.column_len());
                    // burn's Linear weights (and the output layer's) are `[in, out]`.
                    let transposed = t.shape.len() == 2
                        && matches!(t.role, TensorRole::LinearWeight | TensorRole::Output);
                    if transposed {
                        (rows, cols) = (cols, rows);
                    }
                    tensors.push(if t.is_matrix() && cfg.compresses(rows, cols) {
                        PowerSgdTensor::LowRank {
                            range,
                            rows,
                            cols,
                            transposed,
                        }
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
                    tensors.push(if m > 0 && cfg.compresses(n / m, m) {
                        PowerSgdTensor::LowRank {
                            range,
                            rows: n / m,
                            cols: m,
                            transposed: false,
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
            view: Vec::new(),
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

    /// Everything that changes across steps: the step count, the warm-start `Q` of every
    /// low-rank tensor (the same on every rank) and this rank's error. Layout (see
    /// `state.rs`): tag `GWPS`, the step as a `u64`, the number of `Q`s as a `u64`, each `Q`
    /// as an `f32` vector (a `u64` length, then the values), then the error as an `f32`
    /// vector (empty before the first compressed step and with `ef=false`). Buffers and byte
    /// counters are not state.
    pub fn save_state(&self) -> Vec<u8> {
        let mut w = StateWriter::tagged(TAG);
        w.u64(self.step).u64(self.q.len() as u64);
        for q in &self.q {
            w.f32s(q);
        }
        w.f32s(&self.error).finish()
    }

    /// Restores what [`PowerSgdAllReduce::save_state`] saved for the same tensors and rank
    /// `r`. Bad input gives a [`DecodeError`] (a state of another all-reduce, other tensors
    /// or another rank `r`, an error of another length, truncated) and leaves this
    /// all-reduce as it was.
    pub fn load_state(&mut self, state: &[u8]) -> std::result::Result<(), DecodeError> {
        let mut r = StateReader::tagged(state, TAG, "not a PowerSGD all-reduce state")?;
        let step = r.u64()?;
        if r.u64()? != self.q.len() as u64 {
            return Err(DecodeError::invalid_state(
                "PowerSGD state of another number of low-rank tensors",
            ));
        }
        let mut qs = Vec::with_capacity(self.q.len());
        for q in &self.q {
            let saved = r.f32s()?;
            if saved.len() != q.len() {
                return Err(DecodeError::invalid_state(
                    "PowerSGD Q of another shape or rank",
                ));
            }
            qs.push(saved);
        }
        let error = r.f32s()?;
        r.finish()?;
        if !error.is_empty() && error.len() != self.len {
            return Err(DecodeError::LengthMismatch {
                expected: self.len,
                found: error.len() as u64,
            });
        }
        self.step = step;
        self.q = qs;
        self.error = error;
        Ok(())
    }

    /// Replaces `grad` by the rank-`r` approximation of the mean (or sum) over ranks.
    ///
    /// Longer than 120 lines on purpose: it follows Algorithm 1 of the paper step by step
    /// (M = G + e; P = MQ, all-reduced; P orthogonalized; Q = MᵀP, all-reduced; the
    /// approximation PQᵀ and the new error), each step marked in the body, all sharing the
    /// factor buffers.
    pub fn all_reduce<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        grad: &mut [f32],
        reduce: Reduce,
    ) -> Result<()> {
        super::check_len(self.len, grad.len())?;
        let (r, world) = (self.cfg.rank, t.world_size());
        let seg = crate::select::segment_bytes();
        let before = t.bytes_sent();
        if self.step < self.cfg.start as u64 {
            // Warm-up (`start=N`): a plain all-reduce, no error, `Q` untouched.
            crate::all_reduce(t, grad, ReduceOp::Sum, Algorithm::Auto, seg)?;
            reduce.finish(grad, world);
            self.step += 1;
            self.bytes += t.bytes_sent() - before;
            return Ok(());
        }
        let algo = factor_algorithm(world);
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
        // The transposed matrices M_i, row-major (the others are row-major in `m` already).
        self.view.clear();
        for tn in &self.tensors {
            if let PowerSgdTensor::LowRank {
                range,
                rows,
                transposed: true,
                ..
            } = tn
            {
                let m = &self.m[range.clone()];
                for i in 0..*rows {
                    self.view.extend(m.iter().skip(i).step_by(*rows));
                }
            }
        }
        // All-reduce 1: every P_i = M_i Q, then the dense tensors.
        self.buf1.clear();
        for (k, (rows, cols, m)) in row_major(&self.tensors, &self.m, &self.view).enumerate() {
            let q = &self.q[k];
            for i in 0..rows {
                let row = &m[i * cols..(i + 1) * cols];
                for c in 0..r {
                    self.buf1
                        .push((0..cols).map(|j| row[j] * q[j * r + c]).sum::<f32>());
                }
            }
        }
        for tn in &self.tensors {
            if let PowerSgdTensor::Dense { range } = tn {
                self.buf1.extend_from_slice(&self.m[range.clone()]);
            }
        }
        if !self.buf1.is_empty() {
            crate::all_reduce(t, &mut self.buf1, ReduceOp::Sum, algo, seg)?;
        }
        // Orthogonalize each P; all-reduce 2: every Q_i = M_i^T P^.
        self.buf2.clear();
        let mut at = 0;
        for (rows, cols, m) in row_major(&self.tensors, &self.m, &self.view) {
            let p = &mut self.buf1[at..at + rows * r];
            orthogonalize(p, rows, r);
            let q0 = self.buf2.len();
            self.buf2.resize(q0 + cols * r, 0.0);
            let q = &mut self.buf2[q0..];
            for i in 0..rows {
                let row = &m[i * cols..(i + 1) * cols];
                for c in 0..r {
                    let pic = p[i * r + c];
                    for j in 0..cols {
                        q[j * r + c] += row[j] * pic;
                    }
                }
            }
            at += rows * r;
        }
        if !self.buf2.is_empty() {
            crate::all_reduce(t, &mut self.buf2, ReduceOp::Sum, algo, seg)?;
        }
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
                PowerSgdTensor::LowRank {
                    range,
                    rows,
                    cols,
                    transposed,
                } => {
                    let p = &self.buf1[pat..pat + rows * r];
                    let q = &self.buf2[qat..qat + cols * r];
                    let out = &mut grad[range.clone()];
                    // Element (i, j) of the view, at its place in storage.
                    let (si, sj) = if *transposed { (1, *rows) } else { (*cols, 1) };
                    for i in 0..*rows {
                        for j in 0..*cols {
                            out[i * si + j * sj] =
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

#[cfg(test)]
mod tests {
    //! The options beyond the paper and the bytes on the wire. (The paper's algorithm itself
    //! is checked against a naive f64 reference in `crate::tests::powersgd`.)

    use gradwire_codec::{BuildContext, PowerSgdConfig, TensorInfo, TensorRole};
    use rand::{Rng, SeedableRng};

    use super::{PowerSgdAllReduce, PowerSgdTensor};
    use crate::compressed::Reduce;
    use crate::tests::{lenet, local_world, run_world, tcp_world};

    fn grad(rank: usize, step: usize, len: usize) -> Vec<f32> {
        let mut g = rand::rngs::StdRng::seed_from_u64((rank * 131 + step) as u64);
        (0..len).map(|_| g.gen_range(-1.0f32..1.0)).collect()
    }

    fn cfg(spec: &str) -> PowerSgdConfig {
        match spec.parse() {
            Ok(gradwire_codec::CodecConfig::PowerSgd(c)) => c,
            other => panic!("{spec}: {other:?}"),
        }
    }

    /// Per step, the sum over ranks of the payload bytes is that of a ring all-reduce of
    /// PyTorch's hook buffers: `2 (P-1) * 4 * floats`, with LeNet's floats at rank 2 counted
    /// by hand: biases 6+16+120+84+10 = 236, `P`s (6+16+120+84+10)*2 = 472, `Q`s
    /// (25+150+400+120+84)*2 = 1558; 2266 in all (13,596 B per rank per step on 4 ranks).
    #[test]
    fn factor_bytes_are_a_ring_all_reduce_of_the_hooks_buffers() {
        const FLOATS: u64 = 236 + 472 + 1558;
        let len: usize = lenet(400).iter().map(TensorInfo::numel).sum();
        for (world, factory) in [
            (4, local_world as fn(usize) -> _),
            (3, local_world),
            (2, tcp_world),
        ] {
            let got = run_world(factory(world), |t| {
                let ctx =
                    BuildContext::new(5, t.rank(), world, Vec::new()).with_tensors(lenet(400));
                let mut a = PowerSgdAllReduce::new(&cfg("powersgd:rank=2"), &ctx, len);
                let mut per_step = Vec::new();
                for s in 0..3 {
                    let before = a.bytes_sent();
                    let mut g = grad(t.rank(), s, len);
                    a.all_reduce(t, &mut g, Reduce::Mean).unwrap();
                    per_step.push(a.bytes_sent() - before);
                }
                per_step
            });
            for s in 0..3 {
                let total: u64 = got.iter().map(|r| r[s]).sum();
                assert_eq!(
                    total,
                    2 * (world as u64 - 1) * 4 * FLOATS,
                    "P={world} step {s}: {got:?}"
                );
            }
        }
    }

    /// `start=N`: the first `N` steps are the exact mean (no error kept), and from step `N`
    /// on the outputs are those of `start=0` fed the same later gradients.
    #[test]
    fn start_runs_plain_all_reduces_then_compresses_from_a_clean_state() {
        let ts = lenet(400);
        let len: usize = ts.iter().map(TensorInfo::numel).sum();
        let (start, steps) = (2, 5);
        for world in [1, 3, 4] {
            let got = run_world(local_world(world), |t| {
                let ctx =
                    BuildContext::new(9, t.rank(), world, Vec::new()).with_tensors(lenet(400));
                let mut warm = PowerSgdAllReduce::new(&cfg("powersgd:rank=2,start=2"), &ctx, len);
                let mut cold = PowerSgdAllReduce::new(&cfg("powersgd:rank=2"), &ctx, len);
                let mut outs = Vec::new();
                for s in 0..steps {
                    let mut g = grad(t.rank(), s, len);
                    warm.all_reduce(t, &mut g, Reduce::Mean).unwrap();
                    let mut c = grad(t.rank(), s, len);
                    if s >= start {
                        cold.all_reduce(t, &mut c, Reduce::Mean).unwrap();
                    }
                    outs.push((g, c, warm.error().is_empty()));
                }
                outs
            });
            for (rank, outs) in got.iter().enumerate() {
                for (s, (g, c, no_error)) in outs.iter().enumerate() {
                    if s < start {
                        assert!(no_error, "P={world} rank {rank} step {s}: error kept");
                        let gs: Vec<Vec<f32>> = (0..world).map(|i| grad(i, s, len)).collect();
                        for (k, x) in g.iter().enumerate() {
                            let mean = gs.iter().map(|g| g[k] as f64).sum::<f64>() / world as f64;
                            assert!((*x as f64 - mean).abs() < 1e-5, "P={world} step {s}");
                        }
                    } else {
                        assert_eq!(g, c, "P={world} rank {rank} step {s}");
                    }
                }
            }
        }
    }

    /// `min_rate=X` keeps a matrix dense unless `(rows + cols) r X < rows cols`; 1-D tensors
    /// are dense whatever the rate.
    #[test]
    fn min_rate_decides_which_matrices_are_compressed() {
        use TensorRole::*;
        let ts = vec![
            TensorInfo::new([16, 16], LinearWeight), // r=4: 128 < 256, 256 = 256
            TensorInfo::new([64, 64], LinearWeight), // r=4: 512 X < 4096 while X < 8
            TensorInfo::new([300], Bias),
        ];
        let len: usize = ts.iter().map(TensorInfo::numel).sum();
        let ctx = BuildContext::new(1, 0, 1, Vec::new()).with_tensors(ts);
        let kinds = |spec: &str| -> Vec<bool> {
            PowerSgdAllReduce::new(&cfg(spec), &ctx, len)
                .tensors()
                .iter()
                .map(|k| matches!(k, PowerSgdTensor::LowRank { .. }))
                .collect()
        };
        assert_eq!(kinds("powersgd:rank=4"), [true, true, false]);
        assert_eq!(kinds("powersgd:rank=4,min_rate=2"), [false, true, false]);
        assert_eq!(kinds("powersgd:rank=4,min_rate=7.5"), [false, true, false]);
        assert_eq!(kinds("powersgd:rank=4,min_rate=8"), [false, false, false]);
    }
}
