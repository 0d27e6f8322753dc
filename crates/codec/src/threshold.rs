//! Threshold quantization — Strom, "Scalable Distributed DNN Training Using Commodity GPU Cloud
//! Computing", INTERSPEECH 2015.
//!
//! A fixed threshold `tau` and a per-weight residual `r`: each step `r += g`; every element with
//! `r > tau` sends `+tau` (and `r -= tau`), every element with `r < -tau` sends `-tau` (and
//! `r += tau`); the rest sends nothing. Values are implicit, so only index and sign travel.
//!
//! As in the paper, messages are unbounded by default (a too small `tau` sends everything).
//! The named option `max_ratio=f` (< 1) caps them at `ceil(f * n)` elements per step: when
//! more qualify, those of largest `|r|` are sent and the others stay in the residual (the
//! bound Dryden 2016 adds for the same reason). `max_ratio=1` (the default) is no cap.
//!
//! Units of `tau`: the codec thresholds what it is given, this rank's gradient (of its local
//! mean loss, before the learning rate), accumulated in the residual. Each element sent stands
//! for `+-tau`; the compressed all-reduces sum the ranks' messages, and with `Reduce::Mean`
//! divide by `P`, so one sent element moves the applied gradient by `tau / P` (by `tau` with
//! `Reduce::Sum`), and the weight by `lr * tau / P`. Strom's `tau` is on the weight update
//! every node applies from every peer's message (summed, not averaged): a paper value
//! `tau_update` corresponds here to `tau = tau_update / lr` with `Reduce::Sum`, or
//! `tau = P * tau_update / lr` with `Reduce::Mean`.
//!
//! Wire layout (little-endian):
//! ```text
//! 0..12   Header (codec id 4 = threshold, element count n)
//! 12..16  tau f32 (finite, > 0)
//! 16..24  count u64 (<= n)
//! 24..    count words, (index << 1) | sign (sign 1 = -tau), indices strictly increasing, < n:
//!           u32 words when n <= 2^31, u64 words when the tensor has more elements
//! ```
//! Size: `24 + 4 * count` bytes (`8 * count` above 2^31 elements). The encoder selects with
//! u32 indices, so it takes at most `u32::MAX` elements; the decoder reads both word widths.

use std::fmt;

use crate::sparse::{
    check_len, check_next, cut_to_k, fit, index_of, is_negative, k_for, key, put_words, read_count,
    read_positive_f32, scan_add_into, word_at, word_bytes,
};
use crate::{
    BuildContext, Caps, Codec, CodecId, ConfigError, DecodeError, Feedback, Header, Params,
    SparseEncode, SparseGrad, StateReader, StateWriter, HEADER_LEN,
};

/// Parameters of `threshold:tau=0.01[,max_ratio=1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ThresholdConfig {
    /// The threshold, > 0 (required).
    pub tau: f64,
    /// Most elements sent per step, as a fraction of the gradient (default 1: no cap, as in
    /// the paper).
    pub max_ratio: f64,
}

impl ThresholdConfig {
    /// Reads `tau` and `max_ratio`.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        let tau = p.f64_in("tau", None, 1e-30, f32::MAX as f64)?;
        let max_ratio = p.f64_in("max_ratio", Some(1.0), 1e-9, 1.0)?;
        Ok(ThresholdConfig { tau, max_ratio })
    }

    /// The canonical `key=value,...` parameters (parse back to `self`).
    pub fn spec_params(&self) -> String {
        self.to_string()
    }

    /// The runtime codec.
    pub fn build(&self, _ctx: &BuildContext) -> Box<dyn Codec> {
        Box::new(Threshold::new(self.clone()))
    }
}

impl fmt::Display for ThresholdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tau={},max_ratio={}", self.tau, self.max_ratio)
    }
}

/// A validated threshold payload: `tau` and its words (indices checked: strictly increasing,
/// below the element count).
struct Words<'a> {
    tau: f32,
    width: usize,
    count: usize,
    words: &'a [u8],
}

impl<'a> Words<'a> {
    /// Checks every field of `payload` (for `n` elements) and every word's index.
    fn parse(payload: &'a [u8], n: usize) -> Result<Self, DecodeError> {
        Header::check(payload, CodecId::Threshold, n)?;
        let tau = read_positive_f32(payload, HEADER_LEN, "tau")?;
        let count = read_count(
            payload,
            HEADER_LEN + 4,
            n,
            "count",
            "more words than elements",
        )?;
        let width = word_bytes(n);
        check_len(HEADER_LEN + 12 + width * count, payload.len())?;
        let words = &payload[HEADER_LEN + 12..];
        let mut next = 0u64;
        for j in 0..count {
            next = check_next(index_of(word_at(words, width, j)), next, n)?;
        }
        Ok(Words {
            tau,
            width,
            count,
            words,
        })
    }

    /// Each word's index and value (`tau` or `-tau` as its sign says), in order.
    fn pairs(&self) -> impl Iterator<Item = (usize, f32)> + '_ {
        (0..self.count).map(|j| {
            let x = word_at(self.words, self.width, j);
            let v = if is_negative(x) { -self.tau } else { self.tau };
            (index_of(x) as usize, v)
        })
    }
}

/// Strom's threshold codec (with its residual).
#[derive(Debug)]
pub struct Threshold {
    cfg: ThresholdConfig,
    tau: f32,
    residual: Vec<f32>,
    cand: Vec<u32>,
    scratch: Vec<u32>,
    sel: SparseGrad,
}

impl Threshold {
    /// A threshold codec.
    pub fn new(cfg: ThresholdConfig) -> Self {
        Threshold {
            tau: cfg.tau as f32,
            cfg,
            residual: Vec::new(),
            cand: Vec::new(),
            scratch: Vec::new(),
            sel: SparseGrad::default(),
        }
    }

    /// What was not sent yet.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Adds `grad` into the residual, picks the elements to send (increasing indices, values
    /// `+-tau`) into `out` and takes them off the residual.
    fn select(&mut self, grad: &[f32], out: &mut SparseGrad) {
        let n = grad.len();
        out.start(n, "threshold");
        fit(&mut self.residual, n);
        self.cand.clear();
        scan_add_into(grad, &mut self.residual, key(self.tau), &mut self.cand);
        let cap = k_for(self.cfg.max_ratio, n);
        cut_to_k(&self.residual, cap, &mut self.cand, &mut self.scratch);
        for &i in &self.cand {
            let r = &mut self.residual[i as usize];
            let v = self.tau.copysign(*r);
            *r -= v;
            out.indices.push(i);
            out.values.push(v);
        }
    }
}

impl Codec for Threshold {
    fn id(&self) -> CodecId {
        CodecId::Threshold
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let mut sel = std::mem::take(&mut self.sel);
        self.select(grad, &mut sel);
        let n = grad.len();
        Header::write(out, CodecId::Threshold, n);
        out.reserve(12 + word_bytes(n) * sel.indices.len());
        out.extend_from_slice(&self.tau.to_le_bytes());
        out.extend_from_slice(&(sel.indices.len() as u64).to_le_bytes());
        let signs = sel.values.iter().map(|v| v.is_sign_negative());
        put_words(out, n, sel.indices.iter().copied().zip(signs));
        self.sel = sel;
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let words = Words::parse(payload, acc.len())?;
        for (index, v) in words.pairs() {
            acc[index] += v;
        }
        Ok(())
    }

    fn caps(&self) -> Caps {
        Caps::biased(Feedback::Owned)
    }

    fn sparse_encode(&mut self) -> Option<&mut dyn SparseEncode> {
        Some(self)
    }

    fn save_state(&self) -> Vec<u8> {
        StateWriter::new(CodecId::Threshold)
            .f32s(&self.residual)
            .finish()
    }

    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        let mut r = StateReader::new(state, CodecId::Threshold)?;
        let residual = r.f32s()?;
        r.finish()?;
        self.residual = residual;
        Ok(())
    }
}

impl SparseEncode for Threshold {
    fn encode_sparse(&mut self, grad: &[f32], out: &mut SparseGrad) {
        self.select(grad, out);
    }

    /// The payload's words as pairs: `encode_sparse` gives `tau` with the residual's sign,
    /// which is what a word's sign bit says.
    fn decode_pairs(
        &mut self,
        payload: &[u8],
        n: usize,
        out: &mut SparseGrad,
    ) -> Result<(), DecodeError> {
        out.start_pairs(n)?;
        let words = Words::parse(payload, n)?;
        out.indices.reserve_exact(words.count);
        out.values.reserve_exact(words.count);
        for (index, v) in words.pairs() {
            // Below `n`, which fits u32 (`start_pairs`).
            out.indices.push(index as u32);
            out.values.push(v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_refuses_cuts, assert_resumes, config, patched, refused};

    fn codec(spec: &str) -> Threshold {
        Threshold::new(config(spec, ThresholdConfig::parse))
    }

    fn grad(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| (((i ^ seed).wrapping_mul(2654435761) >> 8) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// The paper's default: no cap; every element beyond tau is sent.
    #[test]
    fn uncapped_by_default_capped_when_asked() {
        let g = grad(10_000, 1);
        let beyond = g.iter().filter(|x| x.abs() > 0.1).count();
        assert!(beyond > 5000);
        let mut s = SparseGrad::default();
        let mut c = codec("threshold:tau=0.1");
        assert_eq!(c.cfg.to_string(), "tau=0.1,max_ratio=1");
        c.select(&g, &mut s);
        assert_eq!(s.indices.len(), beyond);
        let mut c = codec("threshold:tau=0.1,max_ratio=0.01");
        c.select(&g, &mut s);
        assert_eq!(s.indices.len(), 100);
    }

    #[test]
    fn sends_plus_minus_tau_and_keeps_the_rest() {
        let mut c = codec("threshold:tau=0.5,max_ratio=1");
        let g = [0.6f32, -0.7, 0.2, -0.1, 1.7, 0.0];
        let mut out = Vec::new();
        c.encode(&g, &mut out);
        assert_eq!(out.len(), 24 + 4 * 3, "size formula");
        let mut acc = vec![0.0; 6];
        c.decode_add(&out, &mut acc).unwrap();
        assert_eq!(acc, vec![0.5, -0.5, 0.0, 0.0, 0.5, 0.0]);
        let want = [0.1f32, -0.2, 0.2, -0.1, 1.2, 0.0];
        for (r, w) in c.residual().iter().zip(want) {
            assert!((r - w).abs() < 1e-6);
        }
        // Next step with a zero gradient: only the element still above tau goes.
        let mut s = SparseGrad::default();
        c.encode_sparse(&[0.0; 6], &mut s);
        assert_eq!(s.indices, vec![4]);
        assert_eq!(s.values, vec![0.5]);
    }

    #[test]
    fn caps_the_message_and_conserves_the_signal() {
        let n = 10_000;
        let mut c = codec("threshold:tau=0.1,max_ratio=0.01");
        let mut before = vec![0.0f32; n];
        let mut out = Vec::new();
        for s in 0..3 {
            let g = grad(n, s);
            c.encode(&g, &mut out);
            assert_eq!(out.len(), 24 + 4 * 100, "capped at 1% of 10k");
            let mut sent = vec![0.0; n];
            c.decode_add(&out, &mut sent).unwrap();
            // The sent ones are the largest |x| of this step.
            let x: Vec<f32> = g.iter().zip(&before).map(|(a, b)| a + b).collect();
            let min_sent = (0..n)
                .filter(|&i| sent[i] != 0.0)
                .map(|i| x[i].abs())
                .fold(f32::INFINITY, f32::min);
            let max_kept = (0..n)
                .filter(|&i| sent[i] == 0.0)
                .map(|i| x[i].abs())
                .fold(0.0, f32::max);
            assert!(min_sent >= max_kept);
            for i in 0..n {
                assert!((sent[i] + c.residual()[i] - x[i]).abs() < 1e-5);
                assert!(sent[i] == 0.0 || sent[i].abs() == 0.1f32);
            }
            before = c.residual().to_vec();
        }
        let mut d = codec("threshold:tau=0.1,max_ratio=0.01");
        assert_resumes(&mut c, &mut d, [grad(n, 7)]);
    }

    #[test]
    fn decoder_rejects_malformed() {
        let n = 100;
        let mut c = codec("threshold:tau=0.2,max_ratio=1");
        let mut out = Vec::new();
        c.encode(&grad(n, 3), &mut out);
        assert!(out.len() > 32);
        assert_refuses_cuts(&c, &out, n);
        let nan = patched(&out, HEADER_LEN, &f32::NAN.to_le_bytes());
        assert!(matches!(
            refused(&c, &nan, n),
            DecodeError::InvalidField { field: "tau", .. }
        ));
        let at = out.len() - 4;
        let beyond = patched(&out, at, &(200u32 << 1).to_le_bytes());
        assert!(matches!(
            refused(&c, &beyond, n),
            DecodeError::IndexOutOfRange { index: 200, .. }
        ));
        let repeated = patched(&out, at, &0u32.to_le_bytes());
        assert!(matches!(
            refused(&c, &repeated, n),
            DecodeError::InvalidField { field: "index", .. }
        ));
        let mut bad = patched(&out, HEADER_LEN + 4, &(1u64 << 62).to_le_bytes());
        refused(&c, &bad, n);
        bad.push(1);
        refused(&c, &bad, n);
        let spec = format!("threshold:{}", c.cfg.spec_params());
        assert_eq!(config(&spec, ThresholdConfig::parse), c.cfg);
        assert!(Params::parse("threshold")
            .and_then(|mut p| ThresholdConfig::parse(&mut p))
            .is_err());
    }
}
