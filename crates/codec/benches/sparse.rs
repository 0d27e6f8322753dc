//! Criterion benches of the sparse codecs' encode at 25M f32, next to a 100 MB memcpy.
//!
//! `cargo bench -p gradwire-codec --bench sparse` (single thread; a few seconds per line).
#![allow(missing_docs)] // criterion's macros generate undocumented items
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gradwire_codec::{BuildContext, Codec, CodecConfig};

const N: usize = 25_000_000;

fn grad(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            u * u * u
        })
        .collect()
}

fn sparse(c: &mut Criterion) {
    let g = grad(N, 1);
    let mut group = c.benchmark_group("sparse_25M");
    group.throughput(Throughput::Bytes((N * 4) as u64));
    let mut dst = vec![0f32; N];
    group.bench_function("memcpy_100MB", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&g)))
    });
    drop(dst);
    let specs = std::env::var("SPARSE_SPECS").unwrap_or_else(|_| {
        "topk:ratio=0.001,ef=false;topk:ratio=0.001;dgc:ratio=0.001,warmup_epochs=0".into()
    });
    for spec in specs.split(';') {
        let Ok(cfg) = spec.parse::<CodecConfig>() else {
            eprintln!("skipping unknown spec {spec}");
            continue;
        };
        let mut codec: Box<dyn Codec> = cfg.build(&BuildContext::single(1));
        let mut out = Vec::new();
        codec.encode(&g, &mut out);
        eprintln!("{spec}: {} bytes for {} elements", out.len(), N);
        group.bench_function(format!("encode {spec}"), |b| {
            b.iter(|| codec.encode(black_box(&g), &mut out))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = sparse
}
criterion_main!(benches);
