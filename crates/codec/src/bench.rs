//! Codec throughput on one machine, for `gradwire bench codecs`: per codec, encode and
//! `decode_add` throughput (input bytes / time, GB/s, the median of several timed iterations
//! after one warm-up) and the compression ratio (input bytes / payload bytes), next to a
//! memcpy of the same size ([`memcpy_gbps`]). With several threads the gradient is split
//! into that many chunks, each encoded and decoded by its own codec instance on its own
//! scoped thread.

use std::time::Instant;

use crate::{BuildContext, Codec, CodecConfig, DecodeError};

/// Errors of [`bench_codec`].
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A codec could not decode a payload it had just encoded.
    #[error("{codec}: decoding its own payload")]
    Decode {
        /// The codec's canonical spec.
        codec: String,
        /// The decoder's complaint.
        #[source]
        source: DecodeError,
    },
}

/// One codec's measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct CodecBenchResult {
    /// Canonical spec.
    pub codec: String,
    /// Encode throughput, GB/s of input.
    pub encode_gbps: f64,
    /// `decode_add` throughput, GB/s of output.
    pub decode_add_gbps: f64,
    /// Input bytes / payload bytes.
    pub ratio: f64,
    /// Median encode time, ms.
    pub encode_ms: f64,
    /// Median decode_add time, ms.
    pub decode_add_ms: f64,
}

/// Splits a list of codec specs separated by commas or semicolons: a piece without `:` that
/// holds `=` continues the previous spec (`qsgd:bits=4,bucket=512,topk:ratio=0.01` is two
/// specs).
pub fn split_specs(list: &str) -> Vec<String> {
    let mut specs: Vec<String> = Vec::new();
    for piece in list
        .split([',', ';'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        match specs.last_mut() {
            Some(last) if !piece.contains(':') && piece.contains('=') => {
                last.push(',');
                last.push_str(piece);
            }
            _ => specs.push(piece.to_string()),
        }
    }
    specs
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A deterministic, roughly Gaussian gradient of `n` elements (a sum of three uniform
/// draws of an xorshift generator seeded with `seed`), scaled to about 1e-3.
pub fn synthetic_gradient(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let a = (s & 0xffff) as f32 + ((s >> 16) & 0xffff) as f32 + ((s >> 32) & 0xffff) as f32
                - 1.5 * 65535.0;
            a * (1e-3 / 65535.0)
        })
        .collect()
}

/// Times `f` `iters` times (at least once) after one warm-up call; returns the median
/// seconds.
fn time(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..iters.max(1))
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// memcpy GB/s of `src` (bytes copied / median time over `iters`, single-threaded).
pub fn memcpy_gbps(src: &[f32], iters: usize) -> f64 {
    let mut dst = vec![0f32; src.len()];
    let secs = time(iters, || {
        dst.copy_from_slice(src);
        std::hint::black_box(&mut dst);
    });
    (src.len() * 4) as f64 / secs / 1e9
}

/// Measures the codec `cfg` on `grad` split into `threads` chunks (`iters` timed
/// iterations, codecs seeded with `seed`); checks once that every payload decodes.
pub fn bench_codec(
    cfg: &CodecConfig,
    grad: &[f32],
    threads: usize,
    iters: usize,
    seed: u64,
) -> Result<CodecBenchResult, BenchError> {
    let threads = threads.max(1);
    let chunk = grad.len().div_ceil(threads).max(1);
    let parts: Vec<&[f32]> = grad.chunks(chunk).collect();
    let mut codecs: Vec<Box<dyn Codec>> = parts
        .iter()
        .map(|_| cfg.build(&BuildContext::single(seed)))
        .collect();
    let mut outs: Vec<Vec<u8>> = vec![Vec::new(); parts.len()];
    let mut accs: Vec<Vec<f32>> = parts.iter().map(|p| vec![0f32; p.len()]).collect();

    let enc = time(iters, || {
        std::thread::scope(|s| {
            for ((c, out), p) in codecs.iter_mut().zip(outs.iter_mut()).zip(&parts) {
                s.spawn(move || c.encode(p, out));
            }
        })
    });
    for ((c, out), acc) in codecs.iter().zip(&outs).zip(accs.iter_mut()) {
        c.decode_add(out, acc)
            .map_err(|source| BenchError::Decode {
                codec: cfg.to_string(),
                source,
            })?;
    }
    let dec = time(iters, || {
        std::thread::scope(|s| {
            // `&mut` so each thread owns its codec (`Codec` is `Send`, not `Sync`).
            for ((c, out), acc) in codecs.iter_mut().zip(&outs).zip(accs.iter_mut()) {
                s.spawn(move || {
                    // Checked above: the same payloads decode.
                    let _ = c.decode_add(out, acc);
                });
            }
        })
    });
    let bytes = (grad.len() * 4) as f64;
    let payload: usize = outs.iter().map(Vec::len).sum();
    Ok(CodecBenchResult {
        codec: cfg.to_string(),
        encode_gbps: bytes / enc / 1e9,
        decode_add_gbps: bytes / dec / 1e9,
        ratio: bytes / payload.max(1) as f64,
        encode_ms: enc * 1e3,
        decode_add_ms: dec * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_specs_with_commas() {
        assert_eq!(
            split_specs("qsgd:bits=4,bucket=512,topk:ratio=0.01;fp16, onebit"),
            vec![
                "qsgd:bits=4,bucket=512",
                "topk:ratio=0.01",
                "fp16",
                "onebit"
            ]
        );
        assert!(split_specs(" ,; ").is_empty());
    }

    #[test]
    fn the_synthetic_gradient_is_deterministic_and_centred() {
        let g = synthetic_gradient(100_000, 7);
        assert_eq!(g, synthetic_gradient(100_000, 7));
        assert_ne!(g, synthetic_gradient(100_000, 8));
        let mean = g.iter().map(|&x| x as f64).sum::<f64>() / g.len() as f64;
        assert!(mean.abs() < 1e-5, "{mean}");
        assert!(g.iter().all(|x| x.abs() <= 1.5e-3));
    }

    #[test]
    fn benches_every_example_on_a_small_gradient() {
        let grad = synthetic_gradient(10_000, 3);
        for cfg in CodecConfig::examples() {
            let r = bench_codec(&cfg, &grad, 2, 1, 1).unwrap();
            assert_eq!(r.codec, cfg.to_string());
            assert!(r.ratio > 0.9 && r.encode_gbps > 0.0, "{}", r.codec);
            // The throughputs are the input bytes over the median times.
            let gb = 40_000.0 / 1e9;
            assert!((r.encode_gbps - gb / (r.encode_ms / 1e3)).abs() < 1e-6 * r.encode_gbps);
            assert!(
                (r.decode_add_gbps - gb / (r.decode_add_ms / 1e3)).abs() < 1e-6 * r.decode_add_gbps
            );
        }
    }

    #[test]
    fn the_ratio_of_fp16_is_about_two() {
        let grad = synthetic_gradient(1 << 16, 1);
        let r = bench_codec(&"fp16".parse().unwrap(), &grad, 1, 1, 1).unwrap();
        assert!(r.ratio > 1.9 && r.ratio <= 2.0, "{}", r.ratio);
        assert!(memcpy_gbps(&grad, 2) > 0.0);
    }
}
