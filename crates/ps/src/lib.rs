//! gradwire-ps: the parameter server (DistBelief, MXNet KVStore).
//!
//! This layer owns server shards, the worker-side KVStore client, consistency modes,
//! server-side updaters and the PS wire protocol. It must never know what a model or a data
//! set is: it stores and updates named f32 tensors.
//!
//! # Pieces
//! - [`KvStore`] (worker side): `init`, `push`, `pull`, `push_pull`, `pull_rows`; tables are
//!   sliced into chunks and placed on shards by [`Placement`] (consistent hashing, virtual
//!   nodes, bounded loads by size). Pushes may be compressed with any gradwire codec or
//!   MXNet's [`TwoBit`], with the residual kept on the worker. [`Downpour`] adds DistBelief's
//!   `n_fetch` / `n_push` loop on top.
//! - [`Shard`] (server side, sans-IO) and [`Server`] (TCP): per-table [`Consistency`]
//!   (sync / async / SSP), declarative updaters ([`UpdaterSpec`]: SGD, momentum, Adagrad,
//!   Adam; never code on the wire), exactly-once pushes by (worker, incarnation, seq) with a
//!   bounded window, fencing of old incarnations, heartbeats, deadlines on every wait,
//!   atomic checkpoints with optimizer state and an optional fsynced write-ahead log.
//! - [`auth`]: every connection proves the shared token with the TCP transport's mutual
//!   challenge-response before any PS frame and is bound to one worker id and a [`Role`];
//!   a stranger gets no answer at all. Every shard holds each request to its [`Limits`].
//! - [`wire`]: the protocol, documented byte by byte, with a total decoder.
//! - [`fault`]: a seeded proxy that drops, duplicates, reorders, delays, corrupts and
//!   partitions frames, and a guard for real shard processes (`gradwire-ps-server`).
//! - [`sandblaster`]: DistBelief's Sandblaster L-BFGS (coordinator vector ops on shards,
//!   small work units, backup tasks).
//!
//! # Transport choice
//! The rank-mesh `gradwire_transport::Transport` (recv from a named peer) does not fit a
//! server that answers whoever calls, so the PS speaks its own framed protocol over
//! `std::net` TCP: handshakes driven together by one accept thread, then one thread per
//! authenticated connection (up to a cap) on the server, one connection per shard on each
//! worker (plus one for heartbeats), deadlines through socket timeouts. Unit tests use the
//! sans-IO [`Shard`] directly.
//!
//! # Not built: chain replication
//! Durability today is a checkpoint plus an optional fsynced WAL per shard ([`durability`]):
//! a restarted shard loses nothing acknowledged, but its chunks are unavailable until it is
//! back.
//! Chain replication with failover (van Renesse & Schneider 2004, as ps-lite's successors
//! sketched) would need:
//! - a chain of `r` replicas per chunk (head, middle, tail) from [`Placement`] (the next
//!   `r - 1` distinct shards on the hash ring), with pushes sent to the head and forwarded
//!   down the chain, acknowledged to the worker only by the tail, and pulls served by the
//!   tail, so a worker never reads an update a crash could undo;
//! - the exactly-once state ((worker, incarnation) → applied window) and the sync round /
//!   SSP clocks replicated with the values, since a promoted replica must reject the same
//!   duplicates and close the same rounds (updater state too: Adagrad and Adam apply
//!   non-idempotent updates, so forwarding must carry the applied result, not the push);
//! - a configuration master (or a consensus group) that detects a dead replica by the
//!   existing heartbeats, removes it from the chain, tells the predecessor to resend
//!   in-flight updates, and bumps a chain epoch that clients and shards check on every frame
//!   (a new wire field and a version bump);
//! - on the client, retries that follow the new head/tail after a `StaleEpoch` error, which
//!   the existing (worker, incarnation, seq) dedup already makes safe;
//! - tests: kill the head, a middle node and the tail during sync and async training with
//!   the exact-sum check, and a partitioned old head that must stop acknowledging.
//!
//! # Glossary
//! *worker* (a training process, `WorkerId` = its rank), *shard* (a server process holding
//! some chunks), *chunk* (a slice of a table), *round* (a sync step), *clock* (a worker's
//! count of pushes to a chunk), *incarnation* (a worker process's generation).
//!
//! # Example
//! ```
//! use gradwire_ps::{ClientConfig, Key, KvStore, Server, ServerConfig, ShardConfig, TableSpec, WorkerId};
//! let server = Server::start(ServerConfig::loopback(ShardConfig::default())).unwrap();
//! let mut kv = KvStore::connect(ClientConfig::new(WorkerId(0), vec![server.local_addr()])).unwrap();
//! kv.init(Key(1), TableSpec::new(gradwire_ps::Consistency::Sync, "sgd:lr=0.5".parse().unwrap()), &[1.0, 2.0]).unwrap();
//! let mut w = vec![0.0; 2];
//! kv.push_pull(Key(1), &[2.0, 2.0], &mut w).unwrap();
//! assert_eq!(w, vec![0.0, 1.0]);
//! ```
#![deny(missing_docs)]

pub mod auth;
pub mod bench;
mod client;
mod downpour;
pub mod durability;
pub mod fault;
mod placement;
pub mod sandblaster;
pub mod serve;
mod server;
mod shard;
mod spec;
mod twobit;
mod updater;
pub mod wire;

pub use auth::{Peer, Role};
pub use client::{ClientConfig, KvStore, PullInfo};
pub use downpour::Downpour;
pub use placement::{ChunkPlace, Placement};
pub use server::{Server, ServerConfig, DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
#[cfg(fuzzing)]
pub use shard::{check_checkpoint_body, check_wal_bytes};
pub use shard::{Limits, Shard, ShardConfig, ShardStats, DEFAULT_WAL_ROTATE_BYTES};
pub use spec::{ChunkId, Consistency, DeadPolicy, Key, PushCodec, PushMode, TableSpec, WorkerId};
pub use twobit::{TwoBit, TwoBitConfig};
pub use updater::{apply as apply_update, OptState, UpdaterSpec};
pub use wire::{ErrorCode, RemoteError, WireError};

use std::net::SocketAddr;

/// Errors of the parameter server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A spec string (consistency, updater, codec, policy) was refused.
    #[error("bad {what} spec '{spec}': {reason}")]
    Spec {
        /// Which kind of spec.
        what: &'static str,
        /// The spec given.
        spec: String,
        /// Why.
        reason: String,
    },
    /// A shard could not be reached, or did not answer, before the deadline.
    #[error("shard {shard} at {addr}: no answer within the deadline ({last})")]
    Timeout {
        /// The shard's index.
        shard: usize,
        /// Its address.
        addr: SocketAddr,
        /// The last failure seen.
        last: String,
    },
    /// A worker that a sync round or an SSP read waits for is dead (strict policy).
    #[error("worker {worker} is lost: {message}")]
    WorkerLost {
        /// The dead worker.
        worker: u32,
        /// The server's detail.
        message: String,
    },
    /// This worker's incarnation was fenced off by a newer one.
    #[error("worker {worker} is fenced off: a newer incarnation {current} exists")]
    Fenced {
        /// The worker.
        worker: u32,
        /// The newer incarnation.
        current: u64,
    },
    /// The server refused a request (any other code).
    #[error("shard {shard} refused the request: {code:?}: {message}")]
    Remote {
        /// The shard's index.
        shard: usize,
        /// The error code.
        code: ErrorCode,
        /// The worker the error names, if any.
        worker: Option<u32>,
        /// The server's detail.
        message: String,
    },
    /// A table key this client never initialized.
    #[error("key {0} was not initialized by this client")]
    UnknownKey(u64),
    /// A buffer's length differs from the table's.
    #[error("key {key}: buffer of {got} elements, table has {expected}")]
    Length {
        /// The table.
        key: u64,
        /// The table's length.
        expected: usize,
        /// The buffer's length.
        got: usize,
    },
    /// A shard's reply does not fit the request it answers.
    #[error("shard {shard} replied with {what}")]
    BadReply {
        /// The shard's index.
        shard: usize,
        /// What was wrong with the reply.
        what: &'static str,
    },
    /// A checkpoint or WAL file could not be read or written.
    #[error("durability: {0}")]
    Durability(std::io::Error),
    /// A checkpoint file is corrupt.
    #[error("corrupt checkpoint: {0}")]
    CorruptCheckpoint(WireError),
    /// A shard was asked to listen off loopback without a token (and without `insecure`).
    #[error(
        "refusing to listen on {listen} without a token: anyone who can reach it could act \
         as any worker; set GRADWIRE_PS_TOKEN (or GRADWIRE_TOKEN) on the shards and the \
         workers, or pass --insecure"
    )]
    Insecure {
        /// The address asked for.
        listen: SocketAddr,
    },
    /// Binding or accepting failed.
    #[error("server i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
