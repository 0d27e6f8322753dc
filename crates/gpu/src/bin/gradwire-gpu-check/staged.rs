//! Device tensors through the engine (`gradwire_gpu::staged::Stager`) between rank threads
//! sharing the GPU: DGC 1% (sparse strategy), QSGD 4-bit (gather) and a dense tensor, three
//! steps, once copied down whole and once with the device codecs encoding on the GPU. Both
//! must give, bit for bit, what the same engines give for the same values submitted from
//! host memory; the stager's counts say what came to the host.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, DevicePtr as _};
use gradwire_engine::{Engine, EngineConfig, Rule, Selector, Strategy, TensorSpec};
use gradwire_gpu::device::{pattern, Device};
use gradwire_gpu::staged::cuda::CudaApi;
use gradwire_gpu::staged::device_codecs::DeviceCodecs;
use gradwire_gpu::staged::{DevicePtr, RawStream, Stager};
use gradwire_transport::local::Local;
use serde_json::{json, Value};

use crate::ranks::on_ranks;
use crate::R;

const STEPS: u64 = 3;
const RANKS: usize = 2;

fn config() -> EngineConfig {
    let rule = |name: &str, codec: &str, strategy| Rule {
        select: Selector::Name(name.into()),
        codec: codec.parse().expect("a valid spec"),
        strategy,
    };
    EngineConfig {
        rules: vec![
            rule("w", "dgc:ratio=0.01", Strategy::Auto),
            rule("q", "qsgd:bits=4", Strategy::Gather),
        ],
        seed: 7,
        ..Default::default()
    }
}

/// Step `step`'s value at element `i` on `rank` (the device pattern, shifted per step and
/// tensor so that steps differ).
fn value(i: usize, rank: usize, step: u64, tensor: usize) -> f32 {
    pattern(i + 31 * step as usize + 7 * tensor, rank as u32) / 16.0
}

/// Every rank's results (bits, per step and tensor), the stager's counts and the seconds
/// each step took on rank 0, for `mode`: `host` (values submitted from host memory),
/// `staged` (device tensors copied down whole) or `encoded` (device codecs).
type Run = (Vec<Bits>, Value, Vec<f64>);

/// One rank's results: per step, per tensor, the values' bits.
type Bits = Vec<Vec<Vec<u32>>>;

fn run(dev: &Device, mode: &'static str, tensors: &[TensorSpec]) -> R<Run> {
    let tensors = tensors.to_vec();
    let dev = dev.clone();
    let results = on_ranks(Local::world(RANKS), move |rank, t| {
        let engine = Arc::new(Engine::start(t, config(), &tensors)?);
        let stream = dev.new_stream()?;
        let mut bufs: Vec<CudaSlice<f32>> = tensors
            .iter()
            .map(|t| stream.alloc_zeros::<f32>(t.len()))
            .collect::<Result<_, _>>()?;
        let stager = match mode {
            "host" => None,
            "staged" => Some(Stager::new(CudaApi::primary(0)?, engine.clone())?),
            _ => Some(Stager::with_encoder(
                CudaApi::primary(0)?,
                engine.clone(),
                Box::new(DeviceCodecs::new(dev.clone())?),
            )?),
        };
        let raw = RawStream(stream.cu_stream() as u64);
        let (mut out, mut secs): (Bits, Vec<f64>) = (Vec::new(), Vec::new());
        for step in 0..STEPS {
            engine.set_progress(step, step as f32 / 10.0);
            let host: Vec<Vec<f32>> = tensors
                .iter()
                .enumerate()
                .map(|(k, t)| (0..t.len()).map(|i| value(i, rank, step, k)).collect())
                .collect();
            for (b, h) in bufs.iter_mut().zip(&host) {
                stream.memcpy_htod(h, b)?;
            }
            let t0 = Instant::now();
            let got: Vec<Vec<f32>> = match &stager {
                None => {
                    let hs = engine.all_reduce_batch(
                        tensors.iter().zip(host).map(|(t, h)| (t.name.clone(), h)),
                    );
                    hs.into_iter().map(|h| h.wait()).collect::<Result<_, _>>()?
                }
                Some(st) => {
                    let ptrs: Vec<u64> = bufs.iter().map(|b| b.device_ptr(&stream).0).collect();
                    // SAFETY: the buffers live until the end and nothing writes them until
                    // their copies back, queued on `stream`, are done.
                    let staged: Vec<_> = tensors
                        .iter()
                        .zip(&ptrs)
                        .map(|(t, &p)| unsafe {
                            st.all_reduce(&t.name, DevicePtr(p), t.len(), raw, 1.0)
                        })
                        .collect::<Result<_, _>>()?;
                    st.flush();
                    for ((t, &p), s) in tensors.iter().zip(&ptrs).zip(staged) {
                        // SAFETY: as above.
                        unsafe { s.wait_into(DevicePtr(p), t.len(), raw, 1.0) }?;
                    }
                    bufs.iter()
                        .map(|b| stream.clone_dtoh(b))
                        .collect::<Result<_, _>>()?
                }
            };
            secs.push(t0.elapsed().as_secs_f64());
            out.push(
                got.iter()
                    .map(|v| v.iter().map(|x| x.to_bits()).collect())
                    .collect(),
            );
        }
        let stats = stager.as_ref().map(|s| s.stats()).unwrap_or_default();
        drop(stager);
        Arc::into_inner(engine)
            .ok_or("the engine is still shared")?
            .shutdown()?;
        let stats = json!({
            "staged": stats.staged, "staged_bytes": stats.staged_bytes,
            "encoded": stats.encoded, "encoded_bytes": stats.encoded_bytes,
            "payload_bytes": stats.payload_bytes,
        });
        Ok((out, stats, secs))
    })?;
    let (stats, secs) = (results[0].1.clone(), results[0].2.clone());
    let bits = results.into_iter().map(|r| r.0).collect();
    Ok((bits, stats, secs))
}

pub(crate) fn staged(dev: &Device, quick: bool) -> R<Value> {
    let n: usize = if quick { 1 << 16 } else { 1 << 22 };
    let tensors = vec![
        TensorSpec::new("w", [n / 1024, 1024]),
        TensorSpec::new("q", [n]),
        TensorSpec::new("d", [10_000]),
    ];
    let (reference, _, host_secs) = run(dev, "host", &tensors)?;
    let mut rows = Vec::new();
    let mut all_equal = true;
    for mode in ["staged", "encoded"] {
        let (bits, stats, secs) = run(dev, mode, &tensors)?;
        let equal = bits == reference;
        all_equal &= equal;
        rows.push(json!({
            "mode": mode, "equal_to_host_submission": equal, "stats_rank0": stats,
            "step_seconds_rank0": secs,
        }));
    }
    Ok(json!({
        "ranks": RANKS, "steps": STEPS,
        "tensors": tensors.iter().map(|t| json!({"name": t.name, "len": t.len()})).collect::<Vec<_>>(),
        "codecs": {"w": "dgc:ratio=0.01", "q": "qsgd:bits=4@gather", "d": "none"},
        "host_step_seconds_rank0": host_secs,
        "rows": rows, "all_equal": all_equal,
    }))
}
