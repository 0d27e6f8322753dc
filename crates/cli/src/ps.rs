//! `gradwire ps serve`: one parameter-server shard (crates/ps) until stopped, under any
//! launcher (the shard id defaults to the launcher's rank) or alone. Connections must prove
//! the token in `GRADWIRE_PS_TOKEN`, else `GRADWIRE_TOKEN` (`gradwire_ps::auth`).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use gradwire_ps::{Server, ServerConfig, ShardConfig};

/// The parameter-server subcommands.
#[derive(Subcommand, Debug)]
pub enum PsCommand {
    /// Serve one shard: prints `listening on ADDR` first, then serves until stopped.
    ///
    /// Tables, updaters (sgd, momentum, adagrad, adam) and consistency (sync, async, ssp:S)
    /// are chosen by the workers' `init`; pushes are applied exactly once; with `--dir` the
    /// shard checkpoints parameters and optimizer state atomically and, with `--wal`,
    /// acknowledges a push only once it is in an fsynced write-ahead log.
    Serve(ServeArgs),
}

/// Arguments of `gradwire ps serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (port 0: a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// This shard's id [default: the launcher's rank, else 0].
    #[arg(long)]
    shard_id: Option<u32>,
    /// Distinct workers a synchronous round waits for.
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// Directory for checkpoints (and the write-ahead log); a restarted shard resumes from it.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Log every push before acknowledging it (needs --dir).
    #[arg(long)]
    wal: bool,
    /// Do not fsync the write-ahead log (faster; an acknowledged push can be lost on a crash).
    #[arg(long)]
    no_fsync: bool,
    /// A worker silent for this many seconds is dead (named, or left out of sync rounds).
    #[arg(long, default_value_t = 10.0)]
    heartbeat_timeout: f64,
    /// Write a checkpoint every this many seconds (needs --dir).
    #[arg(long)]
    checkpoint_every: Option<f64>,
    /// Listen off loopback without a token. Every connection proves the token in
    /// GRADWIRE_PS_TOKEN (else GRADWIRE_TOKEN); without one, anyone who reaches the port
    /// can act as any worker, so the shard refuses to start off loopback unless given this.
    #[arg(long)]
    insecure: bool,
}

/// Runs a `ps` subcommand.
pub fn run(cmd: PsCommand) -> Result<()> {
    match cmd {
        PsCommand::Serve(a) => serve(&a),
    }
}

fn seconds(what: &str, s: f64) -> Result<Duration> {
    if !(s.is_finite() && s > 0.0) {
        bail!("{what} must be a positive number of seconds, not {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

fn serve(a: &ServeArgs) -> Result<()> {
    if (a.wal || a.checkpoint_every.is_some()) && a.dir.is_none() {
        bail!("--wal and --checkpoint-every need --dir");
    }
    let rank = gradwire_run::join::detect()?.map(|l| l.config.rank as u32);
    let shard = ShardConfig {
        shard_id: a.shard_id.or(rank).unwrap_or(0),
        num_workers: a.workers,
        heartbeat_timeout: seconds("--heartbeat-timeout", a.heartbeat_timeout)?,
        dir: a.dir.clone(),
        wal: a.wal,
        wal_sync: !a.no_fsync,
        ..ShardConfig::default()
    };
    let mut cfg = ServerConfig::loopback(shard);
    cfg.listen = a.listen;
    cfg.insecure = a.insecure;
    cfg.checkpoint_every = a
        .checkpoint_every
        .map(|s| seconds("--checkpoint-every", s))
        .transpose()?;
    let server = Server::start(cfg).context("starting the shard")?;
    println!("listening on {}", server.local_addr());
    std::io::stdout().flush()?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
