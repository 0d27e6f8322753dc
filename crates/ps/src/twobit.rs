//! MXNet's 2-bit gradient compression (`set_gradient_compression({'type': '2bit'})`,
//! `src/kvstore/gradient_compression-inl.h`), with the residual on the worker.
//!
//! Per element, with residual `r` (zero at first) and threshold `t` (default 0.5):
//! `r += g`; if `r >= t` emit `11` and `r -= t`; else if `r <= -t` emit `10` and `r += t`;
//! else emit `00`. The server decodes `11` to `+t`, `10` to `-t`, `00` to 0 and adds.
//!
//! Wire layout (little-endian):
//! ```text
//! 0..4    magic     u32 = 0x4232_5747 ("GW2B")
//! 4..8    threshold f32 (finite, > 0)
//! 8..16   count     u64 elements
//! 16..    ceil(count / 4) bytes; element i sits in byte i / 4 at bits
//!         (7 - 2·(i % 4), 6 - 2·(i % 4)), first element in the high bits (as MXNet);
//!         code 01 is invalid, padding bits of the last byte must be 0
//! ```
//! The decoder is total: every field and the exact length are checked before the
//! accumulator is touched.

use std::fmt;

use gradwire_codec::{ConfigError, Params};

use crate::wire::WireError;

/// Magic of a 2-bit payload.
pub const TWOBIT_MAGIC: u32 = 0x4232_5747;
/// Length of the 2-bit header.
pub const TWOBIT_HEADER: usize = 16;

/// Parameters of `2bit[:threshold=T]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TwoBitConfig {
    /// The quantization threshold (MXNet default 0.5).
    pub threshold: f32,
}

impl Default for TwoBitConfig {
    fn default() -> Self {
        TwoBitConfig { threshold: 0.5 }
    }
}

impl TwoBitConfig {
    /// Reads `threshold=` from a spec's parameters.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        Ok(TwoBitConfig {
            threshold: p.f64_in("threshold", Some(0.5), 1e-30, 1e30)? as f32,
        })
    }
}

impl fmt::Display for TwoBitConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "2bit:threshold={}", self.threshold)
    }
}

/// The 2-bit quantizer with its residual (one per pushed chunk, on the worker).
#[derive(Debug, Clone, Default)]
pub struct TwoBit {
    cfg: TwoBitConfig,
    residual: Vec<f32>,
}

impl TwoBit {
    /// A quantizer with a zero residual.
    pub fn new(cfg: TwoBitConfig) -> Self {
        TwoBit {
            cfg,
            residual: Vec::new(),
        }
    }

    /// The current residual (empty before the first encode).
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Quantizes `grad` (plus the residual) into `out` (cleared first).
    pub fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let t = self.cfg.threshold;
        if self.residual.len() != grad.len() {
            self.residual = vec![0.0; grad.len()];
        }
        out.clear();
        out.reserve(TWOBIT_HEADER + grad.len().div_ceil(4));
        out.extend_from_slice(&TWOBIT_MAGIC.to_le_bytes());
        out.extend_from_slice(&t.to_le_bytes());
        out.extend_from_slice(&(grad.len() as u64).to_le_bytes());
        for (gs, rs) in grad.chunks(4).zip(self.residual.chunks_mut(4)) {
            let mut byte = 0u8;
            for (j, (g, r)) in gs.iter().zip(rs.iter_mut()).enumerate() {
                *r += g;
                let code = if *r >= t {
                    *r -= t;
                    0b11
                } else if *r <= -t {
                    *r += t;
                    0b10
                } else {
                    0b00
                };
                byte |= code << (6 - 2 * j);
            }
            out.push(byte);
        }
    }

    /// Decodes a 2-bit payload and adds it into `acc` (whose length must match).
    pub fn decode_add(payload: &[u8], acc: &mut [f32]) -> Result<(), WireError> {
        if payload.len() < TWOBIT_HEADER {
            return Err(WireError::Truncated {
                need: TWOBIT_HEADER,
                have: payload.len(),
            });
        }
        let magic = u32::from_le_bytes(payload[0..4].try_into().expect("4 bytes"));
        if magic != TWOBIT_MAGIC {
            return Err(WireError::BadField {
                field: "2bit magic",
            });
        }
        let t = f32::from_le_bytes(payload[4..8].try_into().expect("4 bytes"));
        if !(t.is_finite() && t > 0.0) {
            return Err(WireError::BadField {
                field: "2bit threshold",
            });
        }
        let count = u64::from_le_bytes(payload[8..16].try_into().expect("8 bytes"));
        if count != acc.len() as u64 {
            return Err(WireError::BadLength {
                field: "2bit element count",
            });
        }
        let need = TWOBIT_HEADER + acc.len().div_ceil(4);
        if payload.len() != need {
            return Err(if payload.len() < need {
                WireError::Truncated {
                    need,
                    have: payload.len(),
                }
            } else {
                WireError::Trailing {
                    extra: payload.len() - need,
                }
            });
        }
        let codes = &payload[TWOBIT_HEADER..];
        // Validate first, so a bad payload leaves `acc` untouched.
        for (b, byte) in codes.iter().enumerate() {
            let used = (acc.len() - 4 * b).min(4);
            for j in 0..4 {
                let code = (byte >> (6 - 2 * j)) & 0b11;
                if code == 0b01 || (j >= used && code != 0) {
                    return Err(WireError::BadField { field: "2bit code" });
                }
            }
        }
        for (a4, byte) in acc.chunks_mut(4).zip(codes) {
            for (j, a) in a4.iter_mut().enumerate() {
                match (byte >> (6 - 2 * j)) & 0b11 {
                    0b11 => *a += t,
                    0b10 => *a -= t,
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An independent reference written from MXNet's description (not from the code above).
    fn reference(grads: &[Vec<f32>], t: f32) -> (Vec<Vec<f32>>, Vec<f32>) {
        let n = grads[0].len();
        let mut r = vec![0.0f32; n];
        let mut out = Vec::new();
        for g in grads {
            let mut d = vec![0.0f32; n];
            for i in 0..n {
                r[i] += g[i];
                if r[i] >= t {
                    d[i] = t;
                    r[i] -= t;
                } else if r[i] <= -t {
                    d[i] = -t;
                    r[i] += t;
                }
            }
            out.push(d);
        }
        (out, r)
    }

    #[test]
    fn matches_mxnet_reference_over_three_steps_with_residual() {
        let grads: Vec<Vec<f32>> = (0..3)
            .map(|s| {
                (0..13)
                    .map(|i| ((i * 7 + s * 5) % 11) as f32 * 0.125 - 0.6)
                    .collect()
            })
            .collect();
        let (want, want_r) = reference(&grads, 0.5);
        let mut q = TwoBit::new(TwoBitConfig::default());
        let mut buf = Vec::new();
        for (g, w) in grads.iter().zip(&want) {
            q.encode(g, &mut buf);
            assert_eq!(buf.len(), TWOBIT_HEADER + 4);
            let mut acc = vec![0.0; 13];
            TwoBit::decode_add(&buf, &mut acc).unwrap();
            assert_eq!(&acc, w);
        }
        assert_eq!(q.residual(), &want_r[..]);
    }

    #[test]
    fn decoder_is_total() {
        let mut q = TwoBit::new(TwoBitConfig { threshold: 0.25 });
        let mut buf = Vec::new();
        q.encode(&[1.0, -1.0, 0.0, 0.3, 0.9], &mut buf);
        let mut acc = vec![0.0; 5];
        for cut in 0..buf.len() {
            assert!(TwoBit::decode_add(&buf[..cut], &mut acc).is_err());
        }
        assert_eq!(acc, vec![0.0; 5], "a refused payload leaves acc untouched");
        let mut long = buf.clone();
        long.push(0);
        assert!(TwoBit::decode_add(&long, &mut acc).is_err());
        assert!(TwoBit::decode_add(&buf, &mut [0.0; 4]).is_err());
        let mut pad = buf.clone();
        *pad.last_mut().unwrap() |= 0b0000_0011;
        assert!(
            TwoBit::decode_add(&pad, &mut acc).is_err(),
            "padding bits set"
        );
        let mut nan = buf.clone();
        nan[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(TwoBit::decode_add(&nan, &mut acc).is_err());
        TwoBit::decode_add(&buf, &mut acc).unwrap();
        assert_eq!(acc, vec![0.25, -0.25, 0.0, 0.25, 0.25]);
    }
}
