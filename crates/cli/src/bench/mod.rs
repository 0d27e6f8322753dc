//! `gradwire bench`: the benchmark subcommands.

pub mod allreduce;
pub mod codecs;
pub mod engine;
pub mod ps;

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use gradwire_run::join::TransportKind;
use gradwire_transport::Transport;
use serde::Serialize;

/// Which benchmark to run.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Collective bandwidth and latency across P ranks (all-reduce, all-gather, broadcast).
    ///
    /// Starts P ranks itself (TCP on loopback by default) and prints, per size, the median
    /// over iterations of the slowest rank's time and the bus bandwidth (nccl-tests
    /// convention: all-reduce moves bytes x 2(P-1)/P).
    Allreduce(crate::bench::allreduce::AllreduceBenchArgs),
    /// Codec throughput: encode and decode_add GB/s and compression ratio per codec, next to
    /// the memcpy GB/s of the same machine measured in the same run.
    Codecs(crate::bench::codecs::CodecBenchArgs),
    /// The engine (negotiation, fusion, progress thread) against one blocking all-reduce
    /// per tensor and one of everything, on LeNet's, a char-LSTM's and 1,000 small tensors'
    /// gradient lists; median step times from the same run.
    Engine(crate::bench::engine::EngineBenchArgs),
    /// Parameter-server pushes and pulls (P workers, S shards on loopback) against
    /// gradwire's all-reduce of the same size, for a LeNet-sized model and 16 MiB, with
    /// where the time goes (push, pull, the shards' arithmetic) and the bytes per worker.
    Ps(crate::bench::ps::PsBenchArgs),
}

/// Runs a benchmark subcommand.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Allreduce(a) => crate::bench::allreduce::run(&a),
        BenchCommand::Codecs(a) => crate::bench::codecs::run(&a),
        BenchCommand::Engine(a) => crate::bench::engine::run(&a),
        BenchCommand::Ps(a) => crate::bench::ps::run(&a),
    }
}

/// Where a multi-rank benchmark's ranks run.
pub(crate) enum Ranks {
    /// This process is one rank, joined (under a launcher, or started by a parent with
    /// `--worker`, which reads rank 0's report as JSON on stdout).
    Joined(Box<dyn Transport>),
    /// P threads of this process over in-process transports (`--transport local`).
    Threads(usize),
    /// P rank processes to start over this transport.
    Processes(TransportKind),
}

/// Where the ranks of a benchmark of `np` ranks over `transport` run; joins when this
/// process is one of them.
pub(crate) fn ranks(np: usize, transport: TransportKind, worker: bool) -> Result<Ranks> {
    let launched = gradwire_run::join::detect()?;
    let kind = transport.resolve();
    if worker || (launched.is_some() && kind != TransportKind::Local) || kind == TransportKind::Mpi
    {
        return Ok(Ranks::Joined(match &launched {
            Some(l) => gradwire_run::join::join_with(kind, l)?,
            None => gradwire_run::join::join_from_env(kind)?,
        }));
    }
    if launched.is_some() {
        // `local` under a launcher: every rank would run its own threads.
        bail!("--transport local runs P threads of one process: start it without a launcher");
    }
    if np == 0 {
        bail!("--np must be at least 1");
    }
    Ok(match kind {
        TransportKind::Local => Ranks::Threads(np),
        _ => Ranks::Processes(kind),
    })
}

/// Runs `f` on every rank of `world`, one thread each; rank 0's result.
pub(crate) fn on_threads<R: Send + 'static>(
    world: Vec<Box<dyn Transport>>,
    f: impl Fn(Box<dyn Transport>) -> Result<R> + Send + Clone + 'static,
) -> Result<R> {
    let handles: Vec<_> = world
        .into_iter()
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || f(t))
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.push(
            h.join()
                .map_err(|_| anyhow!("a benchmark thread panicked"))??,
        );
    }
    Ok(all.swap_remove(0))
}

/// A joined rank's report: on rank 0, JSON on stdout for the parent (`worker`), else `finish`.
pub(crate) fn emit<R: Serialize>(
    rank: usize,
    worker: bool,
    report: &R,
    finish: impl FnOnce(&R) -> Result<()>,
) -> Result<()> {
    match (rank, worker) {
        (0, true) => println!("{}", serde_json::to_string(report)?),
        (0, false) => finish(report)?,
        _ => {}
    }
    Ok(())
}

/// Writes `report` as pretty JSON and a newline to `path` when one is given.
pub(crate) fn write_json<R: Serialize>(path: Option<&Path>, report: &R) -> Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
