//! The device codecs against their CPU twins: the same gradients through both, payloads
//! compared byte for byte at every step, each device payload decoded by the CPU codec.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaStream;
use gradwire_codec::external::uniform;
use gradwire_codec::{BuildContext, Codec, CodecConfig, Progress, TensorInfo, TensorRole};
use gradwire_gpu::codec;
use gradwire_gpu::device::Device;
use serde_json::{json, Value};

use crate::R;

pub(crate) fn grad(n: usize, step: u32) -> Vec<f32> {
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
        if let Some(shared) = cpu.shared_scalars() {
            let lc = shared.local_scalars(&g);
            let lg = gpu.local_scalars(&dg.as_view())?;
            // Agree on a scale above both (as the max over ranks would be).
            let agreed: Vec<f32> = lc.iter().zip(&lg).map(|(a, b)| a.max(*b) * 1.25).collect();
            shared.set_shared_scalars(&agreed);
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

pub(crate) fn codecs(dev: &Device, quick: bool) -> R<Value> {
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
