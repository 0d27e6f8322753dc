//! A worker's client settings ([`ClientConfig`]) and their defaults.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::auth::{token_from_env, Role};
use crate::spec::WorkerId;
use crate::wire::DEFAULT_MAX_BODY;

/// Settings of a worker's client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// This worker's rank.
    pub worker: WorkerId,
    /// This process's incarnation; a restarted worker must use a larger one (the default,
    /// nanoseconds since the epoch, does).
    pub incarnation: u64,
    /// The shards' addresses, in shard order.
    pub shards: Vec<SocketAddr>,
    /// How long one attempt waits for its reply (must exceed the shards' `max_wait`).
    pub attempt_timeout: Duration,
    /// How long an operation may take in all, retries included.
    pub deadline: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Heartbeat period (`None`: off; the default is on, every 500 ms).
    pub heartbeat: Option<Duration>,
    /// Largest chunk, in elements (BytePS uses 4 MB = 1 Mi f32).
    pub chunk_elems: usize,
    /// Virtual nodes per shard on the hash ring.
    pub vnodes: u32,
    /// Load bound of the placement (× average).
    pub imbalance: f64,
    /// Largest reply body accepted.
    pub max_body: usize,
    /// Seed of stochastic codecs.
    pub seed: u64,
    /// The token to prove to the shards (default: [`crate::auth::token_from_env`]).
    pub token: String,
    /// This client's role (default: the coordinator for worker 0, a worker otherwise).
    pub role: Role,
}

impl ClientConfig {
    /// Defaults for `worker` talking to `shards`.
    pub fn new(worker: WorkerId, shards: Vec<SocketAddr>) -> Self {
        ClientConfig {
            worker,
            incarnation: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                .max(1),
            shards,
            attempt_timeout: Duration::from_secs(40),
            deadline: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(2),
            heartbeat: Some(Duration::from_millis(500)),
            chunk_elems: 1 << 20,
            vnodes: 64,
            imbalance: 1.25,
            max_body: DEFAULT_MAX_BODY,
            seed: 0,
            token: token_from_env(),
            role: if worker.0 == 0 {
                Role::Coordinator
            } else {
                Role::Worker
            },
        }
    }
}
