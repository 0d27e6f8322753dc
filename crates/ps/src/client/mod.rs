//! The worker side: [`KvStore`] talks to every shard over one TCP connection each.
//!
//! Every new connection first proves the token with the transport's handshake
//! ([`crate::auth`]), as this worker and role; a shard that does not prove it back is
//! treated as unreachable (the attempt fails and is retried).
//!
//! Every request is retried (reconnecting, with backoff) until the operation's deadline on
//! I/O errors, timeouts, corrupt replies, "your frame was malformed", "busy" and "could not
//! make it durable" answers; a push
//! keeps its sequence number across retries, so the shard applies it once. Replies carry
//! the request id, so a late or duplicated reply to an earlier attempt is skipped.
//! Chunks on different shards are sent in parallel (one scoped thread per shard).
//!
//! Files: `config` ([`ClientConfig`]), `conn` (one shard's connection and a single attempt
//! at a request), `retry` (retrying an attempt until the deadline, and mapping the shard's
//! errors), `store` ([`KvStore`]: connecting, tables, the public operations), `operation`
//! (one push and/or pull over every chunk of a table, shards in parallel).

mod config;
mod conn;
mod operation;
mod retry;
mod store;

pub use config::ClientConfig;
pub use store::{KvStore, PullInfo};
