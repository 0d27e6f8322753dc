//! Parameter-server throughput against the all-reduce of the same size, for `gradwire bench
//! ps`: run by every worker of a job (a rank mesh for the all-reduce and the barriers, and
//! the addresses of running shards).
//!
//! Per size, every worker times, after a barrier on the rank mesh before each repetition
//! (two untimed warm-ups first):
//! - `allreduce`: one all-reduce (sum) of the buffer over the mesh (gradwire-collective's
//!   automatic algorithm), the baseline;
//! - `push_pull`: one synchronous-round [`KvStore::push_pull`] of the buffer as a gradient
//!   (an SGD updater on the shards): what a ps-sync training step costs in communication;
//! - `push` and `pull`: one push to, and one pull from, an asynchronous table, alone (all
//!   workers at once): the two directions of a Downpour step;
//! - `apply`: the shards' arithmetic for one round, measured locally: averaging P pushes and
//!   one SGD update over this size divided among S shards (the work of the busiest shard).
//!
//! Times are the slowest rank's per repetition, then the median. Bytes are the frames the
//! worker's client wrote and read per `push_pull` (measured), against the ring all-reduce's
//! `2 (P-1)/P · n · 4` sent and as many received per rank. The ratio is `push_pull /
//! allreduce` (above 1: the PS is slower).

use std::net::SocketAddr;
use std::time::Instant;

use gradwire_collective::{Collectives, ReduceOp};
use gradwire_transport::Transport;
use serde::{Deserialize, Serialize};

use crate::{
    apply_update, ClientConfig, Consistency, Key, KvStore, OptState, TableSpec, UpdaterSpec,
    WorkerId,
};

/// Errors of [`measure`].
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// No shard address was given.
    #[error("no shard addresses to bench against")]
    NoServers,
    /// No timed repetitions were asked for.
    #[error("at least one timed repetition is needed")]
    NoReps,
    /// The client could not reach the shards.
    #[error("connecting to the shards")]
    Connect(#[source] crate::Error),
    /// A parameter-server call failed.
    #[error(transparent)]
    Ps(#[from] crate::Error),
    /// A collective over the rank mesh failed.
    #[error(transparent)]
    Collective(#[from] gradwire_collective::Error),
}

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PsBenchSpec {
    /// The shards' addresses.
    pub servers: Vec<SocketAddr>,
    /// Timed repetitions per size and mode (after two warm-ups).
    pub reps: usize,
    /// The sizes: a name for the report and the number of f32.
    pub sizes: Vec<(String, usize)>,
}

/// One size's medians (a JSON shape other tools read: keep the field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeResult {
    /// The size's name (`lenet`, `16mib`).
    pub name: String,
    /// Elements (f32).
    pub floats: usize,
    /// Median all-reduce time, ms.
    pub allreduce_ms: f64,
    /// Median synchronous push_pull time, ms.
    pub push_pull_ms: f64,
    /// `push_pull_ms / allreduce_ms`.
    pub ratio: f64,
    /// Median asynchronous push time, ms.
    pub push_ms: f64,
    /// Median asynchronous pull time, ms.
    pub pull_ms: f64,
    /// The busiest shard's arithmetic per round (average P pushes, one SGD update), ms.
    pub apply_ms: f64,
    /// Frame bytes one worker wrote plus read per push_pull (measured).
    pub ps_bytes_per_worker: u64,
    /// Bytes one rank sends plus receives per ring all-reduce (`2 · 2(P-1)/P · 4n`).
    pub allreduce_bytes_per_rank: u64,
}

/// Bytes one rank sends plus receives per ring all-reduce of `n` f32 over `world` ranks.
pub fn ring_bytes_per_rank(n: usize, world: usize) -> u64 {
    let p = world as f64;
    (2.0 * 2.0 * (p - 1.0) / p * 4.0 * n as f64) as u64
}

/// Slowest rank per repetition, then the median, in ms.
fn median_ms<T: Transport + ?Sized>(t: &mut T, mut times: Vec<f64>) -> Result<f64, BenchError> {
    t.all_reduce(&mut times, ReduceOp::Max)?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2] * 1e3)
}

/// Times `op` `reps` times after two warm-ups, a barrier before each.
fn time<T: Transport + ?Sized>(
    t: &mut T,
    reps: usize,
    mut op: impl FnMut(&mut T) -> Result<(), BenchError>,
) -> Result<Vec<f64>, BenchError> {
    let mut times = Vec::with_capacity(reps);
    for i in 0..reps + 2 {
        t.barrier()?;
        let start = Instant::now();
        op(t)?;
        if i >= 2 {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    Ok(times)
}

/// The busiest shard's arithmetic for one round, `reps` times: average `np` pushes of
/// `grad`'s first `slice` elements, then one `sgd` update. Seconds per repetition.
fn apply_times(grad: &[f32], slice: usize, np: usize, sgd: &UpdaterSpec, reps: usize) -> Vec<f64> {
    let mut w = grad[..slice].to_vec();
    let mut acc = vec![0.0f32; slice];
    let mut st = OptState::default();
    let times = (0..reps)
        .map(|_| {
            let start = Instant::now();
            acc.iter_mut().for_each(|a| *a = 0.0);
            for _ in 0..np {
                for (a, g) in acc.iter_mut().zip(&grad[..slice]) {
                    *a += g;
                }
            }
            let inv = 1.0 / np as f32;
            acc.iter_mut().for_each(|a| *a *= inv);
            apply_update(sgd, &mut st, &mut w, &acc);
            start.elapsed().as_secs_f64()
        })
        .collect();
    std::hint::black_box(&w);
    times
}

/// Measures every size of `spec` on this worker (rank of `t`, which numbers the workers);
/// every worker calls it with the same spec and returns the same results. Tables use keys
/// from 10 up; the client leaves the shards after the last size.
pub fn measure<T: Transport + ?Sized>(
    t: &mut T,
    spec: &PsBenchSpec,
) -> Result<Vec<SizeResult>, BenchError> {
    let (rank, np) = (t.rank(), t.world_size());
    let servers = spec.servers.len();
    if servers == 0 {
        return Err(BenchError::NoServers);
    }
    if spec.reps == 0 {
        return Err(BenchError::NoReps);
    }
    let reps = spec.reps;
    let sgd = UpdaterSpec::Sgd { lr: 1e-6 };
    let mut results = Vec::new();
    for (i, (name, n)) in spec.sizes.iter().enumerate() {
        let n = *n;
        let grad: Vec<f32> = (0..n).map(|j| (j % 13) as f32 * 1e-3).collect();
        let mut buf = grad.clone();
        let mut out = vec![0.0f32; n];
        // One chunk per shard for this size: a new client (a newer incarnation of this
        // worker) per size, since the chunk size is the client's.
        let mut cfg = ClientConfig::new(WorkerId(rank as u32), spec.servers.clone());
        cfg.chunk_elems = n.div_ceil(servers);
        let mut kv = KvStore::connect(cfg).map_err(BenchError::Connect)?;
        let ar = time(t, reps, |t| {
            buf.copy_from_slice(&grad);
            Ok(t.all_reduce(&mut buf, ReduceOp::Sum)?)
        })?;
        let sync_key = Key(10 + 2 * i as u64);
        let async_key = Key(11 + 2 * i as u64);
        kv.init(sync_key, TableSpec::new(Consistency::Sync, sgd), &grad)?;
        kv.init(async_key, TableSpec::new(Consistency::Async, sgd), &grad)?;
        t.barrier()?;
        let before = kv.bytes();
        let pp = time(t, reps, |_| {
            kv.push_pull(sync_key, &grad, &mut out)?;
            Ok(())
        })?;
        let after = kv.bytes();
        let per = (after.0 - before.0 + after.1 - before.1) / (reps as u64 + 2);
        let push = time(t, reps, |_| Ok(kv.push(async_key, &grad)?))?;
        let pull = time(t, reps, |_| {
            kv.pull(async_key, &mut out)?;
            Ok(())
        })?;
        let apply = apply_times(&grad, n.div_ceil(servers), np, &sgd, reps);
        let (allreduce_ms, push_pull_ms) = (median_ms(t, ar)?, median_ms(t, pp)?);
        results.push(SizeResult {
            name: name.clone(),
            floats: n,
            allreduce_ms,
            push_pull_ms,
            ratio: push_pull_ms / allreduce_ms,
            push_ms: median_ms(t, push)?,
            pull_ms: median_ms(t, pull)?,
            apply_ms: median_ms(t, apply)?,
            ps_bytes_per_worker: per,
            allreduce_bytes_per_rank: ring_bytes_per_rank(n, np),
        });
        t.barrier()?;
        if i + 1 == spec.sizes.len() {
            kv.leave()?;
        }
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Server, ServerConfig, ShardConfig};
    use gradwire_transport::local::Local;

    #[test]
    fn ring_bytes_follow_the_formula() {
        // 4 ranks, 1000 floats: 2 · 2·3/4 · 4000 bytes.
        assert_eq!(ring_bytes_per_rank(1000, 4), 12_000);
        assert_eq!(ring_bytes_per_rank(1000, 1), 0);
    }

    #[test]
    fn refuses_an_empty_spec() {
        let mut w = Local::world(1);
        let spec = PsBenchSpec {
            servers: Vec::new(),
            reps: 1,
            sizes: vec![("x".into(), 8)],
        };
        assert!(matches!(
            measure(&mut w[0], &spec),
            Err(BenchError::NoServers)
        ));
        let spec = PsBenchSpec {
            servers: vec!["127.0.0.1:1".parse().unwrap()],
            reps: 0,
            ..spec
        };
        assert!(matches!(measure(&mut w[0], &spec), Err(BenchError::NoReps)));
    }

    /// Two workers (threads over an in-process mesh) against two in-process shards: one
    /// result per size, the same on both, with its size and the bookkeeping numbers.
    #[test]
    fn two_workers_two_shards() {
        let shards: Vec<Server> = (0..2)
            .map(|i| {
                let shard = ShardConfig {
                    shard_id: i,
                    num_workers: 2,
                    ..ShardConfig::default()
                };
                Server::start(ServerConfig::loopback(shard)).unwrap()
            })
            .collect();
        let spec = PsBenchSpec {
            servers: shards.iter().map(Server::local_addr).collect(),
            reps: 2,
            sizes: vec![("small".into(), 1000), ("odd".into(), 4097)],
        };
        let hs: Vec<_> = Local::world(2)
            .into_iter()
            .map(|mut t| {
                let spec = spec.clone();
                std::thread::spawn(move || measure(&mut t, &spec).unwrap())
            })
            .collect();
        let all: Vec<Vec<SizeResult>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        for r in &all {
            let names: Vec<(&str, usize)> = r.iter().map(|x| (x.name.as_str(), x.floats)).collect();
            assert_eq!(names, [("small", 1000), ("odd", 4097)]);
            for (x, y) in r.iter().zip(&all[0]) {
                // The medians are the slowest rank's: the same on every worker.
                assert_eq!(
                    (x.allreduce_ms, x.push_pull_ms, x.push_ms, x.pull_ms),
                    (y.allreduce_ms, y.push_pull_ms, y.push_ms, y.pull_ms)
                );
                assert_eq!(x.ratio, x.push_pull_ms / x.allreduce_ms);
                assert_eq!(x.allreduce_bytes_per_rank, ring_bytes_per_rank(x.floats, 2));
                // A push_pull writes the gradient and reads the weights back, at least.
                assert!(x.ps_bytes_per_worker >= 2 * 4 * x.floats as u64, "{x:?}");
                assert!(x.push_pull_ms > 0.0 && x.apply_ms >= 0.0, "{x:?}");
            }
        }
        drop(shards);
    }
}
