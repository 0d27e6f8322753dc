//! What can go wrong while launching.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

use crate::elastic::ElasticError;

use super::status::describe;

/// Why launching, waiting for or joining a job failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// No free port for the rendezvous could be found on loopback.
    #[error("finding a free port for the rendezvous")]
    Port(#[source] io::Error),
    /// Rank `rank`'s command could not be started.
    #[error("starting rank {rank}: {program}")]
    SpawnRank {
        /// The rank.
        rank: usize,
        /// The program it runs.
        program: String,
        /// Why it did not start.
        #[source]
        source: io::Error,
    },
    /// Worker `index` of an elastic job (which has no rank yet) could not be started.
    #[error("starting worker {index}: {program}")]
    SpawnWorker {
        /// Which of the processes started (0..np).
        index: usize,
        /// The program it runs.
        program: String,
        /// Why it did not start.
        #[source]
        source: io::Error,
    },
    /// Asking whether rank `rank` has exited failed.
    #[error("waiting for rank {rank}")]
    Wait {
        /// The rank.
        rank: usize,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The running binary's path, which [`run_ranks_for_json`](super::run_ranks_for_json)
    /// starts, is unknown.
    #[error("locating the running binary")]
    CurrentExe(#[source] io::Error),
    /// The thread that read rank 0's standard output panicked.
    #[error("reading rank 0's output")]
    RankOutput,
    /// A rank of [`run_ranks_for_json`](super::run_ranks_for_json) failed.
    #[error("rank {rank} failed ({})", describe(*.status))]
    RankFailed {
        /// The first rank that failed.
        rank: usize,
        /// How it ended.
        status: ExitStatus,
    },
    /// Rank 0 printed no JSON line.
    #[error("rank 0 printed no result")]
    NoResult,
    /// Rank 0's last JSON line is not the expected result.
    #[error("parsing rank 0's result")]
    ParseResult(#[source] serde_json::Error),
    /// The elastic membership coordinator did not start.
    #[error("starting the elastic coordinator")]
    Coordinator(#[source] ElasticError),
    /// The join file (or its folder) could not be written.
    #[error("writing the join file {}", .path.display())]
    WriteJoinFile {
        /// The file, or the folder that could not be created.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The join file could not be read: no elastic job runs there.
    #[error("no running elastic job to join: {} unreadable", .path.display())]
    ReadJoinFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The join file is not one.
    #[error("parsing {}", .path.display())]
    ParseJoinFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The join file's command could not replace this process.
    #[error("starting {program}")]
    Exec {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Why an elastic job stopped before it finished.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stopped {
    /// The coordinator gave up; its reason (every waiting member got it too).
    #[error("{0}")]
    Aborted(String),
    /// A signal stopped the job: passed on to every process, which then all ended.
    #[error("stopped by signal {0}")]
    Signal(i32),
}
