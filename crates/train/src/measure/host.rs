//! A whole training step of P ranks that share the cores of one host, measured rather than
//! scaled (`gradwire simulate --host-cores`).
//!
//! This file owns one rank's part ([`rank_steps`]: its training steps with its gradient
//! all-reduced through an engine); the summary of all ranks' timings ([`summarize`],
//! [`HostStep`]) is arithmetic, `gradwire_sim::lockstep`'s. Starting the P ranks (processes
//! of the CLI joined over TCP on 127.0.0.1 without link emulation, as `gradwire train`'s
//! workers are) and gathering their timings is the CLI's. A step so measured holds all its CPU work (compute, the codec, the engine's
//! planning and copies, the TCP stack, and the ranks' contention for the cores while they do
//! it); a step's compute is, per pass, the slowest rank's.
//!
//! Why measured: a synchronous step waits for the last rank's gradient, and ranks that share
//! cores contend for more than the cores (memory, caches). In the validation at `2bdd68f`
//! (2026-12-03), 8 ranks on 2 cores passed in 44-58 ms each, the slowest of each pass 49-65
//! ms, against 32 ms for one process's 8 ms scaled by `P / cores`; the scaled figure
//! under-predicted every DGC and 1-bit SGD cell over 1 Gbit/s by 16-39%, the lockstep one
//! came within 5% at 4 and 8 ranks there. Each rank computes with the threads `gradwire
//! train` would give its worker process; on the one global pool, 2 ranks on 2 cores read up
//! to twice the runs' compute (validation at `910f55f`, 2026-12-04). Why the whole step
//! (`feb217b`): the codec costs measured with the machine to itself and multiplied by `P /
//! cores` left out CPU work the runs do, and the runs' compute reads more than the
//! compute-only lockstep's because the other ranks' codec work shares the cores with it: 8
//! ranks of 1-bit SGD without a link stepped in 121-146 ms against 103 ms predicted that way.
//! Each pass is what the trainer counts as compute (forward, backward, an SGD-with-momentum
//! update over every parameter, the parameters handed back to the model); every rank has its
//! own model copy.

use std::time::Instant;

use gradwire_engine::{Engine, EngineConfig, TensorSpec};
use gradwire_transport::Transport;

pub use gradwire_sim::lockstep::{summarize, HostStep, Lockstep};

use super::{MeasureError, Result, WARMUP_PASSES};
use crate::data::Batch;
use crate::Model;

/// Lockstep passes timed per rank (after [`WARMUP_PASSES`]).
pub const LOCKSTEP_PASSES: usize = 40;
/// The most ranks measured sharing one host (each holds a model copy; beyond this the
/// measurement would take minutes and gigabytes).
pub const MAX_SHARED_WORKERS: usize = 64;

/// One rank's training steps through an engine over `transport` with `config`: for
/// [`LOCKSTEP_PASSES`] passes after [`WARMUP_PASSES`], forward and backward on `batch`, the
/// gradient all-reduced (output layer first, as a backward pass hands the tensors over and
/// the trainer submits them; the engine past any warm-up), then an SGD-with-momentum update
/// at rate zero and the parameters handed back. Returns this rank's compute per timed pass
/// (the pass less the all-reduce), the mean seconds per step over the timed passes (the
/// collective keeps the ranks in step), and the transport back.
pub fn rank_steps<T: Transport + 'static>(
    mut model: Box<dyn Model>,
    batch: &Batch,
    transport: T,
    config: &EngineConfig,
) -> Result<(Vec<f64>, f64, Box<dyn Transport>)> {
    let tensors = model.tensors();
    let specs: Vec<TensorSpec> = tensors.iter().map(crate::ParamTensor::spec).collect();
    let mut ranges = Vec::with_capacity(tensors.len());
    let mut at = 0;
    for t in &tensors {
        ranges.push(at..at + t.len());
        at += t.len();
    }
    let engine = Engine::start(transport, config.clone(), &specs)?;
    let (mut grad, mut params) = (Vec::new(), Vec::new());
    model.params(&mut params);
    let mut velocity = vec![0f32; params.len()];
    let lr = std::hint::black_box(0.0f32);
    let mut compute = Vec::with_capacity(LOCKSTEP_PASSES);
    let mut timed_from = None;
    for i in 0..WARMUP_PASSES + LOCKSTEP_PASSES {
        let t0 = Instant::now();
        if i == WARMUP_PASSES {
            timed_from = Some(t0);
        }
        model
            .forward_backward(batch, &mut grad)
            .map_err(MeasureError::Model)?;
        let fb = t0.elapsed();
        engine.set_progress(1_000_000, 1_000.0);
        let handles = engine.all_reduce_batch_unflushed(
            (0..specs.len())
                .rev()
                .map(|j| (specs[j].name.as_str(), grad[ranges[j].clone()].to_vec())),
        );
        for (j, h) in (0..specs.len()).rev().zip(handles) {
            let got = h.wait()?;
            grad[ranges[j].clone()].copy_from_slice(&got);
        }
        let t1 = Instant::now();
        for ((p, v), g) in params.iter_mut().zip(&mut velocity).zip(&grad) {
            *v = 0.9 * *v + g;
            *p -= lr * *v;
        }
        model.set_params(&params);
        if i >= WARMUP_PASSES {
            compute.push((fb + t1.elapsed()).as_secs_f64());
        }
    }
    let step_s = timed_from.map_or(0.0, |t| t.elapsed().as_secs_f64() / LOCKSTEP_PASSES as f64);
    let t = engine.shutdown()?;
    Ok((compute, step_s, t))
}
