//! Collective timings per message size: for each size, `warmup` untimed and then `iters`
//! timed calls of the collective, each after a barrier; per iteration the slowest rank's
//! time (an all-reduce of the times with `Max`), then the median, and the bus bandwidth
//! `bytes x factor / median` (nccl-tests convention: all-reduce moves `2(P-1)/P` of the
//! bytes, all-gather `(P-1)/P`, broadcast all of them).

use std::time::Instant;

use gradwire_transport::Transport;
use serde::{Deserialize, Serialize};

use super::BenchError;
use crate::{Algorithm, Collectives, ReduceOp};

/// Which collective to time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchOp {
    /// Sum all-reduce of f32.
    Allreduce,
    /// All-gather; the size is the gathered total.
    Allgather,
    /// Broadcast from rank 0.
    Broadcast,
}

impl BenchOp {
    /// The fraction of the message's bytes the bus bandwidth counts for `world` ranks.
    pub fn bus_factor(self, world: usize) -> f64 {
        let p = world as f64;
        match self {
            BenchOp::Allreduce => 2.0 * (p - 1.0) / p,
            BenchOp::Allgather => (p - 1.0) / p,
            BenchOp::Broadcast => 1.0,
        }
    }
}

/// What to time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchSpec {
    /// The collective.
    pub op: BenchOp,
    /// Message sizes in bytes (each at least 4).
    pub sizes: Vec<usize>,
    /// The flat all-reduce's algorithm.
    pub algo: Algorithm,
    /// Timed iterations per size (`None`: [`iterations`]'s default).
    pub iters: Option<usize>,
    /// Untimed iterations per size first.
    pub warmup: usize,
}

/// The timing of one size (a JSON shape other tools read: keep the field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeResult {
    /// Message size in bytes.
    pub bytes: usize,
    /// Median over iterations of the slowest rank's time, microseconds.
    pub median_us: f64,
    /// Bus bandwidth, GB/s (1e9 bytes).
    pub busbw_gbps: f64,
}

/// An all-reduce other than the flat one over the job's transport: the hierarchical
/// all-reduce over the job's hosts.
pub trait HierarchicalAllReduce {
    /// All-reduces `buf` with `op`; `world` is the job's transport. Every rank calls it.
    fn all_reduce_f32(
        &mut self,
        world: &mut dyn Transport,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> crate::Result<()>;
}

/// Timed iterations for a size: `requested`, else many for small messages, fewer for large
/// (256 MiB worth, from 10 to 200).
pub fn iterations(bytes: usize, requested: Option<usize>) -> usize {
    requested.unwrap_or_else(|| ((256usize << 20) / bytes.max(1)).clamp(10, 200))
}

/// Times every size of `spec` on this rank; all ranks return the same results. All-reduces
/// go through `hier` when given, else the flat all-reduce with `spec.algo`.
pub fn measure(
    t: &mut dyn Transport,
    mut hier: Option<&mut dyn HierarchicalAllReduce>,
    spec: &BenchSpec,
) -> Result<Vec<SizeResult>, BenchError> {
    if let Some(&bytes) = spec.sizes.iter().find(|&&s| s < 4) {
        return Err(BenchError::SizeTooSmall { bytes });
    }
    let np = t.world_size();
    let mut results = Vec::new();
    for &bytes in &spec.sizes {
        let elems = bytes / 4;
        let iters = iterations(bytes, spec.iters);
        let mut buf: Vec<f32> = (0..elems).map(|i| (i % 13) as f32).collect();
        let gathered = if spec.op == BenchOp::Allgather {
            elems / np * np
        } else {
            0
        };
        let mut out = vec![0f32; gathered];
        let mine = elems / np;
        let mut times = vec![0f64; iters];
        for i in 0..spec.warmup + iters {
            t.barrier()?;
            let start = Instant::now();
            match spec.op {
                BenchOp::Allreduce => match hier.as_deref_mut() {
                    Some(h) => h.all_reduce_f32(t, &mut buf, ReduceOp::Sum)?,
                    None => t.all_reduce_with(&mut buf, ReduceOp::Sum, spec.algo)?,
                },
                BenchOp::Allgather => t.all_gather_into(&buf[..mine], &mut out)?,
                BenchOp::Broadcast => t.broadcast(&mut buf, 0)?,
            }
            let dt = start.elapsed().as_secs_f64();
            if i >= spec.warmup {
                times[i - spec.warmup] = dt;
            }
            if spec.op == BenchOp::Allreduce && i % 8 == 7 {
                // Keep the values bounded across iterations.
                buf.iter_mut()
                    .enumerate()
                    .for_each(|(j, x)| *x = (j % 13) as f32);
            }
        }
        // Slowest rank per iteration, then the median.
        t.all_reduce(&mut times, ReduceOp::Max)?;
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let busbw = if median > 0.0 {
            bytes as f64 * spec.op.bus_factor(np) / median / 1e9
        } else {
            0.0
        };
        results.push(SizeResult {
            bytes,
            median_us: median * 1e6,
            busbw_gbps: busbw,
        });
    }
    Ok(results)
}
