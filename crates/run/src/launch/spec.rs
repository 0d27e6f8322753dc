//! What to start.

use std::net::SocketAddr;

/// What to start: `np` ranks of one command.
#[derive(Debug, Clone, PartialEq)]
pub struct RankSpec {
    /// Number of ranks.
    pub np: usize,
    /// Rendezvous address (default: loopback, a free port).
    pub master: Option<SocketAddr>,
    /// Deadline in seconds passed as GRADWIRE_TIMEOUT.
    pub timeout: Option<f64>,
    /// Program to run.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

/// How an elastic job's processes find their coordinator (see
/// [`spawn_elastic`](super::spawn_elastic)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElasticEnv {
    /// The coordinator's address (`GRADWIRE_ELASTIC`).
    pub coordinator: SocketAddr,
    /// The job's token (`GRADWIRE_TOKEN`).
    pub token: String,
    /// The job's id (`GRADWIRE_JOB_ID`).
    pub job: String,
}
