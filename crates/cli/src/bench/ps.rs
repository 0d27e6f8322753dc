//! `gradwire bench ps`: pushes and pulls through parameter-server shards against gradwire's
//! own all-reduce of the same size, P worker processes and S shard processes on loopback,
//! in the same run; per size (a LeNet-sized model, taken from the real LeNet here, and 16
//! MiB) each worker measures with [`gradwire_ps::bench`], rank 0 reports.
//!
//! JSON (`--json FILE`): `{"np":4,"servers":2,"reps":..,"results":[{"name":"lenet",
//! "floats":..,"allreduce_ms":..,"push_pull_ms":..,"ratio":..,"push_ms":..,"pull_ms":..,
//! "apply_ms":..,"ps_bytes_per_worker":..,"allreduce_bytes_per_rank":..}],"provenance":{..}}`.

use std::net::SocketAddr;

use anyhow::{bail, Result};
use clap::Args;
use gradwire_ps::bench::{PsBenchSpec, SizeResult};
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
    pub provenance: Option<gradwire_run::report::records::Provenance>,
}

/// Runs the benchmark (as the parent, or as one worker with `--worker`).
pub fn run(args: &PsBenchArgs) -> Result<()> {
    if args.np == 0 || args.servers == 0 || args.reps == 0 {
        bail!("--np, --servers and --reps must be at least 1");
    }
    if args.worker {
        // The shards speak TCP, so the all-reduce it is compared with runs over TCP too.
        let mut t = gradwire_run::join::join_from_env(gradwire_run::join::TransportKind::Tcp)?;
        let rank = t.rank();
        let report = measure(&mut *t, args)?;
        if rank == 0 {
            println!("{}", serde_json::to_string(&report)?);
        }
        return Ok(());
    }
    let shards =
        crate::ps::start_shards(args.servers, args.np, &crate::ps::ShardOptions::default())?;
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
    report.provenance = Some(gradwire_run::report::records::Provenance::current());
    println!("size       floats  allreduce ms  push_pull ms   ratio   push ms   pull ms  apply ms  ps B/worker    ar B/rank");
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
    crate::bench::write_json(args.json.as_deref(), &report)
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

/// Every size on this worker ([`gradwire_ps::bench::measure`]): a LeNet-sized model and
/// 16 MiB.
fn measure(t: &mut dyn Transport, args: &PsBenchArgs) -> Result<Report> {
    if args.ps_servers.is_empty() {
        bail!("--ps-servers is required with --worker");
    }
    let spec = PsBenchSpec {
        servers: args.ps_servers.clone(),
        reps: args.reps,
        sizes: vec![("lenet".into(), lenet_floats()?), ("16mib".into(), 4 << 20)],
    };
    Ok(Report {
        np: t.world_size(),
        servers: spec.servers.len(),
        reps: args.reps,
        results: gradwire_ps::bench::measure(t, &spec)?,
        provenance: None,
    })
}
