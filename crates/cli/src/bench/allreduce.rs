//! `gradwire bench allreduce`: collective timings across P ranks, as a table and as JSON.
//!
//! JSON shape (other tools read it; keep it):
//! `{"op":"allreduce","transport":"tcp","np":4,"algo":"auto","results":[{"bytes":1048576,"median_us":812.5,"busbw_gbps":1.94}]}`

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use gradwire_collective::bench::{self, BenchOp, BenchSpec, HierarchicalAllReduce, SizeResult};
use gradwire_collective::Algorithm;
use gradwire_transport::link::{LinkConfig, Throttled};
use gradwire_transport::local::Local;
use gradwire_transport::Transport;
use serde::{Deserialize, Serialize};

use crate::bench::{emit, on_threads, write_json, Ranks};
use crate::launch::run_ranks_for_json;
use gradwire_collective::bench::{format_size, parse_size};
use gradwire_engine::HostGroups as Hier;
pub use gradwire_run::join::TransportKind;

/// Which collective to time (`--op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OpArg {
    /// Sum all-reduce of f32.
    Allreduce,
    /// All-gather; the size is the gathered total.
    Allgather,
    /// Broadcast from rank 0.
    Broadcast,
}

impl From<OpArg> for BenchOp {
    fn from(op: OpArg) -> BenchOp {
        match op {
            OpArg::Allreduce => BenchOp::Allreduce,
            OpArg::Allgather => BenchOp::Allgather,
            OpArg::Broadcast => BenchOp::Broadcast,
        }
    }
}

/// Arguments of `gradwire bench allreduce`.
#[derive(Args, Debug, Clone)]
pub struct AllreduceBenchArgs {
    /// Number of ranks to start (ignored when run under a launcher: the job's size is used).
    #[arg(long, default_value_t = 2)]
    np: usize,
    /// Message sizes in bytes, comma-separated (4KiB, 1MiB, ...).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4KiB,64KiB,1MiB,16MiB,64MiB")]
    sizes: Vec<usize>,
    /// Without a launcher, P processes (tcp, shm) or P threads (local); under one, the
    /// transport each rank joins with (help text: `TRANSPORT_HELP`).
    #[arg(long, value_enum, default_value = "auto", help = gradwire_run::join::TRANSPORT_HELP)]
    transport: TransportKind,
    /// Algorithm: auto, ring, rd, rabenseifner.
    #[arg(long, default_value = "auto")]
    algo: Algorithm,
    /// Collective to time.
    #[arg(long, value_enum, default_value = "allreduce")]
    op: OpArg,
    /// Emulate a network link between the ranks, e.g. `1gbit,50us` (see `gradwire train
    /// --help`); also read from GRADWIRE_LINK when not given.
    #[arg(long, value_name = "SPEC", value_parser = link_arg)]
    link: Option<String>,
    /// Timed iterations per size (default: from 200 for small messages down to 10).
    #[arg(long)]
    iters: Option<usize>,
    /// Warm-up iterations per size.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Internal: run as one rank of the benchmark and print JSON (set by the parent).
    #[arg(long, hide = true)]
    worker: bool,
}

/// The benchmark's JSON report.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// Collective timed.
    pub op: BenchOp,
    /// Transport used (never `auto`: the one it resolved to).
    pub transport: TransportKind,
    /// Number of ranks.
    pub np: usize,
    /// Algorithm requested.
    pub algo: String,
    /// One entry per size.
    pub results: Vec<SizeResult>,
    /// The version, revision and command that made the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<gradwire_run::report::records::Provenance>,
    /// The hosts when the all-reduce ran hierarchically (`2 hosts (2+2 ranks)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hierarchy: Option<String>,
}

/// Runs the benchmark (as the parent, or as one rank with `--worker` or under a launcher).
pub fn run(args: &AllreduceBenchArgs) -> Result<()> {
    if args.sizes.iter().any(|&s| s < 4) {
        bail!("every size must be at least 4 bytes (one f32)");
    }
    let report = match crate::bench::ranks(args.np, args.transport, args.worker)? {
        Ranks::Joined(mut t) => {
            let (rank, kind) = (t.rank(), args.transport.resolve());
            if let Some(cfg) = link_config(args, t.world_size())? {
                t = Box::new(Throttled::new(t, &cfg));
            }
            let hier = hierarchy(&mut *t, kind)?;
            let report = measure(&mut *t, hier, args)?;
            return emit(rank, args.worker, &report, |r| finish(r, args));
        }
        Ranks::Threads(np) => {
            let world: Vec<Box<dyn Transport>> = match link_config(args, np)? {
                Some(cfg) => Throttled::wrap_all(Local::world(np), &cfg)
                    .into_iter()
                    .map(|t| Box::new(t) as Box<dyn Transport>)
                    .collect(),
                None => Local::world(np)
                    .into_iter()
                    .map(|t| Box::new(t) as Box<dyn Transport>)
                    .collect(),
            };
            let a = args.clone();
            on_threads(world, move |mut t| measure(&mut t, None, &a))?
        }
        Ranks::Processes(kind) => run_processes(args, kind)?,
    };
    finish(&report, args)
}

/// The hierarchical all-reduce when the ranks' hosts call for it (TCP jobs only; see
/// [`gradwire_engine::HostGroups::connect_from_env`]).
fn hierarchy(t: &mut dyn Transport, kind: TransportKind) -> Result<Option<Hier>> {
    if kind != TransportKind::Tcp {
        return Ok(None);
    }
    Ok(Hier::connect_from_env(t)?)
}

/// `--link`, else GRADWIRE_LINK.
fn link_config(args: &AllreduceBenchArgs, world: usize) -> Result<Option<LinkConfig>> {
    Ok(match &args.link {
        Some(l) => Some(l.parse()?),
        None => gradwire_transport::link::config_from_env(world)?,
    })
}

/// Checks a `--link` spec, keeping its text (it is passed on to the rank processes).
pub fn link_arg(s: &str) -> std::result::Result<String, gradwire_transport::link::LinkSpecError> {
    s.parse::<LinkConfig>().map(|_| s.to_string())
}

fn run_processes(args: &AllreduceBenchArgs, kind: TransportKind) -> Result<Report> {
    let sizes: Vec<String> = args.sizes.iter().map(ToString::to_string).collect();
    let op = args.op.to_possible_value().expect("value");
    let mut child_args = vec![
        "bench".to_string(),
        "allreduce".into(),
        "--worker".into(),
        format!("--transport={kind}"),
        format!("--sizes={}", sizes.join(",")),
        format!("--algo={}", args.algo),
        format!("--op={}", op.get_name()),
        format!("--warmup={}", args.warmup),
    ];
    child_args.extend(args.link.iter().map(|l| format!("--link={l}")));
    child_args.extend(args.iters.map(|i| format!("--iters={i}")));
    let mut report: Report = run_ranks_for_json(args.np, child_args)?;
    // The command that made the report is this one, not the workers'.
    report.provenance = Some(gradwire_run::report::records::Provenance::current());
    Ok(report)
}

fn finish(report: &Report, args: &AllreduceBenchArgs) -> Result<()> {
    print_table(report);
    write_json(args.json.as_deref(), report)
}

fn print_table(r: &Report) {
    println!(
        "# {:?} over {} ranks, transport {:?}, algo {}{}",
        r.op,
        r.np,
        r.transport,
        r.algo,
        r.hierarchy
            .as_ref()
            .map_or(String::new(), |h| format!(", hierarchical over {h}"))
    );
    println!("{:>10} {:>12} {:>12}", "size", "median_us", "busbw_GB/s");
    for x in &r.results {
        println!(
            "{:>10} {:>12.1} {:>12.3}",
            format_size(x.bytes),
            x.median_us,
            x.busbw_gbps
        );
    }
}

/// Times every size on this rank ([`gradwire_collective::bench::measure`]); all ranks
/// return the same report.
fn measure(
    t: &mut dyn Transport,
    mut hier: Option<Hier>,
    args: &AllreduceBenchArgs,
) -> Result<Report> {
    let spec = BenchSpec {
        op: args.op.into(),
        sizes: args.sizes.clone(),
        algo: args.algo,
        iters: args.iters,
        warmup: args.warmup,
    };
    let h = hier.as_mut().map(|h| h as &mut dyn HierarchicalAllReduce);
    Ok(Report {
        op: spec.op,
        transport: args.transport.resolve(),
        np: t.world_size(),
        algo: args.algo.to_string(),
        results: bench::measure(t, h, &spec)?,
        provenance: Some(gradwire_run::report::records::Provenance::current()),
        hierarchy: hier.as_ref().map(Hier::describe),
    })
}
