//! One step of the engine averaging a model's gradient with a codec, measured on this
//! machine.
//!
//! This file owns the engine's own cost over the bare codec's (error feedback, stripe and
//! factor planning, PowerSGD's orthogonalization and decompression, the progress thread):
//! two in-process ranks over the `local` transport, no link emulation, so what is timed is
//! the engine's CPU work and its copies; and the factor by which that cost exceeds the bare
//! codec's as the cost model predicts it ([`engine_factor`]).

use std::time::Instant;

use gradwire_engine::codec::CodecConfig;
use gradwire_engine::{Engine, EngineConfig, TensorSpec};
use gradwire_transport::local::Local;

use gradwire_sim::{step, CodecProfile, ModelProfile, Network, Scenario, StepBreakdown};

use super::{median, MeasureError, Result, Stack, MIN_PASSES, WARMUP_PASSES};

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
/// A codec's step through the engine against the cost model's prediction of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineFactor {
    /// Seconds per step measured through the engine ([`engine_step_time`]).
    pub measured_s: f64,
    /// The cost model's step of the bare codec at two ranks over the stack's own network,
    /// without compute.
    pub predicted: StepBreakdown,
    /// What the codec's costs are multiplied by so that the prediction meets the measurement:
    /// `(measured - communication) / codec`, never below 1 (1 without codec work).
    pub factor: f64,
}

/// The engine's cost over the bare codec's: `codec` (the cost model's profile of `config`,
/// its costs measured bare) through the engine at two ranks in this process
/// ([`engine_step_time`] on `grad`, the tensors of `specs`), against its predicted step over
/// a network of the `stack`'s costs (the copies between two in-process ranks cost about the
/// stack's per-byte time), for a model of `model`'s tensors without compute.
#[allow(clippy::too_many_arguments)]
pub fn engine_factor(
    config: &CodecConfig,
    specs: &[TensorSpec],
    grad: &[f32],
    seed: u64,
    model: &ModelProfile,
    codec: &CodecProfile,
    stack: &Stack,
    fusion_bytes: usize,
) -> Result<EngineFactor> {
    let measured_s = engine_step_time(config, specs, grad, seed)?;
    let scenario = Scenario {
        workers: 2,
        network: Network::new(stack.alpha, stack.beta, stack.gamma)?,
        overlap: 0.0,
        fusion_bytes,
        host: None,
    };
    let no_compute = ModelProfile {
        compute_s: 0.0,
        ..model.clone()
    };
    let predicted = step(&no_compute, codec, &scenario)?;
    Ok(EngineFactor {
        measured_s,
        predicted,
        factor: factor(measured_s, &predicted),
    })
}

/// `(measured - communication) / codec`, at least 1; 1 without codec work.
fn factor(measured_s: f64, predicted: &StepBreakdown) -> f64 {
    if predicted.codec_s > 0.0 {
        ((measured_s - predicted.comm_s) / predicted.codec_s).max(1.0)
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_factor_is_what_the_codec_costs_must_grow_by_never_below_one() {
        let b = |comm_s, codec_s| StepBreakdown {
            compute_s: 0.0,
            codec_s,
            comm_s,
            hidden_s: 0.0,
            step_s: comm_s + codec_s,
        };
        // 10 ms measured, 2 ms of copies and 4 ms of codec predicted: the codec took 8 ms.
        assert!((factor(0.010, &b(0.002, 0.004)) - 2.0).abs() < 1e-12);
        // Faster than predicted: 1, never a discount.
        assert_eq!(factor(0.001, &b(0.002, 0.004)), 1.0);
        assert_eq!(factor(0.010, &b(0.002, 0.0)), 1.0);
    }
}
