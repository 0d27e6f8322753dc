//! Top-k gradient dropping — Aji & Heafield, "Sparse Communication for Distributed Gradient
//! Descent", EMNLP 2017.
//!
//! Each step keeps the `k = ceil(ratio * n)` entries of largest magnitude of
//! `x = grad + residual` and sends them as (index, value) pairs; everything else stays in the
//! residual and is added to the next step's gradient (error feedback, `ef=true`, the default).
//! `scope=global` (default) takes one top-k over the whole flat gradient (the paper's global
//! threshold); `scope=tensor` takes `ceil(ratio * n_t)` per tensor of the build context's
//! layout. `values=fp16` rounds the sent values to IEEE half (the rounding error stays in the
//! residual).
//!
//! Selection: `select=sampled` (default) estimates the threshold from a sample (the paper's
//! ~0.1% sample), runs one fused pass `x = g + r; |x| > thr`, then cuts the few candidates to
//! exactly k (hierarchical re-selection, as in DGC): it sends exactly
//! `min(k, nnz(x))` pairs, the same set as `select=exact` up to the order of ties.
//! `select=exact` does a full `select_nth_unstable` over all magnitudes (slower; a reference).
//!
//! Scope through `gradwire train`: the engine gives all tensors of a `scope=global` policy one
//! codec whose layout is all of them (a selection unit, `gradwire-engine`'s `fusion` and
//! `worker` modules): one top-k over their concatenation per step, one sparse all-reduce
//! (`--sync auto`) or one all-gather (`--sync gather`), as in the paper. Only the quantized
//! ring (`--sync quantized`) selects per ring chunk (its codecs see one chunk each; the
//! engine warns). `scope=tensor` selects per tensor everywhere.
//!
//! What learns (LeNet / Fashion-MNIST, 4 workers, SGD lr 0.05, momentum 0.9, 5 epochs, seeds
//! 1 / 2 / 3; docs/fidelity.md has the commands and per-seed figures): the global threshold
//! ends at 87.46% mean in paper mode (momentum after aggregation; -1.07 against dense's 88.53
//! measured with the same binary) and 88.22% with `--momentum-correction on` (-0.31), at
//! 16.8-17.4x. Per-tensor selection (the engine before `8caf978`) ended 2.59 and 0.86 points
//! under dense; the parameter server's global threshold (`--sync ps-sync`) 0.86. The
//! char-LSTM (`lstm:hidden=128`, 24 epochs of 200 steps, release build of `2b3ce81`, 2026-12-02):
//! validation perplexity 5.56 in paper mode and 5.51 with momentum correction against dense's
//! 5.28 (+5.2% / +4.3%; over 1,200 steps it was +7.8%).
//!
//! Named option, off by default (`warmup_epochs=0`, as in the paper): `warmup_epochs=W`
//! borrows DGC's warm-up (Lin et al. 2018, section 3.4, the same schedule as
//! [`crate::DgcConfig::ratio_at`]): during epoch `e < W` (`e = floor(epoch)` from
//! [`Codec::set_progress`]) the kept fraction is `max(ratio, 0.25^(e+1))`, so 25%, 6.25%,
//! 1.5625%, then `ratio`. Aji & Heafield drop 99% from the first step.
//!
//! Wire layout (the shared sparse payload, little-endian):
//! ```text
//! 0..12   Header (codec id 6 = topk, element count n)
//! 12      index coding u8: 0 = plain u32, 1 = delta LEB128 varints (first index, then
//!         index - previous - 1); the encoder writes the shorter
//! 13      value coding u8: 0 = f32, 1 = f16
//! 14..16  reserved, zero
//! 16..24  nnz u64 (<= n)
//! 24..    nnz values (4 or 2 bytes each)
//! then    nnz strictly increasing indices (< n) in the index coding
//! ```
//! Size: `24 + k * (4 | 2) + index_bytes`, `index_bytes <= 4k` (about `2k` at ratio 0.1%).
//! Indices are u32, so a flat gradient may hold at most `u32::MAX` elements.

use std::fmt;

use crate::sparse::{
    decode_sparse_add, decode_sparse_pairs, exact_topk, finish_sampled, fit, k_for,
    load_rng_residual, save_rng_residual, scan_above, scan_add_into, write_selection,
    ThresholdEstimate, ValueFormat,
};
use crate::{
    segments, BuildContext, Caps, Codec, CodecId, ConfigError, DecodeError, Feedback, Params,
    Progress, SparseEncode, SparseGrad, StepRng,
};

/// How top-k finds its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopKSelect {
    /// Threshold from a sample, one fused pass, exact cut of the candidates (fast).
    Sampled,
    /// Full `select_nth_unstable` over all magnitudes (reference).
    Exact,
}

/// Over what top-k is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopKScope {
    /// One top-k over the whole flat gradient.
    Global,
    /// One top-k per tensor of the layout.
    Tensor,
}

/// Parameters of `topk:ratio=0.01[,select=sampled|exact][,scope=global|tensor]
/// [,values=fp32|fp16][,ef=true|false]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TopKConfig {
    /// Fraction of elements kept, in (0, 1] (default 0.01).
    pub ratio: f64,
    /// Threshold selection (default sampled).
    pub select: TopKSelect,
    /// Global or per-tensor (default global).
    pub scope: TopKScope,
    /// Value precision on the wire (default fp32).
    pub values: ValueFormat,
    /// Keep a residual of what was not sent (default true).
    pub ef: bool,
    /// Epochs of DGC's sparsity warm-up (default 0: none, as in the paper).
    pub warmup_epochs: usize,
}

impl Default for TopKConfig {
    fn default() -> Self {
        TopKConfig {
            ratio: 0.01,
            select: TopKSelect::Sampled,
            scope: TopKScope::Global,
            values: ValueFormat::Fp32,
            ef: true,
            warmup_epochs: 0,
        }
    }
}

impl TopKConfig {
    /// Reads `ratio`, `select`, `scope`, `values`, `ef`, `warmup_epochs`.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        let ratio = p.f64_in("ratio", Some(0.01), 1e-9, 1.0)?;
        let select = match p.choice("select", "sampled", &["sampled", "exact"])? {
            "exact" => TopKSelect::Exact,
            _ => TopKSelect::Sampled,
        };
        let scope = match p.choice("scope", "global", &["global", "tensor"])? {
            "tensor" => TopKScope::Tensor,
            _ => TopKScope::Global,
        };
        let values = ValueFormat::from_name(p.choice("values", "fp32", &["fp32", "fp16"])?);
        let ef = p.bool("ef", true)?;
        let warmup_epochs = p.usize_in("warmup_epochs", Some(0), 0, 1000)?;
        Ok(TopKConfig {
            ratio,
            select,
            scope,
            values,
            ef,
            warmup_epochs,
        })
    }

    /// The canonical `key=value,...` parameters (parse back to `self`).
    pub fn spec_params(&self) -> String {
        self.to_string()
    }

    /// The runtime codec.
    pub fn build(&self, ctx: &BuildContext) -> Box<dyn Codec> {
        Box::new(TopK::new(self.clone(), ctx))
    }

    /// The kept fraction at `epoch` (`ratio`, or the warm-up's while it lasts).
    pub fn ratio_at(&self, epoch: f32) -> f64 {
        crate::dgc::warmup_ratio(self.ratio, self.warmup_epochs, epoch)
    }
}

impl fmt::Display for TopKConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ratio={},select={},scope={},values={},ef={}",
            self.ratio,
            match self.select {
                TopKSelect::Sampled => "sampled",
                TopKSelect::Exact => "exact",
            },
            match self.scope {
                TopKScope::Global => "global",
                TopKScope::Tensor => "tensor",
            },
            self.values.name(),
            self.ef
        )?;
        // Written only when set, so that the paper's spec (and its run directories) stay
        // as they were before the option existed.
        if self.warmup_epochs > 0 {
            write!(f, ",warmup_epochs={}", self.warmup_epochs)?;
        }
        Ok(())
    }
}

/// The top-k codec (with its residual).
#[derive(Debug)]
pub struct TopK {
    cfg: TopKConfig,
    layout: Vec<usize>,
    rng: StepRng,
    residual: Vec<f32>,
    est: ThresholdEstimate,
    cand: Vec<u32>,
    scratch: Vec<u32>,
    sel: SparseGrad,
    /// The kept fraction this epoch (`cfg.ratio` after any warm-up).
    ratio: f64,
}

impl TopK {
    /// A top-k codec for `ctx` (its layout sets the tensors of `scope=tensor`).
    pub fn new(cfg: TopKConfig, ctx: &BuildContext) -> Self {
        TopK {
            layout: ctx.layout.clone(),
            rng: StepRng::new(ctx.seed, ctx.rank),
            residual: Vec::new(),
            est: ThresholdEstimate::default(),
            cand: Vec::new(),
            scratch: Vec::new(),
            sel: SparseGrad::default(),
            ratio: cfg.ratio_at(0.0),
            cfg,
        }
    }

    /// What was not sent yet (empty before the first encode or with `ef=false`).
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Selects this step's pairs into `out` and updates the residual.
    fn select(&mut self, grad: &[f32], out: &mut SparseGrad) {
        let n = grad.len();
        out.start(n, "top-k");
        let TopK {
            cfg,
            ratio,
            layout,
            rng,
            residual,
            est,
            cand,
            scratch,
            ..
        } = self;
        if cfg.ef {
            fit(residual, n);
        }
        let mut stream = rng.next_stream();
        let segs: Vec<_> = match cfg.scope {
            TopKScope::Global => std::iter::once(0..n).collect(),
            TopKScope::Tensor => segments(layout, n).collect(),
        };
        let vf = cfg.values;
        for seg in segs {
            let k = k_for(*ratio, seg.len());
            let base = seg.start as u32;
            let g = &grad[seg.clone()];
            cand.clear();
            if cfg.ef {
                let r = &mut residual[seg];
                match cfg.select {
                    TopKSelect::Exact => {
                        for (x, &y) in r.iter_mut().zip(g) {
                            *x += y;
                        }
                        exact_topk(r, k, scratch, cand);
                    }
                    TopKSelect::Sampled => {
                        let thr = est.first(g.len(), k, &mut stream, |i| g[i] + r[i]);
                        scan_add_into(g, r, thr, cand);
                        finish_sampled(r, k, est, cand, scratch);
                    }
                }
                for &i in cand.iter() {
                    let x = &mut r[i as usize];
                    let v = vf.round(*x);
                    *x -= v;
                    out.indices.push(base + i);
                    out.values.push(v);
                }
            } else {
                match cfg.select {
                    TopKSelect::Exact => exact_topk(g, k, scratch, cand),
                    TopKSelect::Sampled => {
                        let thr = est.first(g.len(), k, &mut stream, |i| g[i]);
                        scan_above(g, thr, cand);
                        finish_sampled(g, k, est, cand, scratch);
                    }
                }
                for &i in cand.iter() {
                    out.indices.push(base + i);
                    out.values.push(vf.round(g[i as usize]));
                }
            }
        }
    }
}

impl Codec for TopK {
    fn id(&self) -> CodecId {
        CodecId::TopK
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let mut sel = std::mem::take(&mut self.sel);
        self.select(grad, &mut sel);
        write_selection(out, CodecId::TopK, grad.len(), &sel, self.cfg.values);
        self.sel = sel;
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        decode_sparse_add(payload, CodecId::TopK, acc)
    }

    fn set_progress(&mut self, progress: Progress) {
        self.rng.set_step(progress.step);
        self.ratio = self.cfg.ratio_at(progress.epoch);
    }

    fn caps(&self) -> Caps {
        Caps::biased(Feedback::owned_if(self.cfg.ef))
    }

    fn sparse_encode(&mut self) -> Option<&mut dyn SparseEncode> {
        Some(self)
    }

    fn save_state(&self) -> Vec<u8> {
        save_rng_residual(CodecId::TopK, &self.rng, &self.residual)
    }

    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        load_rng_residual(state, CodecId::TopK, &mut self.rng, &mut self.residual)
    }
}

impl SparseEncode for TopK {
    fn encode_sparse(&mut self, grad: &[f32], out: &mut SparseGrad) {
        self.select(grad, out);
    }

    fn decode_pairs(
        &mut self,
        payload: &[u8],
        n: usize,
        out: &mut SparseGrad,
    ) -> Result<(), DecodeError> {
        decode_sparse_pairs(payload, CodecId::TopK, n, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparse::{index_bytes, reference_topk as reference, SPARSE_PREFIX};
    use crate::testing::{assert_conserves, assert_refuses_cuts, assert_resumes, config, refused};
    use crate::HEADER_LEN;

    fn grad(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                // Heavy-tailed, with a little structure by position.
                u * u * u * 8.0 + if i % 97 == 0 { 0.3 } else { 0.0 }
            })
            .collect()
    }

    fn codec(spec: &str, layout: Vec<usize>) -> TopK {
        TopK::new(
            config(spec, TopKConfig::parse),
            &BuildContext::new(7, 0, 1, layout),
        )
    }

    #[test]
    fn keeps_exactly_the_k_largest() {
        for spec in [
            "topk:ratio=0.001,select=exact,ef=false",
            "topk:ratio=0.001,select=sampled,ef=false",
            "topk:ratio=0.3,select=sampled,ef=false",
        ] {
            let n = 120_000;
            let g = grad(n, 1);
            let mut c = codec(spec, vec![]);
            let mut s = SparseGrad::default();
            assert!(c.sparse_encode().is_some());
            c.encode_sparse(&g, &mut s);
            let k = k_for(c.cfg.ratio, n);
            assert_eq!(s.indices, reference(&g, k), "{spec}");
            assert!(s
                .indices
                .iter()
                .zip(&s.values)
                .all(|(&i, &v)| g[i as usize] == v));
            // encode agrees with encode_sparse.
            let mut c2 = codec(spec, vec![]);
            let mut out = Vec::new();
            c2.encode(&g, &mut out);
            let mut acc = vec![0.0; n];
            c2.decode_add(&out, &mut acc).unwrap();
            let mut dense = vec![0.0; n];
            for (&i, &v) in s.indices.iter().zip(&s.values) {
                dense[i as usize] = v;
            }
            assert_eq!(acc, dense);
        }
    }

    #[test]
    fn sampled_sends_exactly_k_and_tensor_scope_per_tensor() {
        // Stated tolerance of sampled mode: exactly min(k, nonzeros) pairs, same set as exact.
        let layout = vec![50_000, 100, 30_000, 7];
        let n: usize = layout.iter().sum();
        let g = grad(n, 9);
        let mut c = codec("topk:ratio=0.01,scope=tensor,ef=false", layout.clone());
        let mut s = SparseGrad::default();
        c.encode_sparse(&g, &mut s);
        let mut want = Vec::new();
        let mut start = 0;
        for &len in &layout {
            let k = k_for(0.01, len);
            want.extend(
                reference(&g[start..start + len], k)
                    .into_iter()
                    .map(|i| i + start as u32),
            );
            start += len;
        }
        assert_eq!(s.indices, want);
        // Fewer non-zeros than k: all of them, nothing else.
        let mut z = vec![0.0f32; 40_000];
        z[5] = 1.0;
        z[39_999] = -2.0;
        let mut c = codec("topk:ratio=0.01,ef=false", vec![]);
        c.encode_sparse(&z, &mut s);
        assert_eq!(s.indices, vec![5, 39_999]);
    }

    #[test]
    fn error_feedback_conserves_the_signal() {
        for spec in [
            "topk:ratio=0.01",
            "topk:ratio=0.05,values=fp16,scope=tensor",
        ] {
            let n = 30_000;
            let mut c = codec(spec, vec![10_000, 20_000]);
            let grads = (0..4).map(|step| grad(n, 100 + step));
            assert_conserves(&mut c, TopK::residual, grads, 1e-6);
        }
    }

    #[test]
    fn compression_ratio_matches_the_formula() {
        let n = 100_000;
        let g = grad(n, 3);
        for (spec, vb) in [("topk:ratio=0.01", 4), ("topk:ratio=0.01,values=fp16", 2)] {
            let mut c = codec(spec, vec![]);
            let mut out = Vec::new();
            c.encode(&g, &mut out);
            let k = 1000;
            assert_eq!(
                out.len(),
                SPARSE_PREFIX + k * vb + index_bytes(&c.sel.indices)
            );
            assert_eq!(out[HEADER_LEN], 1, "delta indices are shorter here");
            // Independent count of the varint bytes.
            let mut prev = None;
            let mut idx_bytes = 0;
            for &i in &c.sel.indices {
                let gap = match prev {
                    None => i,
                    Some(p) => i - p - 1,
                };
                prev = Some(i);
                idx_bytes += 1 + (32 - gap.leading_zeros().min(31) as usize - 1) / 7;
            }
            assert_eq!(out.len(), 24 + k * vb + idx_bytes);
            assert!(out.len() <= 24 + k * (vb + 4));
        }
    }

    #[test]
    fn state_resumes_exactly() {
        let n = 50_000;
        let mut a = codec("topk:ratio=0.002", vec![]);
        let mut out = Vec::new();
        for s in 0..3 {
            a.set_progress(Progress {
                step: s,
                epoch: 0.0,
            });
            a.encode(&grad(n, s), &mut out);
        }
        let mut b = codec("topk:ratio=0.002", vec![]);
        let st = assert_resumes(&mut a, &mut b, (3..6).map(|s| grad(n, s)));
        assert!(b.load_state(&st[..st.len() - 1]).is_err());
        assert!(b.load_state(b"junk").is_err());
    }

    #[test]
    fn decoder_rejects_malformed() {
        let n = 1000;
        let mut c = codec("topk:ratio=0.01", vec![]);
        let mut out = Vec::new();
        c.encode(&grad(n, 4), &mut out);
        assert_refuses_cuts(&c, &out, n);
        assert!(matches!(
            refused(&c, &out, n - 1),
            DecodeError::LengthMismatch { .. }
        ));
        let mut bad = out.clone();
        bad[3] = CodecId::Dgc as u8;
        assert!(matches!(
            refused(&c, &bad, n),
            DecodeError::WrongCodec { .. }
        ));
    }

    #[test]
    fn spec_round_trips() {
        let c = codec("topk:ratio=0.001,values=fp16,scope=tensor", vec![]);
        let s = c.cfg.spec_params();
        assert_eq!(
            s,
            "ratio=0.001,select=sampled,scope=tensor,values=fp16,ef=true"
        );
        assert_eq!(config(&format!("topk:{s}"), TopKConfig::parse), c.cfg);
        let mut p = Params::parse("topk:ratio=0").unwrap();
        assert!(TopKConfig::parse(&mut p).is_err());
        // The warm-up shows only when set, and round-trips.
        let c = codec("topk:warmup_epochs=3", vec![]);
        let s = c.cfg.spec_params();
        assert_eq!(
            s,
            "ratio=0.01,select=sampled,scope=global,values=fp32,ef=true,warmup_epochs=3"
        );
        assert_eq!(config(&format!("topk:{s}"), TopKConfig::parse), c.cfg);
    }

    #[test]
    fn warmup_sends_dgc_sparsities_then_the_ratio() {
        // DGC's schedule (Lin et al. 2018, section 3.4), written out: 25%, 6.25%, 1.5625%,
        // then the ratio; with no warm-up the ratio from the first step.
        let n = 4096;
        let g = grad(n, 11);
        for (spec, want) in [
            ("topk:ratio=0.01,warmup_epochs=3", [1024, 256, 64, 41, 41]),
            ("topk:ratio=0.01", [41, 41, 41, 41, 41]),
            ("topk:ratio=0.1,warmup_epochs=4", [1024, 410, 410, 410, 410]),
        ] {
            let mut c = codec(spec, vec![]);
            for (epoch, &k) in want.iter().enumerate() {
                c.set_progress(Progress {
                    step: epoch as u64 * 10,
                    epoch: epoch as f32 + 0.5,
                });
                let mut out = SparseGrad::default();
                c.encode_sparse(&g, &mut out);
                assert_eq!(out.indices.len(), k, "{spec}, epoch {epoch}");
            }
        }
    }
}
