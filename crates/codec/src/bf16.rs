//! `bf16`: bfloat16 (the top 16 bits of an f32), round to nearest even (PyTorch's
//! `bf16_compress_hook`).
//!
//! Wire layout: the 12-byte [`crate::Header`] (codec 2), then `count` little-endian `u16`
//! bfloat16 bit patterns (bytes `12 + 2i .. 14 + 2i` hold element `i`). Same exponent range as
//! f32, 8 bits of mantissa. NaNs stay (quiet) NaNs. Ratio: 2. The conversion is branch-free
//! integer arithmetic that the compiler vectorizes.

use crate::simd::multiversion;
use crate::{Codec, CodecId, DecodeError, Header};

const BLOCK: usize = 2048;

/// f32 to bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
#[inline(always)]
pub(crate) fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    (if nan { (b >> 16) | 0x40 } else { rounded }) as u16
}

/// bfloat16 bits to f32 (exact).
#[inline(always)]
pub(crate) fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

multiversion! {
    fn encode_bf16(grad: &[f32], body: &mut [u8]) {
        let mut buf = [0u16; BLOCK];
        for (src, dst) in grad.chunks(BLOCK).zip(body.chunks_mut(BLOCK * 2)) {
            let b = &mut buf[..src.len()];
            for (h, x) in b.iter_mut().zip(src) {
                *h = to_bf16(*x);
            }
            dst.copy_from_slice(bytemuck::cast_slice(b));
        }
    }
}

multiversion! {
    fn add_bf16(body: &[u8], acc: &mut [f32]) {
        let mut bits = [0u16; BLOCK];
        for (src, a) in body.chunks(BLOCK * 2).zip(acc.chunks_mut(BLOCK)) {
            let b = &mut bits[..a.len()];
            bytemuck::cast_slice_mut::<u16, u8>(b).copy_from_slice(src);
            for (a, h) in a.iter_mut().zip(b.iter()) {
                *a += from_bf16(*h);
            }
        }
    }
}

/// Casts to bfloat16.
#[derive(Debug, Clone, Default)]
pub struct Bf16;

impl Codec for Bf16 {
    fn id(&self) -> CodecId {
        CodecId::Bf16
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let body = Header::write_sized(out, CodecId::Bf16, grad.len(), grad.len() * 2);
        encode_bf16(grad, body);
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let body = Header::check(payload, CodecId::Bf16, acc.len())?;
        crate::layout::expect_len(body, acc.len() * 2)?;
        add_bf16(body, acc);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HEADER_LEN;

    #[test]
    fn rounds_to_nearest_even_like_half() {
        let vals = [
            0.0f32,
            -0.0,
            1.0,
            f32::from_bits(0x3F80_8000), // halfway between two bf16, even below
            f32::from_bits(0x3F81_8000), // halfway, even above
            std::f32::consts::PI,
            -2.7e-30,
            f32::MAX,
            f32::INFINITY,
            f32::MIN_POSITIVE / 3.0,
        ];
        for v in vals {
            assert_eq!(to_bf16(v), half::bf16::from_f32(v).to_bits(), "{v}");
        }
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        for i in 0..100_000u32 {
            let v = f32::from_bits(i.wrapping_mul(2654435761));
            if !v.is_nan() {
                assert_eq!(to_bf16(v), half::bf16::from_f32(v).to_bits(), "{v}");
            }
        }
    }

    #[test]
    fn round_trip() {
        let g: Vec<f32> = (0..3000).map(|i| ((i as f32) * 0.37).cos() * 1e5).collect();
        let mut c = Bf16;
        let mut out = Vec::new();
        c.encode(&g, &mut out);
        assert_eq!(out.len(), HEADER_LEN + 6000);
        let mut acc = vec![0.0; 3000];
        c.decode_add(&out, &mut acc).unwrap();
        for (a, x) in acc.iter().zip(&g) {
            assert_eq!(*a, half::bf16::from_f32(*x).to_f32());
        }
    }
}
