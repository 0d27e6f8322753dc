//! `terngrad`: TernGrad (Wen, Xu, Yan, Wu, Wang, Chen, Li, "TernGrad: Ternary Gradients to
//! Reduce Communication in Distributed Deep Learning", NeurIPS 2017).
//!
//! Per tensor (layer-wise): clip every element to `[-c sigma, c sigma]` (`sigma` = the
//! tensor's standard deviation, `c = clip`, 2.5 by default, 0 turns clipping off), take
//! `s = max |clipped|`, and send `s * sign(x_k) * b_k` with `b_k ~ Bernoulli(|x_k| / s)`:
//! unbiased for the clipped gradient. Scalar sharing (layer-wise, as in the paper):
//! [`SharedScalars::local_scalars`] returns this rank's `s` of every tensor; after the ranks
//! agree on the element-wise max and call [`SharedScalars::set_shared_scalars`], the next
//! encode uses tensor `l`'s shared scale for tensor `l`, so the ternaries of all ranks share
//! it and sum as small integers. (One scale for the whole model, the max over all tensors,
//! would scale a layer of small gradients by another layer's large max: almost all its codes
//! become 0 and the variance explodes.) The Bernoulli draws come from
//! the codec's `(seed, rank, step)` stream ([`crate::StepRng`]).
//!
//! The output layer stays in float by default (`output=float`), as in the reference code
//! (wenwei202/terngrad leaves the last classification layer unternarized): tensors whose
//! [`crate::TensorRole`] is `Output` in [`crate::BuildContext::tensors`] travel as plain f32.
//! `output=ternary` ternarizes them like the rest. Without shapes and roles, every tensor is
//! ternarized.
//!
//! Wire layout: the 12-byte [`crate::Header`] (codec 8), then for each tensor of the layout
//! (or the whole gradient when the layout does not match) of `d` elements, either (ternary)
//! ```text
//! 0..4                s     f32  the scale
//! 4..4+4*ceil(d/16)   codes      2 bits each: 0 = 0, 1 = +s, 2 = -s (3 is invalid),
//!                                16 per u32 word, lane-packed (see `pack.rs`)
//! ```
//! or, for an output-layer tensor kept in float, `4 d` bytes of little-endian f32.
//! Ratio: `32 d / (32 + 32 ceil(d/16))`, about 16.

use std::fmt;

use crate::layout::{add_f32_le, expect_len, f32_at, finite, segments};
use crate::pack::{pack, packed_bytes, unpack_add, LANES};
use crate::rng::uniform;
use crate::simd::multiversion;
use crate::{
    BuildContext, Caps, Codec, CodecId, ConfigError, DecodeError, Header, Params, Progress,
    SharedScalars, StateReader, StateWriter, StepRng, TensorRole,
};

/// Parameters of TernGrad.
#[derive(Debug, Clone, PartialEq)]
pub struct TernGradConfig {
    /// Clip at `clip * sigma` (0: no clipping).
    pub clip: f64,
    /// Ternarize the output layer too (default off: it travels in float, as in the
    /// reference code).
    pub ternarize_output: bool,
    /// Error feedback (default off: TernGrad is unbiased).
    pub ef: bool,
}

impl Default for TernGradConfig {
    fn default() -> Self {
        TernGradConfig {
            clip: 2.5,
            ternarize_output: false,
            ef: false,
        }
    }
}

impl TernGradConfig {
    /// Reads `clip=`, `output=float|ternary` and `ef=`.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        Ok(TernGradConfig {
            clip: p.f64_in("clip", Some(2.5), 0.0, 1e6)?,
            ternarize_output: p.choice("output", "float", &["float", "ternary"])? == "ternary",
            ef: p.bool("ef", false)?,
        })
    }

    /// The runtime codec.
    pub fn build(&self, ctx: &BuildContext) -> Box<dyn Codec> {
        let mut c = TernGrad::new(self.clip as f32, &ctx.layout, ctx.seed, ctx.rank);
        if !self.ternarize_output && ctx.tensors.len() == ctx.layout.len() {
            c.float = ctx
                .tensors
                .iter()
                .map(|t| t.role == TensorRole::Output)
                .collect();
        }
        crate::feedback::maybe_wrap(c, self.ef)
    }
}

impl fmt::Display for TernGradConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let output = if self.ternarize_output {
            "ternary"
        } else {
            "float"
        };
        write!(f, "clip={},output={output},ef={}", self.clip, self.ef)
    }
}

/// The TernGrad ternarizer.
#[derive(Debug, Clone)]
pub struct TernGrad {
    clip: f32,
    layout: Vec<usize>,
    rng: StepRng,
    /// The agreed per-tensor scales for the next encode.
    shared: Option<Vec<f32>>,
    /// Per tensor of the layout: sent as plain f32 (the output layer). Empty: none.
    float: Vec<bool>,
}

/// Clip bound and local scale of one tensor: `(c sigma or inf, max |clipped|)`.
#[inline(always)]
fn tensor_stats(x: &[f32], clip: f32) -> (f32, f32) {
    const BLOCK: usize = 4096;
    let (mut sum, mut sq, mut mx) = (0f64, 0f64, 0f32);
    for b in x.chunks(BLOCK) {
        let (mut s, mut q, mut m) = ([0f32; LANES], [0f32; LANES], [0f32; LANES]);
        let mut it = b.chunks_exact(LANES);
        for c in &mut it {
            for l in 0..LANES {
                s[l] += c[l];
                q[l] += c[l] * c[l];
                m[l] = m[l].max(c[l].abs());
            }
        }
        for &v in it.remainder() {
            s[0] += v;
            q[0] += v * v;
            m[0] = m[0].max(v.abs());
        }
        sum += s.iter().map(|&v| v as f64).sum::<f64>();
        sq += q.iter().map(|&v| v as f64).sum::<f64>();
        mx = m.iter().fold(mx, |a, &b| a.max(b));
    }
    if clip <= 0.0 || x.is_empty() {
        return (f32::INFINITY, mx);
    }
    let n = x.len() as f64;
    let var = (sq / n - (sum / n).powi(2)).max(0.0);
    let bound = (clip as f64 * var.sqrt()) as f32;
    (bound, mx.min(bound))
}

impl TernGrad {
    /// A ternarizer clipping at `clip` standard deviations (0: none) over the tensors of
    /// `layout`, for `rank` of a run seeded with `seed`.
    pub fn new(clip: f32, layout: &[usize], seed: u64, rank: usize) -> Self {
        TernGrad {
            clip,
            layout: layout.to_vec(),
            rng: StepRng::new(seed, rank),
            shared: None,
            float: Vec::new(),
        }
    }

    /// The tensors of a gradient of `n` elements, each with whether it travels in float.
    fn tensors(&self, n: usize) -> Vec<(std::ops::Range<usize>, bool)> {
        let segs: Vec<_> = segments(&self.layout, n).collect();
        let fits = segs.len() == self.float.len();
        segs.into_iter()
            .enumerate()
            .map(|(t, s)| (s, fits && self.float[t]))
            .collect()
    }

    fn body_len(&self, n: usize) -> usize {
        self.tensors(n)
            .iter()
            .map(|(s, float)| seg_len(s.len(), *float))
            .sum()
    }
}

/// Bytes of one tensor of `d` elements on the wire.
fn seg_len(d: usize, float: bool) -> usize {
    if float {
        4 * d
    } else {
        4 + packed_bytes(d, 2)
    }
}

multiversion! {
    fn encode_all(tensors: &[(std::ops::Range<usize>, bool)], clip: f32, key: u32, shared: Option<&[f32]>, grad: &[f32], body: &mut [u8]) {
        let mut at = 0;
        for (t, (seg, float)) in tensors.iter().enumerate() {
            let x = &grad[seg.clone()];
            let len = seg_len(x.len(), *float);
            let dst = &mut body[at..at + len];
            if *float {
                for (d, v) in dst.chunks_exact_mut(4).zip(x) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
                at += len;
                continue;
            }
            let (bound, local) = tensor_stats(x, clip);
            // A shared scale below the local one (a caller's mistake) would bias the codes.
            let s = shared.and_then(|v| v.get(t)).map_or(local, |&v| v.max(local));
            dst[..4].copy_from_slice(&s.to_le_bytes());
            let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
            pack::<2>(x, seg.start as u32, &mut dst[4..], |v, i| {
                let p = v.abs().min(bound) * inv;
                let b = (uniform(key, i) < p) as u32;
                b << (v < 0.0) as u32
            });
            at += len;
        }
    }
}

multiversion! {
    fn decode_all(tensors: &[(std::ops::Range<usize>, bool)], body: &[u8], acc: &mut [f32]) {
        let mut at = 0;
        for (seg, float) in tensors.iter().cloned() {
            let len = seg_len(seg.len(), float);
            if float {
                add_f32_le(&body[at..at + len], &mut acc[seg]);
                at += len;
                continue;
            }
            let s = f32_at(body, at);
            unpack_add::<2>(&body[at + 4..at + len], &mut acc[seg], |c| {
                ((c & 1) as f32 - (c >> 1) as f32) * s
            });
            at += len;
        }
    }
}

impl Codec for TernGrad {
    fn id(&self) -> CodecId {
        CodecId::TernGrad
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let key = self.rng.next_key();
        let shared = self.shared.take();
        let tensors = self.tensors(grad.len());
        let body_len = self.body_len(grad.len());
        let body = Header::write_sized(out, CodecId::TernGrad, grad.len(), body_len);
        encode_all(&tensors, self.clip, key, shared.as_deref(), grad, body);
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let body = Header::check(payload, CodecId::TernGrad, acc.len())?;
        expect_len(body, self.body_len(acc.len()))?;
        let tensors = self.tensors(acc.len());
        let mut at = 0;
        for (seg, float) in tensors.iter().cloned() {
            let len = seg_len(seg.len(), float);
            if float {
                at += len;
                continue;
            }
            finite(f32_at(body, at), "terngrad scale")?;
            let mut bad = 0u32;
            for c in body[at + 4..at + len].chunks_exact(4) {
                let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                bad |= w & (w >> 1) & 0x5555_5555;
            }
            if bad != 0 {
                return Err(DecodeError::InvalidField {
                    field: "terngrad code",
                    reason: "code 3",
                });
            }
            at += len;
        }
        decode_all(&tensors, body, acc);
        Ok(())
    }

    fn caps(&self) -> Caps {
        Caps::UNBIASED
    }

    fn set_progress(&mut self, progress: Progress) {
        self.rng.set_step(progress.step);
    }

    fn shared_scalars(&mut self) -> Option<&mut dyn SharedScalars> {
        Some(self)
    }

    fn save_state(&self) -> Vec<u8> {
        let mut w = StateWriter::new(CodecId::TernGrad);
        self.rng.save(&mut w);
        match &self.shared {
            None => w.u64(u64::MAX),
            Some(v) => w.u64(0).f32s(v),
        };
        w.finish()
    }

    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        let mut r = StateReader::new(state, CodecId::TernGrad)?;
        let rng = self.rng.loaded(&mut r)?;
        let shared = match r.u64()? {
            u64::MAX => None,
            0 => Some(r.f32s()?),
            _ => return Err(DecodeError::invalid_state("bad shared scalar")),
        };
        r.finish()?;
        self.rng = rng;
        self.shared = shared;
        Ok(())
    }
}

impl SharedScalars for TernGrad {
    fn local_scalars(&mut self, grad: &[f32]) -> Vec<f32> {
        segments(&self.layout, grad.len())
            .map(|s| tensor_stats(&grad[s], self.clip).1)
            .collect()
    }

    fn set_shared_scalars(&mut self, values: &[f32]) {
        self.shared = Some(values.to_vec());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HEADER_LEN;

    fn grad(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.71).sin() * (i as f32 * 0.05).cos()) * 0.02)
            .collect()
    }

    #[test]
    fn unbiased_without_clipping_and_ternary() {
        let g = grad(700);
        let mut t = TernGrad::new(0.0, &[300, 400], 9, 2);
        let trials = 3000;
        let mut mean = vec![0f64; g.len()];
        let mut out = Vec::new();
        let mut d = vec![0f32; g.len()];
        for _ in 0..trials {
            t.encode(&g, &mut out);
            d.fill(0.0);
            t.decode_add(&out, &mut d).unwrap();
            let s0 = f32_at(&out, HEADER_LEN);
            for v in &d[..300] {
                assert!(*v == 0.0 || v.abs() == s0);
            }
            for i in 0..g.len() {
                mean[i] += d[i] as f64 / trials as f64;
            }
        }
        for (seg, x) in [(0..300), (300..700)]
            .into_iter()
            .map(|r| (r.clone(), &g[r]))
        {
            let s = x.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
            let se = s * 0.5 / (trials as f64).sqrt();
            for (i, &v) in seg.zip(x) {
                assert!((mean[i] - v as f64).abs() <= 5.0 * se, "{i}");
            }
        }
    }

    #[test]
    fn clipping_bounds_the_scale_and_sharing_sets_it() {
        let mut g = grad(1000);
        g[10] = 100.0; // an outlier
        let mut t = TernGrad::new(2.5, &[], 1, 0);
        let local = t.local_scalars(&g)[0];
        assert!(local < 10.0, "{local}");
        let mut out = Vec::new();
        t.encode(&g, &mut out);
        assert_eq!(f32_at(&out, HEADER_LEN), local);
        t.set_shared_scalars(&[local * 2.0]);
        t.encode(&g, &mut out);
        assert_eq!(f32_at(&out, HEADER_LEN), local * 2.0);
        t.encode(&g, &mut out);
        assert_eq!(
            f32_at(&out, HEADER_LEN),
            local,
            "the shared scale is one-shot"
        );
        assert_eq!(out.len(), HEADER_LEN + 4 + 4 * 1000usize.div_ceil(16));
    }

    #[test]
    fn sharing_is_per_tensor() {
        // A layer of small gradients keeps its own (shared) scale, not the big layer's max.
        let mut g = grad(700);
        for v in &mut g[300..] {
            *v *= 0.01;
        }
        let mut t = TernGrad::new(0.0, &[300, 400], 1, 0);
        let local = t.local_scalars(&g);
        assert_eq!(local.len(), 2);
        assert!(local[1] < local[0] * 0.02, "{local:?}");
        let shared = [local[0] * 1.5, local[1] * 1.25];
        t.set_shared_scalars(&shared);
        let mut out = Vec::new();
        t.encode(&g, &mut out);
        let second = HEADER_LEN + 4 + packed_bytes(300, 2);
        assert_eq!(f32_at(&out, HEADER_LEN), shared[0]);
        assert_eq!(f32_at(&out, second), shared[1]);
        // The shared scales survive a state round trip.
        t.set_shared_scalars(&shared);
        let state = t.save_state();
        let mut u = TernGrad::new(0.0, &[300, 400], 1, 0);
        u.load_state(&state).unwrap();
        let mut out2 = Vec::new();
        u.encode(&g, &mut out2);
        assert_eq!(f32_at(&out2, second), shared[1]);
    }

    #[test]
    fn rejects_code_three_and_resumes_state() {
        let g = grad(100);
        let mut t = TernGrad::new(2.5, &[], 1, 0);
        let mut out = Vec::new();
        t.encode(&g, &mut out);
        let s = t.save_state();
        let mut bad = out.clone();
        bad[HEADER_LEN + 4] |= 3;
        let mut acc = vec![0.0; 100];
        assert!(t.decode_add(&bad, &mut acc).is_err());
        assert!(acc.iter().all(|&a| a == 0.0));
        let mut t2 = TernGrad::new(2.5, &[], 1, 0);
        t2.load_state(&s).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        t.encode(&g, &mut a);
        t2.encode(&g, &mut b);
        assert_eq!(a, b);
    }
}
