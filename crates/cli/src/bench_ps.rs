//! `gradwire bench ps`: pushes and pulls through parameter-server shards against gradwire's
//! own all-reduce of the same size, P worker processes and S shard processes on loopback,
//! in the same run.
//!
//! Per size (a LeNet-sized model, taken from the real LeNet here, and 16 MiB), every worker
//! times, after a barrier on the rank mesh before each repetition:
//! - `allreduce`: one all-reduce (sum) of the buffer over the mesh (gradwire-collective's
//!   automatic algorithm), the baseline;
//! - `push_pull`: one synchronous-round `push_pull` of the buffer as a gradient (an SGD
//!   updater on the shards): what a ps-sync training step costs in communication;
//! - `push` and `pull`: one push to, and one pull from, an asynchronous table, alone (all
//!   workers at once): the two directions of a Downpour step;
//! - `apply`: the shards' arithmetic for one round, measured locally: averaging P pushes and
//!   one SGD update over this size divided among S shards (the work of the busiest shard).
//!
//! Times are the slowest rank's per repetition, then the median. Bytes are the frames the
//! worker's client wrote and read per `push_pull` (measured), against the ring all-reduce's
//! `2 (P-1)/P · n · 4` sent and as many received per rank. The ratio is `push_pull /
//! allreduce` (above 1: the PS is slower).
//!
//! JSON (`--json FILE`): `{"np":4,"servers":2,"reps":..,"results":[{"name":"lenet",
//! "floats":..,"allreduce_ms":..,"push_pull_ms":..,"ratio":..,"push_ms":..,"pull_ms":..,
//! "apply_ms":..,"ps_bytes_per_worker":..,"allreduce_bytes_per_rank":..}],"provenance":{..}}`.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use gradwire_collective::{Collectives, ReduceOp};
use gradwire_ps::{
    apply_update, ClientConfig, Consistency, Key, KvStore, OptState, TableSpec, UpdaterSpec,
    WorkerId,
};
use gradwire_transport::Transport;
use serde::{Deserialize, Serialize};

use crate::launch::run_ranks_for_json;

/// Arguments of `gradwire bench ps`.
#[derive(Args, Debug, Clone)]
pub struct PsBenchArgs {
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    np: usize,
    /// Shard processes.
    #[arg(long, default_value_t = 2)]
    servers: usize,
    /// Timed repetitions per size and mode (after two warm-ups).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Internal: the shards' addresses (set by the parent for its workers).
    #[arg(long, hide = true, value_delimiter = ',')]
    ps_servers: Vec<SocketAddr>,
    /// Internal: this process is one worker started by the parent.
    #[arg(long, hide = true)]
    worker: bool,
}

/// One size's medians.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SizeResult {
    /// `lenet` or `16mib`.
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

/// The report.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// Workers.
    pub np: usize,
    /// Shards.
    pub servers: usize,
    /// Timed repetitions.
    pub reps: usize,
    /// One entry per size.
    pub results: Vec<SizeResult>,
    /// The version, revision and command that made the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<crate::records::Provenance>,
}

/// Runs the benchmark (as the parent, or as one worker with `--worker`).
pub fn run(args: &PsBenchArgs) -> Result<()> {
    if args.np == 0 || args.servers == 0 || args.reps == 0 {
        bail!("--np, --servers and --reps must be at least 1");
    }
    if args.worker {
        // The shards speak TCP, so the all-reduce it is compared with runs over TCP too.
        let t = gradwire_run::join::join_from_env(gradwire_run::join::TransportKind::Tcp)?;
        let rank = t.rank();
        let report = measure(t, args)?;
        if rank == 0 {
            println!("{}", serde_json::to_string(&report)?);
        }
        return Ok(());
    }
    let shards =
        crate::ps::Shards::start(args.servers, args.np, &crate::ps::ShardOptions::default())?;
    let addrs: Vec<String> = shards.addrs.iter().map(ToString::to_string).collect();
    let mut report: Report = run_ranks_for_json(
        args.np,
        vec![
            "bench".into(),
            "ps".into(),
            "--worker".into(),
            format!("--servers={}", args.servers),
            format!("--reps={}", args.reps),
            format!("--ps-servers={}", addrs.join(",")),
        ],
    )?;
    drop(shards);
    report.provenance = Some(crate::records::Provenance::current());
    println!(
        "{:<7} {:>9} {:>13} {:>13} {:>7} {:>9} {:>9} {:>9} {:>12} {:>12}",
        "size",
        "floats",
        "allreduce ms",
        "push_pull ms",
        "ratio",
        "push ms",
        "pull ms",
        "apply ms",
        "ps B/worker",
        "ar B/rank"
    );
    for r in &report.results {
        println!(
            "{:<7} {:>9} {:>13.3} {:>13.3} {:>6.2}x {:>9.3} {:>9.3} {:>9.3} {:>12} {:>12}",
            r.name,
            r.floats,
            r.allreduce_ms,
            r.push_pull_ms,
            r.ratio,
            r.push_ms,
            r.pull_ms,
            r.apply_ms,
            r.ps_bytes_per_worker,
            r.allreduce_bytes_per_rank
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The real LeNet's parameter count (Fashion-MNIST's shape).
fn lenet_floats() -> Result<usize> {
    let shape = gradwire_train::data::DataShape::Image {
        shape: [1, 28, 28],
        classes: 10,
    };
    Ok(gradwire_train::ModelKind::LeNet
        .build(shape, 0)?
        .num_params())
}

/// Slowest rank per repetition, then the median, in ms.
fn median_ms<T: Transport>(t: &mut T, mut times: Vec<f64>) -> Result<f64> {
    t.all_reduce(&mut times, ReduceOp::Max)?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2] * 1e3)
}

/// Times `op` `reps` times after two warm-ups, a barrier before each.
fn time<T: Transport>(
    t: &mut T,
    reps: usize,
    mut op: impl FnMut(&mut T) -> Result<()>,
) -> Result<Vec<f64>> {
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

fn measure<T: Transport>(mut t: T, args: &PsBenchArgs) -> Result<Report> {
    let (rank, np) = (t.rank(), t.world_size());
    let sizes = [("lenet", lenet_floats()?), ("16mib", 4 << 20)];
    let servers = args.ps_servers.len();
    if servers == 0 {
        bail!("--ps-servers is required with --worker");
    }
    let sgd = UpdaterSpec::Sgd { lr: 1e-6 };
    let mut results = Vec::new();
    for (i, &(name, n)) in sizes.iter().enumerate() {
        let grad: Vec<f32> = (0..n).map(|j| (j % 13) as f32 * 1e-3).collect();
        let mut buf = grad.clone();
        let mut out = vec![0.0f32; n];
        // One chunk per shard for this size: a new client (a newer incarnation of this
        // worker) per size, since the chunk size is the client's.
        let mut cfg = ClientConfig::new(WorkerId(rank as u32), args.ps_servers.clone());
        cfg.chunk_elems = n.div_ceil(servers);
        let mut kv = KvStore::connect(cfg).context("connecting to the shards")?;
        let ar = time(&mut t, args.reps, |t| {
            buf.copy_from_slice(&grad);
            Ok(t.all_reduce(&mut buf, ReduceOp::Sum)?)
        })?;
        let sync_key = Key(10 + 2 * i as u64);
        let async_key = Key(11 + 2 * i as u64);
        kv.init(sync_key, TableSpec::new(Consistency::Sync, sgd), &grad)?;
        kv.init(async_key, TableSpec::new(Consistency::Async, sgd), &grad)?;
        t.barrier()?;
        let before = kv.bytes();
        let pp = time(&mut t, args.reps, |_| {
            kv.push_pull(sync_key, &grad, &mut out)?;
            Ok(())
        })?;
        let after = kv.bytes();
        let per = (after.0 - before.0 + after.1 - before.1) / (args.reps as u64 + 2);
        let push = time(&mut t, args.reps, |_| Ok(kv.push(async_key, &grad)?))?;
        let pull = time(&mut t, args.reps, |_| {
            kv.pull(async_key, &mut out)?;
            Ok(())
        })?;
        // The busiest shard's arithmetic per round, measured here: average np pushes into
        // its slice, then one SGD update.
        let slice = n.div_ceil(servers);
        let mut w = grad[..slice].to_vec();
        let mut acc = vec![0.0f32; slice];
        let mut st = OptState::default();
        let apply: Vec<f64> = (0..args.reps)
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
                apply_update(&sgd, &mut st, &mut w, &acc);
                start.elapsed().as_secs_f64()
            })
            .collect();
        std::hint::black_box(&w);
        let (allreduce_ms, push_pull_ms) = (median_ms(&mut t, ar)?, median_ms(&mut t, pp)?);
        let p = np as f64;
        results.push(SizeResult {
            name: name.into(),
            floats: n,
            allreduce_ms,
            push_pull_ms,
            ratio: push_pull_ms / allreduce_ms,
            push_ms: median_ms(&mut t, push)?,
            pull_ms: median_ms(&mut t, pull)?,
            apply_ms: median_ms(&mut t, apply)?,
            ps_bytes_per_worker: per,
            allreduce_bytes_per_rank: (2.0 * 2.0 * (p - 1.0) / p * 4.0 * n as f64) as u64,
        });
        t.barrier()?;
        if i + 1 == sizes.len() {
            kv.leave()?;
        }
    }
    Ok(Report {
        np,
        servers,
        reps: args.reps,
        results,
        provenance: None,
    })
}
