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
use crate::{Codec, CodecId, DecodeError, Header, HEADER_LEN};

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
        Header::write(out, CodecId::Fp16, grad.len());
        out.resize(HEADER_LEN + grad.len() * 2, 0);
        let mut buf = [f16::ZERO; BLOCK];
        for (src, dst) in grad
            .chunks(BLOCK)
            .zip(out[HEADER_LEN..].chunks_mut(BLOCK * 2))
        {
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

multiversion! {
    fn add_fp16(body: &[u8], acc: &mut [f32]) {
        let mut bits = [0u16; BLOCK];
        let mut vals = [0f32; BLOCK];
        for (src, a) in body.chunks(BLOCK * 2).zip(acc.chunks_mut(BLOCK)) {
            let n = a.len();
            bytemuck::cast_slice_mut::<u16, u8>(&mut bits[..n]).copy_from_slice(src);
            let h: &[f16] = half::slice::HalfBitsSliceExt::reinterpret_cast(&bits[..n]);
            h.convert_to_f32_slice(&mut vals[..n]);
            for (a, v) in a.iter_mut().zip(&vals[..n]) {
                *a += v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
