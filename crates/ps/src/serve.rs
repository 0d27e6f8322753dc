//! Serving one shard from a command line: the flags ([`ServeArgs`], clap) and the loop
//! ([`serve`]) behind both front-ends, `gradwire ps serve` and this crate's own
//! `gradwire-ps-server` binary (the one the crate's process tests start), so the two take
//! the same flags and say the same errors.
//!
//! [`serve`] prints `listening on ADDR` as its first stdout line (launchers and tests read
//! it), then serves until the process is stopped. Connections must prove the token in
//! `GRADWIRE_PS_TOKEN`, else `GRADWIRE_TOKEN` ([`crate::auth`]); off loopback the shard
//! refuses to start without one unless given `--insecure`.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::{Server, ServerConfig, ShardConfig};

/// The flags of one shard process.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on (port 0: a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// This shard's id [default: the launcher's rank, else 0].
    #[arg(long)]
    pub shard_id: Option<u32>,
    /// Distinct workers a synchronous round waits for.
    #[arg(long, default_value_t = 1)]
    pub workers: u32,
    /// Directory for checkpoints (and the write-ahead log); a restarted shard resumes from it.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Log every push before acknowledging it (needs --dir).
    #[arg(long)]
    pub wal: bool,
    /// Do not fsync the write-ahead log (faster; an acknowledged push can be lost on a crash).
    #[arg(long)]
    pub no_fsync: bool,
    /// A worker silent for this many seconds is dead (named, or left out of sync rounds).
    #[arg(long, default_value_t = 10.0)]
    pub heartbeat_timeout: f64,
    /// The longest a request waits on the shard, in seconds (a synchronous round, a
    /// staleness bound), before it is answered with a timeout naming what it waited for.
    #[arg(long, default_value_t = 30.0)]
    pub max_wait: f64,
    /// Write a checkpoint every this many seconds (needs --dir).
    #[arg(long)]
    pub checkpoint_every: Option<f64>,
    /// Listen off loopback without a token. Every connection proves the token in
    /// GRADWIRE_PS_TOKEN (else GRADWIRE_TOKEN); without one, anyone who reaches the port
    /// can act as any worker, so the shard refuses to start off loopback unless given this.
    #[arg(long)]
    pub insecure: bool,
}

/// Why a shard process could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A duration flag was not a positive, finite number of seconds.
    #[error("{flag} must be a positive number of seconds, not {value}")]
    Seconds {
        /// The flag.
        flag: &'static str,
        /// What it was given.
        value: f64,
    },
    /// `--wal` or `--checkpoint-every` without `--dir`.
    #[error("--wal and --checkpoint-every need --dir")]
    NeedsDir,
    /// The server did not start (the address, the token, the directory).
    #[error("starting the shard: {0}")]
    Start(#[from] crate::Error),
    /// The address could not be printed.
    #[error("printing the address: {0}")]
    Stdout(#[from] std::io::Error),
}

fn seconds(flag: &'static str, value: f64) -> Result<Duration, ServeError> {
    if !(value.is_finite() && value > 0.0) {
        return Err(ServeError::Seconds { flag, value });
    }
    Ok(Duration::from_secs_f64(value))
}

impl ServeArgs {
    /// The server these flags describe; `default_shard_id` is used without `--shard-id`
    /// (a launcher's rank, or 0).
    pub fn config(&self, default_shard_id: u32) -> Result<ServerConfig, ServeError> {
        if (self.wal || self.checkpoint_every.is_some()) && self.dir.is_none() {
            return Err(ServeError::NeedsDir);
        }
        let shard = ShardConfig {
            shard_id: self.shard_id.unwrap_or(default_shard_id),
            num_workers: self.workers,
            heartbeat_timeout: seconds("--heartbeat-timeout", self.heartbeat_timeout)?,
            max_wait: seconds("--max-wait", self.max_wait)?,
            dir: self.dir.clone(),
            wal: self.wal,
            wal_sync: !self.no_fsync,
            ..ShardConfig::default()
        };
        let mut cfg = ServerConfig::loopback(shard);
        cfg.listen = self.listen;
        cfg.insecure = self.insecure;
        cfg.checkpoint_every = self
            .checkpoint_every
            .map(|s| seconds("--checkpoint-every", s))
            .transpose()?;
        Ok(cfg)
    }
}

/// Starts the shard `args` describe, prints `listening on ADDR` and serves until the
/// process is stopped; returns only when it cannot start.
pub fn serve(args: &ServeArgs, default_shard_id: u32) -> Result<Infallible, ServeError> {
    let server = Server::start(args.config(default_shard_id)?)?;
    println!("listening on {}", server.local_addr());
    std::io::stdout().flush()?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServerConfig, ServeError> {
        let cli = Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .expect("flags parse");
        cli.serve.config(7)
    }

    #[test]
    fn flags_become_the_shard_s_settings() {
        let c = parse(&[
            "--workers",
            "3",
            "--dir",
            "/tmp/x",
            "--wal",
            "--no-fsync",
            "--heartbeat-timeout",
            "2.5",
            "--max-wait",
            "0.25",
            "--checkpoint-every",
            "4",
        ])
        .unwrap();
        assert_eq!(
            c.shard.shard_id, 7,
            "the default shard id without --shard-id"
        );
        assert_eq!(c.shard.num_workers, 3);
        assert!(c.shard.wal && !c.shard.wal_sync);
        assert_eq!(c.shard.heartbeat_timeout, Duration::from_millis(2500));
        assert_eq!(c.shard.max_wait, Duration::from_millis(250));
        assert_eq!(c.checkpoint_every, Some(Duration::from_secs(4)));
        assert_eq!(parse(&["--shard-id", "2"]).unwrap().shard.shard_id, 2);
    }

    #[test]
    fn bad_flags_are_refused_by_name() {
        assert!(matches!(parse(&["--wal"]), Err(ServeError::NeedsDir)));
        assert!(matches!(
            parse(&["--checkpoint-every", "1"]),
            Err(ServeError::NeedsDir)
        ));
        for (flag, v) in [("--max-wait", "0"), ("--heartbeat-timeout", "inf")] {
            match parse(&[flag, v]) {
                Err(ServeError::Seconds { flag: f, .. }) => assert_eq!(f, flag),
                other => panic!("{flag} {v}: {other:?}"),
            }
        }
    }
}
