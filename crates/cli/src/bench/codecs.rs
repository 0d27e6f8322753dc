//! `gradwire bench codecs`: single-process codec throughput against memcpy, measured by
//! [`gradwire_codec::bench`], printed as a table with both throughputs as a fraction of the
//! memcpy of the same run (with `--threads N`, memcpy stays single-threaded, so `x memcpy`
//! shows the parallel gain), and written as JSON with `--json`.

use std::path::PathBuf;

use anyhow::{bail, Context};
pub use gradwire_codec::bench::split_specs;
use gradwire_codec::bench::{bench_codec, memcpy_gbps, synthetic_gradient};
use gradwire_codec::CodecConfig;

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
            "provenance": gradwire_run::report::records::Provenance::current(),
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
