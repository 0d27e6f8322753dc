//! `gradwire`: communication-efficient distributed training from the command line.
//!
//! Subcommands: `launch` starts N local ranks (like horovodrun / torchrun); `check` verifies
//! that the ranks of a job reach each other and reduce correctly; `bench` measures
//! collectives and codecs.

mod bench;
mod calibrate;
mod check;
mod launch;
mod ps;
mod report;
mod simulate;
mod train;

use std::io::Write;

use clap::{Parser, Subcommand};

/// Communication-efficient distributed deep-learning training.
#[derive(Parser, Debug)]
#[command(name = "gradwire", version, about, long_about = None)]
struct Cli {
    /// More log output (-v: debug, -vv: trace); `RUST_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start N local ranks of a command, with the rendezvous environment set.
    ///
    /// Each rank gets GRADWIRE_RANK, GRADWIRE_WORLD_SIZE, GRADWIRE_MASTER_ADDR,
    /// GRADWIRE_MASTER_PORT and GRADWIRE_TOKEN; its output lines are prefixed with its rank.
    /// When one rank fails the others are stopped and launch exits with the failing rank's code.
    Launch(launch::LaunchArgs),
    /// Check that the ranks of a job reach each other and all-reduce correctly.
    ///
    /// Run it under `gradwire launch -n N -- gradwire check` (or mpirun / srun / torchrun).
    Check(check::CheckArgs),
    /// Train a model data-parallel across workers with a gradient codec.
    ///
    /// Example: `gradwire train --model lenet --dataset fashion-mnist --workers 4
    /// --codec dgc:ratio=0.001 --epochs 5`. Fetch the data first with scripts/fetch-data.sh.
    Train(Box<train::TrainArgs>),
    /// Train one model with each codec in turn and write the accuracy-vs-bytes report.
    ///
    /// Writes report.md (a table in the style of the DGC, QSGD and TernGrad papers) and
    /// comparison.png into --out.
    Report(report::ReportArgs),
    /// Measure collectives (`bench allreduce`), codecs (`bench codecs`) or the engine
    /// (`bench engine`).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// The parameter server: `ps serve` runs one shard.
    #[command(subcommand)]
    Ps(ps::PsCommand),
    /// Predict step time, speedup over dense and scaling efficiency on P workers over a link
    /// (alpha-beta cost model; compute and codec costs measured here, `--calibrate` for the
    /// stack).
    ///
    /// Example: `gradwire simulate --model mlp:hidden=2048x3 --workers 8,64,1024 --link 10gbit
    /// --codec dgc:ratio=0.001 --json sim.json`.
    Simulate(Box<simulate::SimulateArgs>),
    /// Measure this machine's costs for `--codec auto` and cache them.
    ///
    /// Writes $GRADWIRE_CALIBRATION, else $XDG_CACHE_HOME/gradwire/calibration.json, else
    /// ~/.cache/gradwire/calibration.json (or --out), and prints what it measured.
    Calibrate(calibrate::CalibrateArgs),
}

fn main() {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match cli.command {
        Command::Launch(a) => launch::run(&a),
        Command::Check(a) => check::run(&a).map(|()| 0),
        Command::Train(a) => train::run(&a).map(|()| 0),
        Command::Report(a) => report::run(&a).map(|()| 0),
        Command::Bench(b) => bench::run(b).map(|()| 0),
        Command::Ps(p) => ps::run(p).map(|()| 0),
        Command::Simulate(a) => simulate::run(&a).map(|()| 0),
        Command::Calibrate(a) => calibrate::run(&a).map(|()| 0),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            // One write(2) of the whole line: the ranks of one job share this stderr, and
            // `eprintln!` writes each formatted piece separately, so their lines would mix.
            let line = format!("gradwire: error: {e:#}\n");
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
            std::process::exit(1);
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
