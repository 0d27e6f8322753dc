//! Parameter-server shard processes: `gradwire ps serve` (one shard until stopped, under
//! any launcher, where the shard id defaults to the launcher's rank, or alone), and the
//! supervised shards a `gradwire train` run starts ([`start_shards`] over
//! `gradwire_job::shards`: a write-ahead log and checkpoints under the run's `--out`, a dead
//! shard started again on its address, each restart said on standard error).

use anyhow::{Context, Result};
use clap::Subcommand;
pub use gradwire_job::shards::{ShardOptions, Shards};

/// The parameter-server subcommands.
#[derive(Subcommand, Debug)]
pub enum PsCommand {
    /// Serve one shard: prints `listening on ADDR` first, then serves until stopped.
    ///
    /// Tables, updaters (sgd, momentum, adagrad, adam) and consistency (sync, async, ssp:S)
    /// are chosen by the workers' `init`; pushes are applied exactly once; with `--dir` the
    /// shard checkpoints parameters and optimizer state atomically and, with `--wal`,
    /// acknowledges a push only once it is in an fsynced write-ahead log.
    Serve(gradwire_ps::serve::ServeArgs),
}

/// Runs a `ps` subcommand.
pub fn run(cmd: PsCommand) -> Result<()> {
    match cmd {
        PsCommand::Serve(a) => {
            let rank = gradwire_run::join::detect()?.map(|l| l.config.rank as u32);
            match gradwire_ps::serve::serve(&a, rank.unwrap_or(0))? {}
        }
    }
}

/// Starts `n` shards of this binary for `workers` workers ([`Shards::start`]), each restart
/// said on standard error.
pub fn start_shards(n: usize, workers: usize, opts: &ShardOptions) -> Result<Shards> {
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
    Ok(Shards::start(&exe, n, workers, opts, restart_note())?)
}

/// Says each restart of a shard on standard error.
pub fn restart_note() -> gradwire_job::shards::RestartNote {
    Box::new(|i, status, addr, failed| match failed {
        None => {
            eprintln!("gradwire train: shard {i} exited ({status}); started it again on {addr}")
        }
        Some(e) => eprintln!(
            "gradwire train: shard {i} exited ({status}) and did not start again on {addr}: {e}"
        ),
    })
}
