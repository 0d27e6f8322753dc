//! `powersgd`: PowerSGD (Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient
//! Compression for Distributed Optimization", NeurIPS 2019).
//!
//! Each tensor of the layout (or the whole gradient when the layout does not match) of `N`
//! elements is viewed as a row-major matrix `M` of `n x m`, with `m` the largest divisor of
//! `N` not above `sqrt(N)`. When rank `r` saves bytes (`(n + m) r < n m`), one step of
//! power iteration gives the approximation `M ~ P Q^T`: `P = M Q`, orthonormalize `P`'s
//! columns (Gram-Schmidt), `Q = M^T P`. `Q` is kept for the next step (warm start,
//! `warm=true`); otherwise, and at the first step, it is drawn from `(seed, tensor)` so every
//! rank starts from the same `Q`. Tensors that do not save bytes (vectors, primes) go as
//! fp32, like the paper's uncompressed biases. PowerSGD is biased: error feedback is the
//! default (`ef=true`), as in the paper.
//!
//! Two algorithms share the `powersgd` spec. The published one (`variant=paper`, the default)
//! all-reduces `P` (sum, then orthogonalize) and then `Q`: two collectives per step, not a
//! plain encode/decode, so it lives in `gradwire_collective::compressed::PowerSgdAllReduce`,
//! which reads this config (rank, warm start, error feedback) and the tensors' shapes; callers
//! must route `variant=paper` there. Two options of PyTorch's `powerSGD_hook`, not the
//! paper's, apply to `variant=paper` only: `start=N` (plain all-reduces for the first `N`
//! steps, PyTorch's `start_powerSGD_iter`) and `min_rate=X` (compress only matrices that
//! shrink at least `X` times, PyTorch's `min_compression_rate`); see [`PowerSgdConfig`].
//! This codec is the other one, `variant=local` (the "gather variant"): it sends this rank's
//! own rank-`r` approximation, and `decode_add` of every rank's payload sums those (rank up
//! to `r * world_size`), for gather-decode. Deviation
//! of the local variant: the paper's error feedback and warm start are per rank here, and the
//! aggregate is not the paper's.
//!
//! Wire layout: the 12-byte [`crate::Header`] (codec 12), then per tensor either
//! ```text
//! low rank:  P^T  r*n f32 (row k = column k of P), then Q^T  r*m f32 (row k = column k of Q)
//! fp32:      N f32
//! ```
//! all little-endian. Ratio: `n m / ((n + m) r)` per low-rank tensor.

use std::fmt;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::layout::{expect_len, f32_at, segments};
use crate::{
    BuildContext, Codec, CodecId, ConfigError, DecodeError, Header, Params, Progress, StateReader,
    StateWriter, StepRng,
};

/// Parameters of PowerSGD.
#[derive(Debug, Clone, PartialEq)]
pub struct PowerSgdConfig {
    /// Approximation rank `r`.
    pub rank: usize,
    /// Reuse last step's `Q` (default on).
    pub warm: bool,
    /// Error feedback (default on).
    pub ef: bool,
    /// `variant=local`: the gather variant (this codec through gather-decode) instead of the
    /// published two all-reduces (`variant=paper`, default).
    pub local: bool,
    /// `start=N`: plain fp32 all-reduces for the first `N` steps, compression from step `N`
    /// on (PyTorch's `start_powerSGD_iter`, 1000 there; the paper compresses from the first
    /// step: default 0). `variant=paper` only.
    pub start: usize,
    /// `min_rate=X`: compress a `rows x cols` matrix only when
    /// `(rows + cols) r X < rows cols` (PyTorch's `min_compression_rate`, 2 there). Default
    /// 1: every matrix that rank `r` shrinks (the paper's code compresses every matrix, even
    /// one that grows). `variant=paper` only.
    pub min_rate: f64,
}

impl Default for PowerSgdConfig {
    fn default() -> Self {
        PowerSgdConfig {
            rank: 4,
            warm: true,
            ef: true,
            local: false,
            start: 0,
            min_rate: 1.0,
        }
    }
}

impl PowerSgdConfig {
    /// Reads `rank=`, `warm=`, `ef=`, `variant=paper|local`, `start=` and `min_rate=`.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        let c = PowerSgdConfig {
            rank: p.usize_in("rank", Some(4), 1, 256)?,
            warm: p.bool("warm", true)?,
            ef: p.bool("ef", true)?,
            local: p.choice("variant", "paper", &["paper", "local"])? == "local",
            start: p.usize_in("start", Some(0), 0, u32::MAX as usize)?,
            min_rate: p.f64_in("min_rate", Some(1.0), 1.0, 1e6)?,
        };
        if c.local && (c.start != 0 || c.min_rate != 1.0) {
            return Err(ConfigError::BadValue {
                codec: "powersgd".into(),
                param: "variant".into(),
                value: "local".into(),
                reason: "start= and min_rate= belong to variant=paper".into(),
            });
        }
        Ok(c)
    }

    /// Whether a `rows x cols` matrix is compressed at rank `r` (`(rows + cols) r min_rate
    /// < rows cols`, PyTorch's `_should_compress`).
    pub fn compresses(&self, rows: usize, cols: usize) -> bool {
        let r = self.rank.max(1);
        (rows + cols)
            .checked_mul(r)
            .is_some_and(|x| (x as f64) * self.min_rate < rows as f64 * cols as f64)
    }

    /// The runtime codec.
    pub fn build(&self, ctx: &BuildContext) -> Box<dyn Codec> {
        let c = PowerSgd::new(self.rank, self.warm, &ctx.layout, ctx.seed, ctx.rank);
        crate::feedback::maybe_wrap(c, self.ef)
    }
}

impl fmt::Display for PowerSgdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let variant = if self.local { "local" } else { "paper" };
        write!(
            f,
            "rank={},warm={},ef={},variant={variant}",
            self.rank, self.warm, self.ef
        )?;
        // Written only when set, so earlier runs' records keep their spec.
        if self.start != 0 {
            write!(f, ",start={}", self.start)?;
        }
        if self.min_rate != 1.0 {
            write!(f, ",min_rate={}", self.min_rate)?;
        }
        Ok(())
    }
}

/// The PowerSGD low-rank compressor (without error feedback).
#[derive(Debug, Clone)]
pub struct PowerSgd {
    rank: usize,
    warm: bool,
    layout: Vec<usize>,
    seed: u64,
    rng: StepRng,
    /// Gradient length the warm-start `Q`s belong to.
    q_len: usize,
    /// Every low-rank tensor's `Q^T`, concatenated.
    q: Vec<f32>,
}

/// The matrix shape of a tensor of `len` elements and whether rank `r` compresses it.
fn shape(len: usize, r: usize) -> Option<(usize, usize)> {
    let mut m = (len as f64).sqrt() as usize;
    while m > 1 && !len.is_multiple_of(m) {
        m -= 1;
    }
    if m == 0 {
        return None;
    }
    let n = len / m;
    ((n + m).checked_mul(r)? < n * m).then_some((n, m))
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 8;
    let mut s = [0f32; L];
    let mut ia = a.chunks_exact(L);
    let mut ib = b.chunks_exact(L);
    for (x, y) in (&mut ia).zip(&mut ib) {
        for l in 0..L {
            s[l] += x[l] * y[l];
        }
    }
    s.iter().sum::<f32>()
        + ia.remainder()
            .iter()
            .zip(ib.remainder())
            .map(|(x, y)| x * y)
            .sum::<f32>()
}

#[inline(always)]
fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

impl PowerSgd {
    /// A rank-`rank` compressor over the tensors of `layout`, for `rank_id` of a run seeded
    /// with `seed` (the initial `Q` depends on the seed only).
    pub fn new(rank: usize, warm: bool, layout: &[usize], seed: u64, rank_id: usize) -> Self {
        PowerSgd {
            rank: rank.max(1),
            warm,
            layout: layout.to_vec(),
            seed,
            rng: StepRng::new(seed, rank_id),
            q_len: usize::MAX,
            q: Vec::new(),
        }
    }

    fn body_len(&self, n: usize) -> usize {
        segments(&self.layout, n)
            .map(|s| match shape(s.len(), self.rank) {
                Some((a, b)) => (a + b) * self.rank * 4,
                None => s.len() * 4,
            })
            .sum()
    }

    /// Fresh `Q`s for a gradient of `n` elements.
    fn init_q(&mut self, n: usize, salt: u64) {
        self.q.clear();
        for (t, s) in segments(&self.layout, n).enumerate() {
            if let Some((_, m)) = shape(s.len(), self.rank) {
                let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ salt ^ (t as u64) << 32);
                self.q
                    .extend((0..m * self.rank).map(|_| rng.gen_range(-1.0f32..1.0)));
            }
        }
        self.q_len = n;
    }
}

impl Codec for PowerSgd {
    fn id(&self) -> CodecId {
        CodecId::PowerSgd
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let salt = self.rng.next_key() as u64;
        if !self.warm || self.q_len != grad.len() {
            self.init_q(grad.len(), if self.warm { 0 } else { salt });
        }
        let r = self.rank;
        Header::write(out, CodecId::PowerSgd, grad.len());
        out.reserve(self.body_len(grad.len()));
        let mut qat = 0;
        let mut p = Vec::new();
        for s in segments(&self.layout, grad.len()) {
            let x = &grad[s.clone()];
            let Some((n, m)) = shape(x.len(), r) else {
                out.extend_from_slice(bytemuck::cast_slice(x));
                continue;
            };
            let q = &mut self.q[qat..qat + m * r];
            qat += m * r;
            // P^T (r x n) = (M Q)^T.
            p.clear();
            p.resize(r * n, 0.0);
            for i in 0..n {
                let row = &x[i * m..(i + 1) * m];
                for k in 0..r {
                    p[k * n + i] = dot(row, &q[k * m..(k + 1) * m]);
                }
            }
            // Orthonormalize the columns of P (rows of P^T).
            for k in 0..r {
                let (done, rest) = p.split_at_mut(k * n);
                let pk = &mut rest[..n];
                for l in 0..k {
                    let pl = &done[l * n..(l + 1) * n];
                    let c = dot(pk, pl);
                    axpy(-c, pl, pk);
                }
                let norm = dot(pk, pk).sqrt();
                let inv = 1.0 / (norm + 1e-8);
                for v in pk.iter_mut() {
                    *v *= inv;
                }
            }
            // Q^T (r x m) = (M^T P)^T.
            q.fill(0.0);
            for i in 0..n {
                let row = &x[i * m..(i + 1) * m];
                for k in 0..r {
                    axpy(p[k * n + i], row, &mut q[k * m..(k + 1) * m]);
                }
            }
            out.extend_from_slice(bytemuck::cast_slice(&p));
            out.extend_from_slice(bytemuck::cast_slice(q));
        }
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let body = Header::check(payload, CodecId::PowerSgd, acc.len())?;
        expect_len(body, self.body_len(acc.len()))?;
        let r = self.rank;
        let mut at = 0;
        for s in segments(&self.layout, acc.len()) {
            if let Some((n, m)) = shape(s.len(), r) {
                let end = at + (n + m) * r * 4;
                if body[at..end]
                    .chunks_exact(4)
                    .any(|c| !f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite())
                {
                    return Err(DecodeError::InvalidField {
                        field: "powersgd factor",
                        reason: "not finite",
                    });
                }
                at = end;
            } else {
                at += s.len() * 4;
            }
        }
        let mut at = 0;
        let mut qt = Vec::new();
        for s in segments(&self.layout, acc.len()) {
            let a = &mut acc[s.clone()];
            let Some((n, m)) = shape(a.len(), r) else {
                for (i, v) in a.iter_mut().enumerate() {
                    *v += f32_at(body, at + 4 * i);
                }
                at += s.len() * 4;
                continue;
            };
            let pt = at;
            qt.clear();
            qt.extend((0..r * m).map(|j| f32_at(body, at + 4 * (r * n + j))));
            for i in 0..n {
                let row = &mut a[i * m..(i + 1) * m];
                for k in 0..r {
                    axpy(
                        f32_at(body, pt + 4 * (k * n + i)),
                        &qt[k * m..(k + 1) * m],
                        row,
                    );
                }
            }
            at += (n + m) * r * 4;
        }
        Ok(())
    }

    fn set_progress(&mut self, progress: Progress) {
        self.rng.set_step(progress.step);
    }

    fn save_state(&self) -> Vec<u8> {
        let mut w = StateWriter::new(CodecId::PowerSgd);
        self.rng.save(&mut w);
        w.u64(self.q_len as u64).f32s(&self.q);
        w.finish()
    }

    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        let mut r = StateReader::new(state, CodecId::PowerSgd)?;
        let rng = self.rng.loaded(&mut r)?;
        let q_len = r.u64()?;
        let q = r.f32s()?;
        r.finish()?;
        // Bound the work of re-deriving shapes (trial division up to sqrt(len)).
        if q_len != usize::MAX as u64 && q_len > 1 << 40 {
            return Err(DecodeError::invalid_state("gradient length too large"));
        }
        self.rng = rng;
        self.q_len = usize::try_from(q_len).unwrap_or(usize::MAX);
        self.q = q;
        if self.q_len != usize::MAX {
            let need: usize = segments(&self.layout, self.q_len)
                .filter_map(|s| shape(s.len(), self.rank).map(|(_, m)| m * self.rank))
                .sum();
            if need != self.q.len() {
                self.q_len = usize::MAX;
                self.q.clear();
                return Err(DecodeError::invalid_state("warm-start matrices do not fit"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_resumes;
    use crate::HEADER_LEN;

    #[test]
    fn shapes() {
        assert_eq!(shape(100, 1), Some((10, 10)));
        assert_eq!(shape(784 * 128, 4), Some((392, 256)));
        assert_eq!(shape(97, 1), None);
        assert_eq!(shape(10, 4), None);
        assert_eq!(shape(0, 1), None);
    }

    #[test]
    fn exact_for_low_rank_matrices_and_ratio() {
        // A rank-2 64 x 64 matrix plus a bias vector of 7.
        let (n, m) = (64, 64);
        let mut g: Vec<f32> = (0..n * m)
            .map(|t| {
                let (i, j) = ((t / m) as f32, (t % m) as f32);
                (i * 0.1).sin() * (j * 0.2).cos() + 0.5 * (i * 0.03).cos() * (j * 0.07).sin()
            })
            .collect();
        g.extend((0..7).map(|i| i as f32));
        let layout = [n * m, 7];
        let mut c = PowerSgd::new(2, true, &layout, 5, 0);
        let mut out = Vec::new();
        // Warm start: a few steps of power iteration converge to the exact factors.
        for _ in 0..4 {
            c.encode(&g, &mut out);
        }
        assert_eq!(out.len(), HEADER_LEN + (n + m) * 2 * 4 + 7 * 4);
        let mut d = vec![0.0; g.len()];
        c.decode_add(&out, &mut d).unwrap();
        for (a, b) in d.iter().zip(&g) {
            assert!((a - b).abs() < 1e-3, "{a} {b}");
        }
        let mut c2 = PowerSgd::new(2, true, &layout, 5, 0);
        let s = assert_resumes(&mut c, &mut c2, [g.clone()]);
        assert!(PowerSgd::new(3, true, &layout, 5, 0)
            .load_state(&s)
            .is_err());
    }
}
