//! `gradwire launch`: start N local ranks, prefix their output, stop all on the first failure.
//!
//! The command line and its report; the launcher itself (the ranks' environment, the
//! output, the signals passed on, [`GRACE`], the shared-memory cleanup) is
//! [`gradwire_run::launch`], re-exported here for the other commands that launch ranks.

pub mod elastic;

use std::net::SocketAddr;

use anyhow::Result;
use clap::Args;

// The launcher, under the path the other commands use; some items are named by none of them
// at present (`Ranks`, `Outcome` and `LaunchError` are the types they get back).
#[allow(unused_imports)]
pub use gradwire_run::launch::{
    describe, exit_code, own_group_dies_with_parent, spawn, spawn_capturing, spawn_elastic,
    spawn_quiet, ElasticEnv, LaunchError, Outcome, RankSpec, Ranks, GRACE,
};

/// Arguments of `gradwire launch`.
#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Number of ranks to start.
    #[arg(short = 'n', long = "np", value_parser = clap::value_parser!(u32).range(1..=1024),
          required_unless_present = "join")]
    np: Option<u32>,
    /// Rendezvous address of rank 0 (default: 127.0.0.1 and a free port).
    #[arg(long)]
    master: Option<SocketAddr>,
    /// Deadline in seconds for every blocking call of the ranks (GRADWIRE_TIMEOUT).
    #[arg(long)]
    timeout: Option<f64>,
    /// Do not prefix output lines with the rank: every rank's output passes through
    /// untouched (interleaved as the ranks write it).
    #[arg(long)]
    no_prefix: bool,
    /// Elastic job of MIN to MAX processes (the `-n` start it): no process gets a rank from
    /// the environment; a membership coordinator here forms each world, a process's death
    /// re-forms it without that process (the job goes on while at least MIN remain), and
    /// `gradwire launch --join FILE` adds one. For `gradwire train` and the Python package's
    /// `gw.elastic.run`.
    #[arg(long, value_name = "MIN:MAX")]
    elastic: Option<crate::train::elastic::ElasticRange>,
    /// With --elastic: write how to join the job to FILE (mode 0600: it holds the job's
    /// token), removed when the job ends.
    #[arg(long, value_name = "FILE", requires = "elastic")]
    join_file: Option<std::path::PathBuf>,
    /// Start one more process of the running elastic job whose --join-file is FILE (its
    /// command, admitted at the job's next commit).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["elastic", "np"])]
    join: Option<std::path::PathBuf>,
    /// The command each rank runs, after `--`.
    #[arg(last = true, required_unless_present = "join", num_args = 1..)]
    command: Vec<String>,
}

/// Runs the launcher; returns the exit code for the process.
pub fn run(args: &LaunchArgs) -> Result<i32> {
    if let Some(file) = &args.join {
        crate::launch::elastic::join(file)?;
        return Ok(0);
    }
    let np = args.np.map_or(1, |n| n as usize);
    if let Some(range) = args.elastic {
        if !(range.min..=range.max).contains(&np) {
            anyhow::bail!("-n {np} is outside --elastic {}:{}", range.min, range.max);
        }
        let spec = RankSpec {
            np,
            master: None,
            timeout: args.timeout,
            program: args.command[0].clone(),
            args: args.command[1..].to_vec(),
        };
        crate::launch::elastic::run(&crate::launch::elastic::ElasticJob {
            spec: &spec,
            min: range.min,
            max: range.max,
            join_file: args.join_file.as_deref(),
            who: "gradwire launch",
        })?;
        return Ok(0);
    }
    let spec = RankSpec {
        np,
        master: args.master,
        timeout: args.timeout,
        program: args.command[0].clone(),
        args: args.command[1..].to_vec(),
    };
    let ranks = spawn(&spec, !args.no_prefix)?;
    let outcome = ranks.wait()?;
    if let Some(sig) = outcome.signal {
        eprintln!("gradwire launch: stopped by signal {sig}, passed on to the ranks");
        return Ok(128 + sig);
    }
    if let Some((rank, status)) = outcome.failure {
        let code = exit_code(status);
        eprintln!(
            "gradwire launch: rank {rank} failed ({}); the other ranks were stopped",
            describe(status)
        );
        return Ok(code);
    }
    Ok(0)
}

/// Starts `np` ranks of this binary with `args` (a benchmark's `--worker` form), waits for
/// them all, and parses the last JSON line rank 0 printed:
/// [`gradwire_run::launch::run_ranks_for_json`] with an [`anyhow::Error`], for the commands
/// that return its result as their own.
pub fn run_ranks_for_json<T: serde::de::DeserializeOwned>(
    np: usize,
    args: Vec<String>,
) -> Result<T> {
    Ok(gradwire_run::launch::run_ranks_for_json(np, args)?)
}
