//! Encode speed of the sparse codecs at 25M f32, next to a 100 MB memcpy, on one thread.
//!
//! Reports wall time and on-CPU time (from `/proc/thread-self/schedstat`, Linux), min over
//! repetitions, so numbers stay meaningful on a shared machine:
//! `cargo bench -p gradwire-codec --bench sparse_speed -- [reps] [spec;spec...]`.
#![allow(missing_docs)] // a bench binary: nothing here is API
use std::hint::black_box;
use std::time::Instant;

use gradwire_codec::{BuildContext, Codec, CodecConfig};

const N: usize = 25_000_000;

fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn measure(reps: usize, mut f: impl FnMut()) -> (f64, Option<f64>) {
    f();
    let (mut wall, mut cpu) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..reps {
        let (t, c) = (Instant::now(), cpu_ns());
        f();
        wall = wall.min(t.elapsed().as_secs_f64() * 1e3);
        if let (Some(a), Some(b)) = (c, cpu_ns()) {
            cpu = cpu.min((b - a) as f64 / 1e6);
        }
    }
    (wall, cpu.is_finite().then_some(cpu))
}

fn main() {
    // `cargo bench` passes `--bench`; the rest are this bench's own arguments.
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with("--"));
    let reps: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let specs = args.next().unwrap_or_else(|| {
        "topk:ratio=0.001,ef=false;topk:ratio=0.001;dgc:ratio=0.001,warmup_epochs=0".into()
    });
    let mut s = 1u64;
    let g: Vec<f32> = (0..N)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            u * u * u
        })
        .collect();
    let mut dst = vec![1f32; N];
    let show = |name: &str, (wall, cpu): (f64, Option<f64>)| {
        let cpu = cpu.map_or("n/a".into(), |c| format!("{c:.1}"));
        println!("{name:<50} wall {wall:>7.1} ms   cpu {cpu:>7} ms");
    };
    show(
        "memcpy 100 MB",
        measure(reps, || {
            dst.copy_from_slice(black_box(&g));
            black_box(&mut dst);
        }),
    );
    show(
        "read 100 MB (OR of all bits)",
        measure(reps, || {
            black_box(black_box(&g).iter().fold(0u32, |a, &x| a | x.to_bits()));
        }),
    );
    drop(dst);
    for spec in specs.split(';') {
        let cfg: CodecConfig = spec.parse().expect("spec");
        let mut codec: Box<dyn Codec> = cfg.build(&BuildContext::single(1));
        let mut out = Vec::new();
        let r = measure(reps, || codec.encode(black_box(&g), &mut out));
        show(&format!("encode {spec} ({} B)", out.len()), r);
    }
}
