//! `gradwire-gpu-check`: the device checks of the `cuda` feature, in one run, as JSON.
//!
//! 1. every device codec against its CPU twin: the same gradients (several steps, layouts
//!    with shapes and roles), byte-for-byte equal payloads, and each device payload decoded
//!    by the CPU codec;
//! 2. encode throughput of DGC 0.1% and QSGD 4-bit on large buffers, as a ratio of the
//!    device's own copy bandwidth measured in the same run (`--data DIR` reads the buffers
//!    `g25m.f32`, `g100m.f32` that the torch comparison used);
//! 3. the host-transfer all-reduce between rank threads sharing the GPU, over TCP and shared
//!    memory, pipelined and not, checked against the exact reference sum, with its time
//!    split;
//! 4. training on the GPU with DGC (`--fashion-mnist DIR`): 2 ranks, an MLP, the sparse
//!    all-reduce, test accuracy per epoch.
//!
//! ```text
//! gradwire-gpu-check [--quick] [--data DIR] [--fashion-mnist DIR] [--only codecs,bench,allreduce,train] [--out FILE]
//! ```

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream};
use gradwire_codec::external::uniform;
use gradwire_codec::{BuildContext, Codec, CodecConfig, Progress, TensorInfo, TensorRole};
use gradwire_gpu::allreduce::{host_reduction_seconds, AsyncAllReduce, HostTransfer};
use gradwire_gpu::codec;
use gradwire_gpu::device::{pattern, Device};
use serde_json::{json, Value};

mod train;

pub(crate) type R<T> = Result<T, Box<dyn std::error::Error>>;

fn grad(n: usize, step: u32) -> Vec<f32> {
    let k1 = 0x1234_5678 ^ step.wrapping_mul(0x9E37_79B9);
    let k2 = k1.rotate_left(13) ^ 0xdead_beef;
    (0..n as u32)
        .map(|i| {
            let a = uniform(k1, i) - 0.5;
            let b = uniform(k2, i);
            a * (0.05 + 3.0 * b * b * b * b)
        })
        .collect()
}

fn lenet() -> Vec<TensorInfo> {
    use TensorRole::*;
    vec![
        TensorInfo::new([6, 1, 5, 5], ConvWeight),
        TensorInfo::new([6], Bias),
        TensorInfo::new([16, 6, 5, 5], ConvWeight),
        TensorInfo::new([16], Bias),
        TensorInfo::new([256, 120], LinearWeight),
        TensorInfo::new([120], Bias),
        TensorInfo::new([120, 84], LinearWeight),
        TensorInfo::new([84], Bias),
        TensorInfo::new([84, 10], Output),
        TensorInfo::new([10], Output),
    ]
}

fn wide() -> Vec<TensorInfo> {
    use TensorRole::*;
    vec![
        TensorInfo::new([784, 1024], LinearWeight),
        TensorInfo::new([1024], Bias),
        TensorInfo::new([1024, 1024], LinearWeight),
        TensorInfo::new([1024], Bias),
        TensorInfo::new([1024, 10], Output),
        TensorInfo::new([10], Output),
    ]
}

/// One codec spec on one layout: `steps` encodes on both sides, compared byte for byte.
fn compare(
    dev: &Device,
    stream: &Arc<CudaStream>,
    spec: &str,
    ctx: &BuildContext,
    n: usize,
    steps: u32,
) -> R<Value> {
    let cfg: CodecConfig = spec.parse()?;
    let mut cpu = cfg.build(ctx);
    let mut gpu = codec::build(dev, stream, &cfg, ctx, n)?;
    let mut equal = 0u32;
    let mut first_diff: Option<Value> = None;
    let mut bytes = 0usize;
    let mut decoded_ok = true;
    let (mut p, mut q) = (Vec::new(), Vec::new());
    for step in 0..steps {
        let g = grad(n, step);
        let dg = stream.clone_htod(&g)?;
        let prog = Progress {
            step: step as u64,
            epoch: step as f32 * 0.5,
        };
        cpu.set_progress(prog);
        gpu.set_progress(prog);
        if cpu.caps().shared_scalars {
            let lc = cpu.local_scalars(&g);
            let lg = gpu.local_scalars(&dg.as_view())?;
            // Agree on a scale above both (as the max over ranks would be).
            let agreed: Vec<f32> = lc.iter().zip(&lg).map(|(a, b)| a.max(*b) * 1.25).collect();
            cpu.set_shared_scalars(&agreed);
            gpu.set_shared_scalars(&agreed);
        }
        cpu.encode(&g, &mut p);
        gpu.encode(&dg.as_view(), &mut q)?;
        bytes = q.len();
        let mut acc = vec![0f32; n];
        decoded_ok &= cpu.decode_add(&q, &mut acc).is_ok();
        if p == q {
            equal += 1;
        } else if first_diff.is_none() {
            let at = p
                .iter()
                .zip(&q)
                .position(|(a, b)| a != b)
                .unwrap_or(p.len().min(q.len()));
            first_diff =
                Some(json!({"step": step, "byte": at, "cpu_len": p.len(), "gpu_len": q.len()}));
        }
    }
    Ok(json!({
        "spec": spec, "n": n, "tensors": ctx.layout.len(), "steps": steps,
        "equal_steps": equal, "identical": equal == steps, "payload_bytes": bytes,
        "cpu_decodes_gpu_payload": decoded_ok, "first_difference": first_diff,
    }))
}

fn codecs(dev: &Device, quick: bool) -> R<Value> {
    let stream = dev.new_stream()?;
    let steps = if quick { 3 } else { 6 };
    let big = if quick { 300_001 } else { (1 << 21) + 777 };
    let mut rows = Vec::new();
    let layouts: Vec<(&str, BuildContext, usize)> = vec![
        (
            "lenet shapes",
            BuildContext::new(5, 1, 4, vec![]).with_tensors(lenet()),
            lenet().iter().map(|t| t.numel()).sum(),
        ),
        (
            "wide mlp shapes",
            BuildContext::new(5, 2, 4, vec![]).with_tensors(wide()),
            wide().iter().map(|t| t.numel()).sum(),
        ),
        (
            "one tensor, shape unknown",
            BuildContext::new(9, 0, 2, vec![]),
            big,
        ),
        (
            "layout without shapes",
            BuildContext::new(3, 3, 4, vec![50_000, 7, 100_000, 3]),
            150_010,
        ),
    ];
    let specs = [
        "fp16",
        "onebit",
        "onebit:ef=false",
        "onebit:column=tensor",
        "qsgd",
        "qsgd:bits=4",
        "qsgd:bits=8,norm=l2",
        "qsgd:bits=2,bucket=100",
        "terngrad",
        "terngrad:output=ternary,clip=0",
        "dgc:ratio=0.001",
        "dgc:ratio=0.01,warmup_epochs=0",
        "dgc:ratio=0.001,min_dense=1024,nesterov=true",
        "topk",
        "topk:ratio=0.001,scope=tensor",
        "topk:ratio=0.01,values=fp16",
        "topk:ratio=0.01,ef=false",
        "topk:ratio=0.001,warmup_epochs=2",
    ];
    for (name, ctx, n) in &layouts {
        for spec in specs {
            let t = Instant::now();
            let mut row = match compare(dev, &stream, spec, ctx, *n, steps) {
                Ok(v) => v,
                Err(e) => json!({"spec": spec, "n": n, "error": e.to_string(), "identical": false}),
            };
            row["layout"] = json!(name);
            row["seconds"] = json!(t.elapsed().as_secs_f64());
            eprintln!("codec {spec:<44} {name:<26} {}", row["identical"]);
            rows.push(row);
        }
    }
    let all = rows.iter().all(|r| r["identical"] == json!(true));
    Ok(json!({"all_identical": all, "rows": rows}))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn load(data: Option<&str>, name: &str, n: usize) -> R<(Vec<f32>, &'static str)> {
    if let Some(d) = data {
        let path = format!("{d}/{name}");
        if let Ok(b) = std::fs::read(&path) {
            if b.len() == 4 * n {
                let v = b
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                return Ok((v, "torch.randn buffer shared with the torch.topk timing"));
            }
        }
    }
    Ok((grad(n, 0), "generated (torch buffer not found)"))
}

fn bench(dev: &Device, quick: bool, data: Option<&str>) -> R<Value> {
    let stream = dev.new_stream()?;
    let sizes: &[(usize, &str)] = if quick {
        &[(1 << 22, "g4m.f32")]
    } else {
        &[(25_000_000, "g25m.f32"), (100_000_000, "g100m.f32")]
    };
    let reps = if quick { 3 } else { 10 };
    let mut rows = Vec::new();
    for &(n, file) in sizes {
        let (g, source) = load(data, file, n)?;
        let dg = stream.clone_htod(&g)?;
        drop(g);
        let mut copy: CudaSlice<f32> = stream.alloc_zeros(n)?;
        let mut times = Vec::new();
        for i in 0..reps + 2 {
            stream.synchronize()?;
            let t = Instant::now();
            stream.memcpy_dtod(&dg, &mut copy)?;
            stream.synchronize()?;
            if i >= 2 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        let copy_s = median(times);
        drop(copy);
        for spec in [
            "dgc:ratio=0.001,warmup_epochs=0",
            "topk:ratio=0.001",
            "qsgd:bits=4",
        ] {
            let cfg: CodecConfig = spec.parse()?;
            let mut c = codec::build(dev, &stream, &cfg, &BuildContext::single(1), n)?;
            let mut out = Vec::new();
            let mut times = Vec::new();
            for i in 0..reps + 2 {
                c.set_progress(Progress {
                    step: i as u64,
                    epoch: 10.0,
                });
                stream.synchronize()?;
                let t = Instant::now();
                c.encode(&dg.as_view(), &mut out)?;
                if i >= 2 {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            let enc = median(times);
            eprintln!(
                "bench {spec} n={n}: encode {:.3} ms, copy {:.3} ms",
                enc * 1e3,
                copy_s * 1e3
            );
            rows.push(json!({
                "spec": spec, "n": n, "data": source,
                "encode_s": enc, "device_copy_s": copy_s,
                "copy_bandwidth_gb_s": 8.0 * n as f64 / copy_s / 1e9,
                "encode_over_copy_time": enc / copy_s,
                "payload_bytes": out.len(), "ratio": 4.0 * n as f64 / out.len() as f64,
            }));
        }
    }
    Ok(json!({
        "what": "encode_s: one encode of the device gradient, payload bytes on the host (median of the runs after 2 warm-ups); device_copy_s: a device-to-device copy of the same buffer (reads and writes 4n bytes each); encode_over_copy_time: encode_s / device_copy_s",
        "rows": rows,
    }))
}

fn allreduce(dev: &Device, quick: bool) -> R<Value> {
    let n: usize = if quick { 1 << 22 } else { 25_000_000 };
    let mut rows = Vec::new();
    for p in [2usize, 4] {
        for transport in ["tcp", "shm"] {
            for chunk in [1usize << 20, n] {
                let worlds: Vec<Box<dyn gradwire_transport::Transport>> = match transport {
                    "tcp" => gradwire_transport::tcp::loopback_world(p)?
                        .into_iter()
                        .map(|t| Box::new(t) as Box<dyn gradwire_transport::Transport>)
                        .collect(),
                    _ => gradwire_transport::shm::local_world(p, 64 << 20)?
                        .into_iter()
                        .map(|t| Box::new(t) as Box<dyn gradwire_transport::Transport>)
                        .collect(),
                };
                let handles: Vec<_> = worlds
                    .into_iter()
                    .enumerate()
                    .map(|(rank, mut t)| {
                        let dev = dev.clone();
                        std::thread::spawn(
                            move || -> Result<(gradwire_gpu::allreduce::Timing, usize), String> {
                                let mut run = || -> R<(gradwire_gpu::allreduce::Timing, usize)> {
                                    let stream = dev.new_stream()?;
                                    let mut buf: CudaSlice<f32> = stream.alloc_zeros(n)?;
                                    let mut ht = HostTransfer::new(&dev, chunk)?;
                                    let mut best: Option<gradwire_gpu::allreduce::Timing> = None;
                                    for _ in 0..3 {
                                        dev.fill_pattern(&stream, &mut buf, rank as u32)?;
                                        let tm = ht.all_reduce(&mut *t, &mut buf)?;
                                        if best.is_none_or(|b| tm.total < b.total) {
                                            best = Some(tm);
                                        }
                                    }
                                    let host = stream.clone_dtoh(&buf)?;
                                    let bad = (0..n)
                                        .filter(|&i| {
                                            let want: f32 =
                                                (0..p as u32).map(|r| pattern(i, r)).sum();
                                            host[i] != want
                                        })
                                        .count();
                                    Ok((best.unwrap(), bad))
                                };
                                run().map_err(|e| e.to_string())
                            },
                        )
                    })
                    .collect();
                let results: Vec<_> = handles
                    .into_iter()
                    .map(|h| h.join().expect("rank thread"))
                    .collect();
                let mut row = json!({"ranks": p, "transport": transport, "n": n, "chunk": chunk});
                match results.iter().find_map(|r| r.as_ref().err()) {
                    Some(e) => row["error"] = json!(e),
                    None => {
                        let (tm, _) = results[0].as_ref().unwrap();
                        let bad: usize = results.iter().map(|r| r.as_ref().unwrap().1).sum();
                        row["exact"] = json!(bad == 0);
                        row["wrong_elements"] = json!(bad);
                        row["total_s"] = json!(tm.total);
                        row["copy_down_wait_s"] = json!(tm.copy_down_wait);
                        row["collective_s"] = json!(tm.collective);
                        row["copy_up_wait_s"] = json!(tm.copy_up_wait);
                        row["chunks"] = json!(tm.chunks);
                        row["gb_s"] = json!(4.0 * n as f64 / tm.total / 1e9);
                    }
                }
                eprintln!("allreduce {row}");
                rows.push(row);
            }
        }
        let red = host_reduction_seconds(n, p, 3);
        rows.push(json!({"ranks": p, "n": n, "host_reduction_s": red,
            "what": "time of the (p-1)/p*n f32 additions a ring all-reduce does on each rank: the reduction's share of collective_s"}));
    }
    rows.push(async_row(dev, n)?);
    // Device copy bandwidth through pinned memory, for the split.
    let stream = dev.new_stream()?;
    let buf: CudaSlice<f32> = stream.alloc_zeros(n)?;
    let mut pinned = unsafe { dev.context().alloc_pinned_with_flags::<f32>(n, 0) }?;
    let t = Instant::now();
    stream.memcpy_dtoh(&buf, &mut pinned)?;
    stream.synchronize()?;
    let down = t.elapsed().as_secs_f64();
    rows.push(json!({"n": n, "device_to_pinned_s": down, "gb_s": 4.0 * n as f64 / down / 1e9}));
    Ok(json!({ "rows": rows }))
}

/// The non-blocking form: `start` returns at once while the fill kernel and the all-reduce
/// run; the host waits only in `wait`.
fn async_row(dev: &Device, n: usize) -> R<Value> {
    let p = 2usize;
    let handles: Vec<_> = gradwire_transport::tcp::loopback_world(p)?
        .into_iter()
        .enumerate()
        .map(|(rank, t)| {
            let dev = dev.clone();
            std::thread::spawn(move || -> Result<Value, String> {
                let run = || -> R<Value> {
                    let stream = dev.new_stream()?;
                    let ar = AsyncAllReduce::new(&dev, t, 1 << 20)?;
                    let mut buf: CudaSlice<f32> = stream.alloc_zeros(n)?;
                    dev.fill_pattern(&stream, &mut buf, rank as u32)?;
                    let t0 = Instant::now();
                    let pending = ar.start(buf);
                    let start_s = t0.elapsed().as_secs_f64();
                    let (buf, tm) = pending.wait()?;
                    let wait_s = t0.elapsed().as_secs_f64();
                    let host = stream.clone_dtoh(&buf)?;
                    let bad = (0..n)
                        .filter(|&i| host[i] != (0..p as u32).map(|r| pattern(i, r)).sum::<f32>())
                        .count();
                    Ok(json!({"start_returned_s": start_s, "waited_s": wait_s, "all_reduce_s": tm.total, "wrong_elements": bad}))
                };
                run().map_err(|e| e.to_string())
            })
        })
        .collect();
    let results: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect();
    let mut row =
        json!({"ranks": p, "transport": "tcp", "n": n, "mode": "AsyncAllReduce: start, then wait"});
    match results.iter().find_map(|r| r.as_ref().err()) {
        Some(e) => row["error"] = json!(e),
        None => {
            let r0 = results[0].as_ref().unwrap();
            let bad: u64 = results
                .iter()
                .map(|r| r.as_ref().unwrap()["wrong_elements"].as_u64().unwrap_or(1))
                .sum();
            row["exact"] = json!(bad == 0);
            row["rank0"] = r0.clone();
        }
    }
    eprintln!("allreduce {row}");
    Ok(row)
}

/// The GPU checks of gradwire's `cuda` feature, as one JSON report.
///
/// Exit status: 0 when every device codec wrote its CPU twin's bytes, 1 otherwise, 2 when no
/// GPU or NVRTC could be opened.
#[derive(Debug, clap::Parser)]
#[command(name = "gradwire-gpu-check", version)]
struct Args {
    /// Run only these parts (comma-separated): codecs, bench, allreduce, train.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Read the benchmark buffers g25m.f32 and g100m.f32 from DIR (written by
    /// scripts/gpu/torch_topk.py, so both time the same values); generated otherwise.
    #[arg(long, value_name = "DIR")]
    data: Option<String>,
    /// Train an MLP with DGC on the GPU on the Fashion-MNIST IDX files in DIR.
    #[arg(long, value_name = "DIR")]
    fashion_mnist: Option<String>,
    /// Small sizes: a smoke run.
    #[arg(long)]
    quick: bool,
    /// Write the report to FILE (default: standard output).
    #[arg(long, value_name = "FILE")]
    out: Option<String>,
}

fn main() {
    use clap::Parser;
    let args = Args::parse();
    let command: Vec<String> = std::env::args().collect();
    let quick = args.quick;
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("gradwire-gpu-check: {e}");
            std::process::exit(2);
        }
    };
    let (major, minor) = dev.context().compute_capability().unwrap_or((0, 0));
    let mut report = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "revision": option_env!("GRADWIRE_REVISION").unwrap_or("unknown"),
        "command": command.join(" "),
        "device": dev.name().unwrap_or_default(),
        "compute_capability": format!("{major}.{minor}"),
    });
    let wants = |s: &str| args.only.is_empty() || args.only.iter().any(|x| x == s);
    let mut ok = true;
    if wants("codecs") {
        let v = codecs(&dev, quick).unwrap_or_else(|e| json!({"error": e.to_string()}));
        ok &= v["all_identical"] == json!(true);
        report["codecs"] = v;
    }
    if wants("bench") {
        report["bench"] = bench(&dev, quick, args.data.as_deref())
            .unwrap_or_else(|e| json!({"error": e.to_string()}));
    }
    if wants("allreduce") {
        report["allreduce"] =
            allreduce(&dev, quick).unwrap_or_else(|e| json!({"error": e.to_string()}));
    }
    if wants("train") {
        if let Some(dir) = &args.fashion_mnist {
            report["train"] = train::train(&dev, std::path::Path::new(dir), quick)
                .unwrap_or_else(|e| json!({"error": e.to_string()}));
        }
    }
    let text = serde_json::to_string_pretty(&report).expect("json");
    match &args.out {
        Some(f) => std::fs::write(f, &text).expect("write report"),
        None => println!("{text}"),
    }
    std::process::exit(if ok { 0 } else { 1 });
}
