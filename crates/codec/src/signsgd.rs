//! `signsgd`: scaled sign compression with error feedback, EF-signSGD (Karimireddy, Rebjock,
//! Stich, Jaggi, "Error Feedback Fixes SignSGD and other Gradient Compression Schemes",
//! ICML 2019).
//!
//! Each tensor `x` of `d` elements is sent as `(||x||_1 / d) * sign(x)`; the scale makes the
//! compressor a contraction, and error feedback (the spec default, `ef=true`) restores the
//! convergence that plain signSGD loses. `x >= 0` counts as positive.
//!
//! Wire layout: the 12-byte [`crate::Header`] (codec 11), then for each tensor of the layout
//! (or the whole gradient when the layout does not match), of `d` elements:
//! ```text
//! 0..4                scale f32  ||x||_1 / d  (0 for an empty tensor)
//! 4..4+4*ceil(d/32)   sign bits, 32 per u32 word, lane-packed as in `onebit` (1 = +scale)
//! ```
//! Ratio: `32 d / (d + 32)`.

use std::fmt;

use crate::layout::{expect_len, f32_at, finite, segments};
use crate::pack::{pack, packed_bytes, unpack_add};
use crate::simd::multiversion;
use crate::{
    BuildContext, Codec, CodecId, ConfigError, DecodeError, FeedbackEncode, Header, Params,
};

/// Parameters of EF-signSGD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignSgdConfig {
    /// Error feedback (default on).
    pub ef: bool,
}

impl Default for SignSgdConfig {
    fn default() -> Self {
        SignSgdConfig { ef: true }
    }
}

impl SignSgdConfig {
    /// Reads `ef=`.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        Ok(SignSgdConfig {
            ef: p.bool("ef", true)?,
        })
    }

    /// The runtime codec.
    pub fn build(&self, ctx: &BuildContext) -> Box<dyn Codec> {
        crate::feedback::maybe_wrap(SignSgd::new(&ctx.layout), self.ef)
    }
}

impl fmt::Display for SignSgdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ef={}", self.ef)
    }
}

/// Scaled sign compressor (without error feedback; wrap it in [`crate::ErrorFeedback`]).
#[derive(Debug, Clone)]
pub struct SignSgd {
    layout: Vec<usize>,
}

#[inline(always)]
fn l1(x: &[f32]) -> f32 {
    const L: usize = 16;
    let mut s = [0f32; L];
    let mut it = x.chunks_exact(L);
    for c in &mut it {
        for l in 0..L {
            s[l] += c[l].abs();
        }
    }
    s.iter().sum::<f32>() + it.remainder().iter().map(|v| v.abs()).sum::<f32>()
}

impl SignSgd {
    /// A scaled-sign compressor over the tensors of `layout`.
    pub fn new(layout: &[usize]) -> Self {
        SignSgd {
            layout: layout.to_vec(),
        }
    }

    fn body_len(&self, n: usize) -> usize {
        segments(&self.layout, n)
            .map(|s| 4 + packed_bytes(s.len(), 1))
            .sum()
    }
}

/// Writes one tensor (scale and sign bits) into `dst`; returns the scale.
#[inline(always)]
fn encode_tensor(x: &[f32], dst: &mut [u8]) -> f32 {
    let d = x.len();
    let scale = if d > 0 { l1(x) / d as f32 } else { 0.0 };
    dst[..4].copy_from_slice(&scale.to_le_bytes());
    pack::<1>(x, 0, &mut dst[4..], |v, _| (v >= 0.0) as u32);
    scale
}

multiversion! {
    fn encode_all(layout: &[usize], grad: &[f32], body: &mut [u8]) {
        let mut at = 0;
        for s in segments(layout, grad.len()) {
            let len = 4 + packed_bytes(s.len(), 1);
            encode_tensor(&grad[s], &mut body[at..at + len]);
            at += len;
        }
    }
}

multiversion! {
    fn encode_fb(layout: &[usize], grad: &[f32], residual: &mut [f32], body: &mut [u8]) {
        let mut at = 0;
        for s in segments(layout, grad.len()) {
            let len = 4 + packed_bytes(s.len(), 1);
            let r = &mut residual[s.clone()];
            for (r, g) in r.iter_mut().zip(&grad[s]) {
                *r += g;
            }
            let scale = encode_tensor(r, &mut body[at..at + len]);
            for v in r.iter_mut() {
                *v -= if *v >= 0.0 { scale } else { -scale };
            }
            at += len;
        }
    }
}

multiversion! {
    fn decode_all(layout: &[usize], body: &[u8], acc: &mut [f32]) {
        let mut at = 0;
        for s in segments(layout, acc.len()) {
            let len = 4 + packed_bytes(s.len(), 1);
            let scale = f32_at(body, at);
            unpack_add::<1>(&body[at + 4..at + len], &mut acc[s], |b| {
                if b != 0 {
                    scale
                } else {
                    -scale
                }
            });
            at += len;
        }
    }
}

impl Codec for SignSgd {
    fn id(&self) -> CodecId {
        CodecId::SignSgd
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let body_len = self.body_len(grad.len());
        let body = Header::write_sized(out, CodecId::SignSgd, grad.len(), body_len);
        encode_all(&self.layout, grad, body);
    }

    fn feedback_encode(&mut self) -> Option<&mut dyn FeedbackEncode> {
        Some(self)
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let body = Header::check(payload, CodecId::SignSgd, acc.len())?;
        expect_len(body, self.body_len(acc.len()))?;
        let mut at = 0;
        for s in segments(&self.layout, acc.len()) {
            finite(f32_at(body, at), "signsgd scale")?;
            at += 4 + packed_bytes(s.len(), 1);
        }
        decode_all(&self.layout, body, acc);
        Ok(())
    }
}

impl FeedbackEncode for SignSgd {
    fn encode_feedback(&mut self, grad: &[f32], residual: &mut [f32], out: &mut Vec<u8>) {
        let body_len = self.body_len(grad.len());
        let body = Header::write_sized(out, CodecId::SignSgd, grad.len(), body_len);
        encode_fb(&self.layout, grad, residual, body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HEADER_LEN;

    #[test]
    fn scaled_signs_and_ratio() {
        let g: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.7).sin()).collect();
        let mut c = SignSgd::new(&[400, 600]);
        let mut out = Vec::new();
        c.encode(&g, &mut out);
        assert_eq!(out.len(), HEADER_LEN + 4 + 52 + 4 + 76);
        let mut d = vec![0.0; 1000];
        c.decode_add(&out, &mut d).unwrap();
        let s0 = g[..400].iter().map(|v| v.abs()).sum::<f32>() / 400.0;
        for i in 0..400 {
            assert!((d[i].abs() - s0).abs() < 1e-6);
            assert_eq!(d[i] >= 0.0, g[i] >= 0.0);
        }
    }
}
