//! Compute of P ranks that share the cores of one host (`gradwire simulate --host-cores`),
//! measured rather than scaled: P copies of the model run their training passes at once, in
//! lockstep as data-parallel ranks do, and a step's compute is the slowest rank's pass.
//!
//! Why measured: a synchronous step waits for the last rank's gradient, and ranks that share
//! cores contend for more than the cores (memory, caches). In session 16's validation, 8 ranks
//! on 2 cores passed in 44-58 ms each, the slowest of each pass 49-65 ms, against 32 ms for one
//! process's 8 ms scaled by `P / cores`; the scaled figure under-predicted every DGC and
//! 1-bit SGD cell over 1 Gbit/s by 16-39%, the lockstep one came within 5% at 4 and 8 ranks
//! there. Each rank computes with the threads `gradwire train` would give its worker
//! process; on the one global pool, 2 ranks on 2 cores read up to twice the runs' compute
//! (session 19, `docs/simulate.md`). With more ranks than cores, a rank's wire hides behind
//! the others' compute; that is the prediction's shared-host term (`gradwire_sim::predict`),
//! not part of this measurement. Each pass is what the trainer counts as compute (forward, backward, an
//! SGD-with-momentum update over every parameter, the parameters handed back to the model);
//! every rank has its own model copy.

use std::sync::Barrier;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gradwire_train::data::{Batch, DataShape};
use gradwire_train::{Model, ModelKind};

use crate::simulate::WARMUP_PASSES;

/// Lockstep passes timed per rank (after [`WARMUP_PASSES`]).
pub const LOCKSTEP_PASSES: usize = 40;
/// The most ranks measured sharing one host (each holds a model copy; beyond this the
/// measurement would take minutes and gigabytes).
pub const MAX_SHARED_WORKERS: usize = 64;

/// Compute per step of `workers` ranks sharing the host.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Lockstep {
    /// Ranks measured.
    pub workers: usize,
    /// Mean seconds of one rank's pass (what a rank's own compute timer reads).
    pub mean_s: f64,
    /// Mean over passes of the slowest rank's seconds (what the synchronous step waits for).
    pub slowest_s: f64,
}

/// Per pass, the slowest rank's time; then the mean over passes, and the mean of all passes.
/// `times[r][i]` is rank `r`'s pass `i`; every rank has the same number of passes.
pub fn summarize(times: &[Vec<f64>]) -> Lockstep {
    let workers = times.len();
    let passes = times.first().map_or(0, Vec::len);
    if workers == 0 || passes == 0 {
        return Lockstep {
            workers,
            mean_s: 0.0,
            slowest_s: 0.0,
        };
    }
    let slowest: f64 = (0..passes)
        .map(|i| times.iter().map(|t| t[i]).fold(0.0, f64::max))
        .sum::<f64>()
        / passes as f64;
    let mean = times.iter().flatten().sum::<f64>() / (workers * passes) as f64;
    Lockstep {
        workers,
        mean_s: mean,
        slowest_s: slowest,
    }
}

/// Runs `workers` model copies at once, each pass started together (a barrier stands in for
/// the step's all-reduce), and summarizes their pass times. Each rank computes with
/// `threads_per_rank` threads of its own, as `gradwire train` sizes each worker process
/// (the host's cores divided among its ranks): ranks sharing the one global pool read up to
/// twice the runs' compute at 2 ranks on 2 cores (session 19).
pub fn lockstep_compute(
    kind: ModelKind,
    data: DataShape,
    seed: u64,
    batch: &Batch,
    workers: usize,
    threads_per_rank: usize,
) -> Result<Lockstep> {
    if workers == 0 || workers > MAX_SHARED_WORKERS {
        bail!(
            "--host-cores measures the workers' compute on this host, 1 to \
             {MAX_SHARED_WORKERS} of them; got {workers}"
        );
    }
    let models = (0..workers)
        .map(|_| kind.build(data, seed).context("building a rank's model"))
        .collect::<Result<Vec<_>>>()?;
    let barrier = Barrier::new(workers);
    let times = std::thread::scope(|s| {
        let handles: Vec<_> = models
            .into_iter()
            .map(|model| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Vec<f64>> {
                    gradwire_train::with_threads(threads_per_rank, || {
                        rank_passes(model, batch, barrier)
                    })
                    .map_err(anyhow::Error::msg)?
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a rank's compute measurement panicked"))?
            })
            .collect::<Result<Vec<_>>>()
    })?;
    Ok(summarize(&times))
}

/// One rank's timed passes, each after the barrier.
fn rank_passes(mut model: Box<dyn Model>, batch: &Batch, barrier: &Barrier) -> Result<Vec<f64>> {
    let (mut grad, mut params) = (Vec::new(), Vec::new());
    model.params(&mut params);
    let mut velocity = vec![0f32; params.len()];
    let lr = std::hint::black_box(0.0f32);
    let mut times = Vec::with_capacity(LOCKSTEP_PASSES);
    let mut failed = None;
    for i in 0..WARMUP_PASSES + LOCKSTEP_PASSES {
        // Every rank reaches every barrier, even after its pass failed, so
        // that the others never wait forever.
        barrier.wait();
        if failed.is_some() {
            continue;
        }
        let t = Instant::now();
        if let Err(e) = model.forward_backward(batch, &mut grad) {
            failed = Some(e);
            continue;
        }
        for ((p, v), g) in params.iter_mut().zip(&mut velocity).zip(&grad) {
            *v = 0.9 * *v + g;
            *p -= lr * *v;
        }
        model.set_params(&params);
        if i >= WARMUP_PASSES {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    match failed {
        Some(e) => Err(e).context("a rank's training pass"),
        None => Ok(times),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_waits_for_the_slowest_rank_of_each_pass() {
        // Two ranks, three passes: the slowest of each pass is 3, 5, 4 (mean 4); all six
        // passes average 3.
        let times = vec![vec![3.0, 1.0, 4.0], vec![2.0, 5.0, 3.0]];
        let l = summarize(&times);
        assert_eq!(l.workers, 2);
        assert!((l.slowest_s - 4.0).abs() < 1e-12, "{l:?}");
        assert!((l.mean_s - 3.0).abs() < 1e-12, "{l:?}");
        assert_eq!(summarize(&[]).slowest_s, 0.0);
    }

    #[test]
    fn lockstep_ranks_each_train_their_own_copy() {
        let data = DataShape::Image {
            shape: [1, 28, 28],
            classes: 10,
        };
        let batch = crate::simulate::synthetic_batch(8, [1, 28, 28], 1);
        let kind: ModelKind = "mlp".parse().unwrap();
        let l = lockstep_compute(kind, data, 1, &batch, 3, 1).unwrap();
        assert_eq!(l.workers, 3);
        assert!(l.mean_s > 0.0 && l.slowest_s >= l.mean_s, "{l:?}");
        let err = lockstep_compute(kind, data, 1, &batch, MAX_SHARED_WORKERS + 1, 1).unwrap_err();
        assert!(err.to_string().contains("1 to 64"), "{err}");
    }
}
