//! One step of the engine averaging a model's gradient with a codec, measured on this
//! machine.
//!
//! This file owns the engine's own cost over the bare codec's (error feedback, stripe and
//! factor planning, PowerSGD's orthogonalization and decompression, the progress thread):
//! two in-process ranks over the `local` transport, no link emulation, so what is timed is
//! the engine's CPU work and its copies.

use std::time::Instant;

use gradwire_engine::codec::CodecConfig;
use gradwire_engine::{Engine, EngineConfig, TensorSpec};
use gradwire_transport::local::Local;

use super::{median, MeasureError, Result, MIN_PASSES, WARMUP_PASSES};

/// Engine steps timed per codec by [`engine_step_time`] (after [`WARMUP_PASSES`]).
pub const ENGINE_STEPS: usize = MIN_PASSES;

/// Median seconds per step for the engine to average `grad` (the tensors of `specs` one after
/// the other) with `codec`, on two in-process ranks: rank 0's time to submit every tensor,
/// flush and wait for all, over [`ENGINE_STEPS`] steps after [`WARMUP_PASSES`]. The engine
/// runs past any warm-up (DGC's sparsity schedule), as [`super::measure_codec`] does.
pub fn engine_step_time(
    codec: &CodecConfig,
    specs: &[TensorSpec],
    grad: &[f32],
    seed: u64,
) -> Result<f64> {
    let config = EngineConfig {
        codec: codec.clone(),
        seed,
        ..EngineConfig::default()
    };
    let threads: Vec<_> = Local::world(2)
        .into_iter()
        .map(|t| {
            let (config, specs, grad) = (config.clone(), specs.to_vec(), grad.to_vec());
            std::thread::spawn(move || -> Result<f64> {
                let engine = Engine::start(t, config, &specs)?;
                // Past any warm-up (DGC's sparsity schedule), as measure_codec.
                engine.set_progress(1_000_000, 1_000.0);
                let mut times = Vec::new();
                // A fixed count, the same on both ranks (each step is a collective).
                for i in 0..WARMUP_PASSES + ENGINE_STEPS {
                    let t0 = Instant::now();
                    let mut off = 0;
                    let handles: Vec<_> = specs
                        .iter()
                        .map(|s| {
                            let n = s.len();
                            off += n;
                            engine.all_reduce(&s.name, grad[off - n..off].to_vec())
                        })
                        .collect();
                    engine.flush();
                    for h in handles {
                        h.wait()?;
                    }
                    if i >= WARMUP_PASSES {
                        times.push(t0.elapsed().as_secs_f64());
                    }
                }
                engine.shutdown()?;
                Ok(median(times))
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in threads {
        out.push(
            t.join()
                .map_err(|_| MeasureError::Panicked("an engine rank"))??,
        );
    }
    Ok(out[0])
}
