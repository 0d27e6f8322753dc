//! `gradwire bench codecs`: single-process codec throughput against memcpy.
//!
//! For each codec spec: encode and `decode_add` throughput (input bytes / time, GB/s, the
//! median of several timed iterations after a warm-up), the compression ratio (input bytes /
//! payload bytes), and both throughputs as a fraction of a memcpy of the same size measured
//! in the same run. With `--threads N` the gradient is split into N chunks, each encoded and
//! decoded by its own codec instance on its own scoped thread (memcpy stays single-threaded,
//! so `x memcpy` then shows the parallel gain).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use gradwire_codec::{BuildContext, Codec, CodecConfig};

/// Arguments of `gradwire bench codecs`.
#[derive(clap::Args, Debug, Clone)]
pub struct CodecBenchArgs {
    /// Gradient length in f32 elements.
    #[arg(long, default_value_t = 25_000_000)]
    pub elements: usize,
    /// Codec specs separated by commas or semicolons (a comma-separated `key=value` after a
    /// spec belongs to it: `qsgd:bits=4,bucket=512,topk:ratio=0.01` is two specs).
    /// Default: every codec's example specs.
    #[arg(long)]
    pub codecs: Option<String>,
    /// Threads, each encoding and decoding its own chunk with its own codec instance.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Timed iterations per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seed of the synthetic gradient and of the stochastic codecs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Splits a `--codecs` list into specs: a piece without `:` that holds `=` continues the
/// previous spec.
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

/// One codec's measurements.
#[derive(Debug, Clone)]
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A deterministic, roughly Gaussian gradient.
fn synthetic_gradient(n: usize, seed: u64) -> Vec<f32> {
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

/// Times `f` `iters` times after one warm-up call; returns the median seconds.
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

/// memcpy GB/s of `n` f32 (bytes copied / time).
pub fn memcpy_gbps(src: &[f32], iters: usize) -> f64 {
    let mut dst = vec![0f32; src.len()];
    let secs = time(iters, || {
        dst.copy_from_slice(src);
        std::hint::black_box(&mut dst);
    });
    (src.len() * 4) as f64 / secs / 1e9
}

/// Measures one codec on `grad` split into `threads` chunks.
pub fn bench_codec(
    cfg: &CodecConfig,
    grad: &[f32],
    threads: usize,
    iters: usize,
    seed: u64,
) -> anyhow::Result<CodecBenchResult> {
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
    // Check once that every payload decodes.
    for ((c, out), acc) in codecs.iter().zip(&outs).zip(accs.iter_mut()) {
        c.decode_add(out, acc)
            .with_context(|| format!("{cfg}: decoding its own payload"))?;
    }
    let dec = time(iters, || {
        std::thread::scope(|s| {
            // `&mut` so each thread owns its codec (`Codec` is `Send`, not `Sync`).
            for ((c, out), acc) in codecs.iter_mut().zip(&outs).zip(accs.iter_mut()) {
                s.spawn(move || {
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

/// Runs the benchmark, prints a table and writes the JSON file if asked.
pub fn run(args: &CodecBenchArgs) -> anyhow::Result<()> {
    if args.elements == 0 {
        bail!("--elements must be positive");
    }
    let configs: Vec<CodecConfig> = match &args.codecs {
        Some(list) => split_specs(list)
            .iter()
            .map(|s| {
                s.parse::<CodecConfig>()
                    .with_context(|| format!("codec spec '{s}'"))
            })
            .collect::<anyhow::Result<_>>()?,
        None => CodecConfig::examples(),
    };
    if configs.is_empty() {
        bail!("no codecs to bench");
    }
    let grad = synthetic_gradient(args.elements, args.seed);
    let memcpy = memcpy_gbps(&grad, args.iters);
    println!(
        "{} elements ({:.1} MB), {} thread(s), median of {} iterations; memcpy {:.2} GB/s",
        args.elements,
        (args.elements * 4) as f64 / 1e6,
        args.threads.max(1),
        args.iters.max(1),
        memcpy
    );
    println!(
        "{:<52} {:>10} {:>7} {:>10} {:>7} {:>9}",
        "codec", "enc GB/s", "x mcpy", "dec GB/s", "x mcpy", "ratio"
    );
    let mut results = Vec::new();
    for cfg in &configs {
        let r = bench_codec(cfg, &grad, args.threads, args.iters, args.seed)?;
        println!(
            "{:<52} {:>10.2} {:>7.2} {:>10.2} {:>7.2} {:>9.2}",
            r.codec,
            r.encode_gbps,
            r.encode_gbps / memcpy,
            r.decode_add_gbps,
            r.decode_add_gbps / memcpy,
            r.ratio
        );
        results.push(r);
    }
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "provenance": crate::records::Provenance::current(),
            "memcpy_gbps": memcpy,
            "results": results.iter().map(|r| serde_json::json!({
                "codec": r.codec,
                "encode_gbps": r.encode_gbps,
                "decode_add_gbps": r.decode_add_gbps,
                "ratio": r.ratio,
                "encode_ms": r.encode_ms,
                "decode_add_ms": r.decode_add_ms,
                "encode_vs_memcpy": r.encode_gbps / memcpy,
                "decode_add_vs_memcpy": r.decode_add_gbps / memcpy,
                "elements": args.elements,
                "threads": args.threads.max(1),
            })).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
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
    }

    #[test]
    fn benches_every_example_on_a_small_gradient() {
        let grad = synthetic_gradient(10_000, 3);
        for cfg in CodecConfig::examples() {
            let r = bench_codec(&cfg, &grad, 2, 1, 1).unwrap();
            assert!(r.ratio > 0.9 && r.encode_gbps > 0.0, "{}", r.codec);
        }
    }
}
