//! `none`: the uncompressed baseline, fp32 on the wire.
//!
//! Wire layout: the 12-byte [`crate::Header`] (codec 0), then `count` little-endian `f32`
//! (bytes `12 + 4i .. 16 + 4i` hold element `i`). Ratio: exactly 1 (plus the header).

use crate::{Caps, Codec, CodecId, DecodeError, FeedbackEncode, Header, HEADER_LEN};

/// Sends fp32 values unchanged.
#[derive(Debug, Clone, Default)]
pub struct Fp32;

impl Codec for Fp32 {
    fn id(&self) -> CodecId {
        CodecId::None
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        Header::write(out, CodecId::None, grad.len());
        out.extend_from_slice(bytemuck::cast_slice(grad));
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let body = Header::check(payload, CodecId::None, acc.len())?;
        crate::layout::expect_len(body, acc.len() * 4)?;
        crate::layout::add_f32_le(body, acc);
        Ok(())
    }

    /// Lossless, so unbiased; a fused kernel for `none:ef=true`.
    fn caps(&self) -> Caps {
        Caps::UNBIASED
    }

    fn feedback_encode(&mut self) -> Option<&mut dyn FeedbackEncode> {
        Some(self)
    }
}

impl FeedbackEncode for Fp32 {
    fn encode_feedback(&mut self, grad: &[f32], residual: &mut [f32], out: &mut Vec<u8>) {
        Header::write(out, CodecId::None, grad.len());
        out.reserve(grad.len() * 4);
        for (g, r) in grad.iter().zip(residual.iter_mut()) {
            out.extend_from_slice(&(g + *r).to_le_bytes());
            *r = 0.0;
        }
        debug_assert_eq!(out.len(), HEADER_LEN + grad.len() * 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_round_trip() {
        let g: Vec<f32> = (0..1000).map(|i| (i as f32).sin() * 1e3).collect();
        let mut c = Fp32;
        let mut out = Vec::new();
        c.encode(&g, &mut out);
        assert_eq!(out.len(), HEADER_LEN + 4000);
        let mut acc = vec![0.0; 1000];
        c.decode_add(&out, &mut acc).unwrap();
        assert_eq!(acc, g);
        assert!(c.decode_add(&out[..out.len() - 1], &mut acc).is_err());
    }
}
