//! `fp16`: IEEE 754 binary16, round to nearest even (the cast of PyTorch's
//! `fp16_compress_hook` and Horovod's `Compression.fp16`).
//!
//! Wire layout: the 12-byte [`crate::Header`] (codec 1), then `count` little-endian `u16`
//! binary16 bit patterns (bytes `12 + 2i .. 14 + 2i` hold element `i`). Values beyond
//! ±65504 become ±inf, as with every fp16 cast; scale gradients first if they can be that
//! large. Ratio: 2. Conversion uses the `half` crate's slice routines (F16C when the CPU has
//! it, detected at run time) on stack blocks.

use half::{f16, slice::HalfFloatSliceExt};

use crate::simd::multiversion;
use crate::{Codec, CodecId, DecodeError, Header};

/// Elements converted per stack block.
const BLOCK: usize = 2048;

/// Casts to IEEE half precision.
#[derive(Debug, Clone, Default)]
pub struct Fp16;

impl Codec for Fp16 {
    fn id(&self) -> CodecId {
        CodecId::Fp16
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let body = Header::write_sized(out, CodecId::Fp16, grad.len(), grad.len() * 2);
        let mut buf = [f16::ZERO; BLOCK];
        for (src, dst) in grad.chunks(BLOCK).zip(body.chunks_mut(BLOCK * 2)) {
            let b = &mut buf[..src.len()];
            b.convert_from_f32_slice(src);
            let bits: &[u16] = half::slice::HalfFloatSliceExt::reinterpret_cast(&*b);
            dst.copy_from_slice(bytemuck::cast_slice(bits));
        }
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let body = Header::check(payload, CodecId::Fp16, acc.len())?;
        crate::layout::expect_len(body, acc.len() * 2)?;
        add_fp16(body, acc);
        Ok(())
    }
}

/// binary16 bits to f32, exactly (branch-free, so it vectorizes): the exponent and
/// mantissa shifted into place and scaled by 2^112 (exact, also for subnormals); infinities
/// and NaNs get the f32 all-ones exponent.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let em = h & 0x7fff;
    let scaled = (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits();
    let bits = if em >= 0x7c00 {
        (em << 13) | 0x7f80_0000
    } else {
        scaled
    };
    f32::from_bits(bits | ((h & 0x8000) << 16))
}

multiversion! {
    fn add_fp16(body: &[u8], acc: &mut [f32]) {
        for (a, c) in acc.iter_mut().zip(body.chunks_exact(2)) {
            *a += f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HEADER_LEN;

    #[test]
    fn f16_to_f32_is_exact_for_every_pattern() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#x}");
            }
        }
    }

    #[test]
    fn round_trip_within_half_ulp() {
        let g: Vec<f32> = (0..5000).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        let mut c = Fp16;
        let mut out = Vec::new();
        c.encode(&g, &mut out);
        assert_eq!(out.len(), HEADER_LEN + 10_000);
        let mut acc = vec![1.0; 5000];
        c.decode_add(&out, &mut acc).unwrap();
        for (a, x) in acc.iter().zip(&g) {
            assert_eq!(a - 1.0, f16::from_f32(*x).to_f32() + 1.0 - 1.0);
            assert!((a - 1.0 - x).abs() <= x.abs() * 1e-3 + 1e-7);
        }
    }
}
