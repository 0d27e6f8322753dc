//! Criterion benches: encode and `decode_add` of every `CodecConfig::examples()` codec, with
//! `Throughput::Bytes` of the f32 input so results read as GB/s, and each codec's compression
//! ratio printed beside it.
//!
//! `cargo bench -p gradwire-codec --bench codecs` runs 1K and 1M elements (short);
//! `GRADWIRE_BENCH_FULL=1` adds 16K and 16M. Filter with a codec name:
//! `cargo bench -p gradwire-codec --bench codecs -- qsgd`.
#![allow(missing_docs)] // criterion's macros generate undocumented items
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gradwire_codec::{BuildContext, CodecConfig};

fn grad(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1e-2
        })
        .collect()
}

fn sizes() -> Vec<usize> {
    if std::env::var_os("GRADWIRE_BENCH_FULL").is_some() {
        vec![1 << 10, 1 << 14, 1 << 20, 1 << 24]
    } else {
        vec![1 << 10, 1 << 20]
    }
}

fn codecs(c: &mut Criterion) {
    let sizes = sizes();
    let g = grad(*sizes.iter().max().unwrap(), 1);
    {
        let n = *sizes.last().unwrap();
        let mut group = c.benchmark_group("memcpy");
        group.throughput(Throughput::Bytes((n * 4) as u64));
        let mut dst = vec![0f32; n];
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                dst.copy_from_slice(&g[..n]);
                black_box(&mut dst);
            })
        });
        group.finish();
    }
    for cfg in CodecConfig::examples() {
        let spec = cfg.to_string();
        let mut group = c.benchmark_group(spec.clone());
        for &n in &sizes {
            let x = &g[..n];
            let mut codec = cfg.build(&BuildContext::single(1));
            let mut out = Vec::new();
            codec.encode(x, &mut out);
            eprintln!(
                "{spec} n={n}: ratio {:.2} ({} payload bytes)",
                (n * 4) as f64 / out.len() as f64,
                out.len()
            );
            group.throughput(Throughput::Bytes((n * 4) as u64));
            group.bench_function(BenchmarkId::new("encode", n), |b| {
                b.iter(|| codec.encode(black_box(x), &mut out))
            });
            let mut acc = vec![0f32; n];
            group.bench_function(BenchmarkId::new("decode_add", n), |b| {
                b.iter(|| codec.decode_add(black_box(&out), &mut acc).unwrap())
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(600));
    targets = codecs
}
criterion_main!(benches);
