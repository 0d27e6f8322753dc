//! Encode time of DGC, top-k and QSGD on large device buffers, against the device's own copy
//! of the same buffer.

use std::time::Instant;

use cudarc::driver::CudaSlice;
use gradwire_codec::{BuildContext, CodecConfig, Progress};
use gradwire_gpu::codec;
use gradwire_gpu::device::Device;
use serde_json::{json, Value};

use crate::codecs::grad;
use crate::R;

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

pub(crate) fn bench(dev: &Device, quick: bool, data: Option<&str>) -> R<Value> {
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
