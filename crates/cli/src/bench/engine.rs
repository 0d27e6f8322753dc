//! `gradwire bench engine`: the engine against one blocking all-reduce per tensor and one
//! blocking all-reduce of everything, over the gradient lists of LeNet, a char-LSTM and a
//! many-small case, P ranks, median step times in the same run.
//!
//! JSON (`--json FILE`):
//! `{"np":4,"results":[{"case":"many-small","tensors":1000,"engine_ms":3.1,"per_tensor_ms":9.8,"flat_ms":2.9}]}`
//! plus `transport`, `reps` and `provenance` at the top level.

use anyhow::{bail, Result};
use clap::Args;
use gradwire_engine::bench::{run_cases, BenchCase, CaseSummary};
use gradwire_transport::local::Local;
use gradwire_transport::Transport;
use serde::{Deserialize, Serialize};

use crate::bench::allreduce::TransportKind;
use crate::bench::{emit, on_threads, write_json, Ranks};
use crate::launch::run_ranks_for_json;

/// Arguments of `gradwire bench engine`.
#[derive(Args, Debug, Clone)]
pub struct EngineBenchArgs {
    /// Number of ranks.
    #[arg(long, default_value_t = 4)]
    np: usize,
    /// Gradient lists: lenet, lstm, many-small (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "lenet,lstm,many-small")]
    cases: Vec<BenchCase>,
    /// Timed repetitions per mode (after one warm-up).
    #[arg(long, default_value_t = 30)]
    reps: usize,
    #[arg(long, value_enum, default_value = "auto", help = gradwire_run::join::TRANSPORT_HELP)]
    transport: TransportKind,
    /// Write the results as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Internal: this process is one rank started by the parent.
    #[arg(long, hide = true)]
    worker: bool,
}

/// The report.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// Ranks.
    pub np: usize,
    /// One entry per case.
    pub results: Vec<CaseSummary>,
    /// Transport used (the one `auto` resolved to).
    pub transport: TransportKind,
    /// Timed repetitions per mode.
    pub reps: usize,
    /// The version, revision and command that made the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<gradwire_run::report::records::Provenance>,
}

/// Every case on one rank ([`gradwire_engine::bench::run_cases`]); rank 0's results are
/// the report's (the engine's timings are taken after a barrier, so every rank measures the
/// same steps).
fn measure(t: Box<dyn Transport>, args: &EngineBenchArgs) -> Result<Vec<CaseSummary>> {
    Ok(run_cases(t, &args.cases, args.reps)?)
}

/// Runs the benchmark (as the parent, or as one rank with `--worker` or under a launcher).
pub fn run(args: &EngineBenchArgs) -> Result<()> {
    if args.np == 0 {
        bail!("--np must be at least 1");
    }
    let report = match crate::bench::ranks(args.np, args.transport, args.worker)? {
        Ranks::Joined(t) => {
            let (rank, np) = (t.rank(), t.world_size());
            let report = report(np, measure(t, args)?, args);
            return emit(rank, args.worker, &report, |r| finish(r, args));
        }
        Ranks::Threads(np) => {
            let world = Local::world(np)
                .into_iter()
                .map(|t| Box::new(t) as _)
                .collect();
            let a = args.clone();
            report(np, on_threads(world, move |t| measure(t, &a))?, args)
        }
        Ranks::Processes(kind) => {
            let mut r = run_processes(args, kind)?;
            r.provenance = Some(gradwire_run::report::records::Provenance::current());
            r
        }
    };
    finish(&report, args)
}

fn report(np: usize, results: Vec<CaseSummary>, args: &EngineBenchArgs) -> Report {
    Report {
        np,
        results,
        transport: args.transport.resolve(),
        reps: args.reps,
        provenance: Some(gradwire_run::report::records::Provenance::current()),
    }
}

fn run_processes(args: &EngineBenchArgs, kind: TransportKind) -> Result<Report> {
    let cases: Vec<&str> = args.cases.iter().map(|c| c.name()).collect();
    run_ranks_for_json(
        args.np,
        vec![
            "bench".into(),
            "engine".into(),
            "--worker".into(),
            format!("--transport={kind}"),
            format!("--cases={}", cases.join(",")),
            format!("--reps={}", args.reps),
        ],
    )
}

fn finish(report: &Report, args: &EngineBenchArgs) -> Result<()> {
    println!("case         tensors   engine ms  per-tensor ms   flat ms vs per-tensor   vs flat  rounds   spec");
    for r in &report.results {
        println!(
            "{:<11} {:>8} {:>11.3} {:>14.3} {:>9.3} {:>11.2}x {:>8.2}x {:>7.2} {:>6.2}",
            r.case,
            r.tensors,
            r.engine_ms,
            r.per_tensor_ms,
            r.flat_ms,
            r.per_tensor_ms / r.engine_ms,
            r.flat_ms / r.engine_ms,
            r.engine_rounds,
            r.engine_speculative
        );
    }
    write_json(args.json.as_deref(), report)
}
