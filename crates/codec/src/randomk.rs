//! Random-k sparsification (as in Stich, Cordonnier & Jaggi, "Sparsified SGD with Memory",
//! NeurIPS 2018; Wangni et al. 2018): send `k = ceil(ratio * n)` coordinates drawn uniformly
//! without replacement.
//!
//! The indices come from a 64-bit key derived from `(seed, step, call)` and *not* from the
//! rank: every rank draws the same indices at a given step (`step` from
//! [`Codec::set_progress`], `call` counting the encodes within that step), so a sparse
//! allreduce can sum values directly. The indices are not sent: the payload carries the key
//! and the decoder regenerates them (so any random-k decoder decodes any random-k payload).
//!
//! `scale=true` (default) is the unbiased variant: values are scaled by `n / k`, so
//! `E[decode(encode(g))] = g` and no residual is needed. `scale=false` is the biased variant
//! with a residual (error feedback, `ef`, on by default there): `x = g + r`, the drawn
//! coordinates of `x` are sent unscaled and zeroed in `r`.
//!
//! Wire layout (little-endian):
//! ```text
//! 0..12   Header (codec id 10 = randomk, element count n)
//! 12..20  key u64: the indices are rand::seq::index::sample(ChaCha8Rng::seed_from_u64(key),
//!         n, k), sorted ascending (key = splitmix mix of seed, call, step)
//! 20..28  k u64 (<= n)
//! 28..32  scale f32 (finite, > 0): n/k or 1
//! 32..    k values f32, in increasing index order (the decoder adds scale * value)
//! ```
//! Size: `32 + 4k` bytes, independent of the data.

use std::fmt;

use rand::seq::index;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::sparse::{check_len, fit, k_for, read_count, read_positive_f32, read_u64, step_key};
use crate::{
    BuildContext, Caps, Codec, CodecId, ConfigError, DecodeError, Feedback, Params, Progress,
    SparseEncode, SparseGrad, StateReader, StateWriter, HEADER_LEN,
};

/// Parameters of `randomk:ratio=0.01[,scale=true|false][,ef=true|false]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RandomKConfig {
    /// Fraction of elements sent, in (0, 1] (default 0.01).
    pub ratio: f64,
    /// Scale by n/k (unbiased, default true).
    pub scale: bool,
    /// Keep a residual (default: `!scale`).
    pub ef: bool,
}

impl RandomKConfig {
    /// Reads `ratio`, `scale`, `ef`.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        let ratio = p.f64_in("ratio", Some(0.01), 1e-9, 1.0)?;
        let scale = p.bool("scale", true)?;
        let ef = p.bool("ef", !scale)?;
        Ok(RandomKConfig { ratio, scale, ef })
    }

    /// The canonical `key=value,...` parameters (parse back to `self`).
    pub fn spec_params(&self) -> String {
        self.to_string()
    }

    /// The runtime codec.
    pub fn build(&self, ctx: &BuildContext) -> Box<dyn Codec> {
        Box::new(RandomK::new(self.clone(), ctx))
    }
}

impl fmt::Display for RandomKConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ratio={},scale={},ef={}",
            self.ratio, self.scale, self.ef
        )
    }
}

/// The random-k codec.
#[derive(Debug)]
pub struct RandomK {
    cfg: RandomKConfig,
    seed: u64,
    step: u64,
    call: u64,
    residual: Vec<f32>,
    sel: SparseGrad,
}

/// The k sorted indices of `key` for `n` elements.
fn draw(key: u64, n: usize, k: usize, out: &mut Vec<u32>) {
    out.clear();
    if k >= n {
        out.extend(0..n as u32);
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(key);
    out.extend(index::sample(&mut rng, n, k).into_iter().map(|i| i as u32));
    out.sort_unstable();
}

/// A validated random-k payload: the key its indices are drawn from, `k`, the scale and the
/// `k` raw values.
struct Payload<'a> {
    key: u64,
    k: usize,
    scale: f32,
    values: &'a [u8],
}

impl<'a> Payload<'a> {
    /// Checks every field of `payload` (for `n` elements) and its exact length.
    fn parse(payload: &'a [u8], n: usize) -> Result<Self, DecodeError> {
        crate::Header::check(payload, CodecId::RandomK, n)?;
        let key = read_u64(payload, HEADER_LEN)?;
        let k = read_count(payload, HEADER_LEN + 8, n, "k", "more values than elements")?;
        let scale = read_positive_f32(payload, HEADER_LEN + 16, "scale")?;
        check_len(HEADER_LEN + 20 + 4 * k, payload.len())?;
        Ok(Payload {
            key,
            k,
            scale,
            values: &payload[HEADER_LEN + 20..],
        })
    }

    /// The `k` raw values, in increasing index order.
    fn values(&self) -> impl Iterator<Item = f32> + '_ {
        self.values
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }
}

impl RandomK {
    /// A random-k codec; only `ctx.seed` matters (the same on every rank).
    pub fn new(cfg: RandomKConfig, ctx: &BuildContext) -> Self {
        RandomK {
            cfg,
            seed: ctx.seed,
            step: 0,
            call: 0,
            residual: Vec::new(),
            sel: SparseGrad::default(),
        }
    }

    /// What was not sent yet (empty unless `ef`).
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    fn scale(&self, n: usize, k: usize) -> f32 {
        if self.cfg.scale && k > 0 {
            (n as f64 / k as f64) as f32
        } else {
            1.0
        }
    }

    /// Draws this call's indices into `out.indices`, raw values into `out.values`; returns
    /// (key, scale).
    fn select(&mut self, grad: &[f32], out: &mut SparseGrad) -> (u64, f32) {
        let n = grad.len();
        out.start(n, "random-k");
        let (step, call) = (self.step, self.call);
        self.call += 1;
        let k = k_for(self.cfg.ratio, n);
        let key = step_key(self.seed, call, step);
        draw(key, n, k, &mut out.indices);
        if self.cfg.ef {
            fit(&mut self.residual, n);
            for (x, &y) in self.residual.iter_mut().zip(grad) {
                *x += y;
            }
            for &i in &out.indices {
                let x = &mut self.residual[i as usize];
                out.values.push(*x);
                *x = 0.0;
            }
        } else {
            out.values
                .extend(out.indices.iter().map(|&i| grad[i as usize]));
        }
        (key, self.scale(n, k))
    }
}

impl Codec for RandomK {
    fn id(&self) -> CodecId {
        CodecId::RandomK
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let mut sel = std::mem::take(&mut self.sel);
        let (key, scale) = self.select(grad, &mut sel);
        crate::Header::write(out, CodecId::RandomK, grad.len());
        out.reserve(20 + 4 * sel.values.len());
        out.extend_from_slice(&key.to_le_bytes());
        out.extend_from_slice(&(sel.values.len() as u64).to_le_bytes());
        out.extend_from_slice(&scale.to_le_bytes());
        for v in &sel.values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        self.sel = sel;
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let n = acc.len();
        let p = Payload::parse(payload, n)?;
        let mut idx = Vec::new();
        draw(p.key, n, p.k, &mut idx);
        for (&i, v) in idx.iter().zip(p.values()) {
            acc[i as usize] += p.scale * v;
        }
        Ok(())
    }

    fn caps(&self) -> Caps {
        // With a residual the payload estimates `g + r`, not `g` (as under ErrorFeedback).
        Caps {
            unbiased: self.cfg.scale && !self.cfg.ef,
            feedback: Feedback::owned_if(self.cfg.ef),
        }
    }

    fn set_progress(&mut self, progress: Progress) {
        if progress.step != self.step {
            self.step = progress.step;
            self.call = 0;
        }
    }

    fn sparse_encode(&mut self) -> Option<&mut dyn SparseEncode> {
        Some(self)
    }

    fn save_state(&self) -> Vec<u8> {
        StateWriter::new(CodecId::RandomK)
            .u64(self.step)
            .u64(self.call)
            .f32s(&self.residual)
            .finish()
    }

    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        let mut r = StateReader::new(state, CodecId::RandomK)?;
        let step = r.u64()?;
        let call = r.u64()?;
        let residual = r.f32s()?;
        r.finish()?;
        (self.step, self.call, self.residual) = (step, call, residual);
        Ok(())
    }
}

impl SparseEncode for RandomK {
    fn encode_sparse(&mut self, grad: &[f32], out: &mut SparseGrad) {
        let (_, scale) = self.select(grad, out);
        if scale != 1.0 {
            for v in &mut out.values {
                *v *= scale;
            }
        }
    }

    /// The indices drawn from the payload's key, as the decoder draws them (so a kept 0.0
    /// keeps its index), and the raw values times the payload's scale where it is not 1, as
    /// `encode_sparse` scales them.
    fn decode_pairs(
        &mut self,
        payload: &[u8],
        n: usize,
        out: &mut SparseGrad,
    ) -> Result<(), DecodeError> {
        out.start_pairs(n)?;
        let p = Payload::parse(payload, n)?;
        draw(p.key, n, p.k, &mut out.indices);
        out.values.reserve_exact(p.k);
        out.values.extend(
            p.values()
                .map(|v| if p.scale != 1.0 { v * p.scale } else { v }),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{
        assert_conserves, assert_refuses_cuts, assert_resumes, config, patched, refused,
    };

    fn codec(spec: &str, seed: u64, rank: usize) -> RandomK {
        let ctx = BuildContext::new(seed, rank, 4, vec![]);
        RandomK::new(config(spec, RandomKConfig::parse), &ctx)
    }

    fn grad(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    #[test]
    fn unbiased_on_average() {
        let n = 100;
        let g = grad(n, 1);
        let mut c = codec("randomk:ratio=0.1", 3, 0);
        assert!(c.caps().unbiased);
        let mut acc = vec![0.0f32; n];
        let mut out = Vec::new();
        let trials = 4000;
        for t in 0..trials {
            c.set_progress(Progress {
                step: t,
                epoch: 0.0,
            });
            c.encode(&g, &mut out);
            assert_eq!(out.len(), 32 + 4 * 10, "size formula");
            c.decode_add(&out, &mut acc).unwrap();
        }
        // Per-element std of the mean: |g| * sqrt(n/k - 1) / sqrt(trials) <= 0.048.
        for i in 0..n {
            let mean = acc[i] / trials as f32;
            assert!((mean - g[i]).abs() < 0.2, "{i}: {mean} vs {}", g[i]);
        }
        let bias: f32 = (0..n).map(|i| acc[i] / trials as f32 - g[i]).sum::<f32>() / n as f32;
        assert!(bias.abs() < 0.02, "mean bias {bias}");
    }

    #[test]
    fn same_indices_on_every_rank_and_decodable_by_any() {
        let n = 10_000;
        let mut sets = Vec::new();
        let mut codecs: Vec<_> = (0..4).map(|r| codec("randomk:ratio=0.01", 9, r)).collect();
        for (r, c) in codecs.iter_mut().enumerate() {
            c.set_progress(Progress {
                step: 5,
                epoch: 0.0,
            });
            let mut s = SparseGrad::default();
            c.encode_sparse(&grad(n, r as u32), &mut s);
            assert_eq!(s.indices.len(), 100);
            assert!(s.indices.windows(2).all(|w| w[0] < w[1]));
            sets.push(s.indices);
        }
        assert!(sets.iter().all(|s| *s == sets[0]));
        // A payload of rank 1 decodes on rank 3 to the same values as its encode_sparse.
        let mut c1 = codec("randomk:ratio=0.01", 9, 1);
        c1.set_progress(Progress {
            step: 6,
            epoch: 0.0,
        });
        let mut c1b = codec("randomk:ratio=0.01", 9, 1);
        c1b.set_progress(Progress {
            step: 6,
            epoch: 0.0,
        });
        let g = grad(n, 77);
        let mut out = Vec::new();
        c1.encode(&g, &mut out);
        let mut s = SparseGrad::default();
        c1b.encode_sparse(&g, &mut s);
        let mut acc = vec![0.0; n];
        codecs[3].decode_add(&out, &mut acc).unwrap();
        for (&i, &v) in s.indices.iter().zip(&s.values) {
            assert_eq!(acc[i as usize], v);
        }
        assert_eq!(acc.iter().filter(|&&v| v != 0.0).count(), 100);
        // Another step draws other indices.
        assert_ne!(s.indices, sets[0]);
    }

    #[test]
    fn biased_variant_conserves_the_signal_and_resumes() {
        let n = 5000;
        let mut c = codec("randomk:ratio=0.05,scale=false", 1, 0);
        assert!(!c.caps().unbiased);
        assert_conserves(&mut c, RandomK::residual, (0..3).map(|s| grad(n, s)), 1e-5);
        let mut d = codec("randomk:ratio=0.05,scale=false", 1, 0);
        let st = assert_resumes(&mut c, &mut d, [grad(n, 9)]);
        assert!(d.load_state(&st[..st.len() - 2]).is_err());
    }

    #[test]
    fn decoder_rejects_malformed() {
        let n = 1000;
        let mut c = codec("randomk:ratio=0.01", 1, 0);
        let mut out = Vec::new();
        c.encode(&grad(n, 1), &mut out);
        assert_refuses_cuts(&c, &out, n);
        let mut longer = out.clone();
        longer.push(0);
        assert!(matches!(
            refused(&c, &longer, n),
            DecodeError::TrailingBytes { .. }
        ));
        let nan = patched(&out, HEADER_LEN + 16, &f32::NAN.to_le_bytes());
        assert!(matches!(
            refused(&c, &nan, n),
            DecodeError::InvalidField { field: "scale", .. }
        ));
        let huge = patched(&out, HEADER_LEN + 8, &u64::MAX.to_le_bytes());
        assert!(matches!(
            refused(&c, &huge, n),
            DecodeError::InvalidField { field: "k", .. }
        ));
        let spec = format!("randomk:{}", c.cfg.spec_params());
        assert_eq!(config(&spec, RandomKConfig::parse), c.cfg);
    }
}
