//! Retrying a request on one shard until its deadline ([`Conn::call`]), and turning the
//! shard's error replies into [`Error`]s.

use std::time::{Duration, Instant};

use super::conn::Conn;
use super::ClientConfig;
use crate::wire::{ErrorCode, RemoteError, Response};
use crate::{Error, Result};

fn remote_to_error(shard: usize, e: RemoteError) -> Error {
    match e.code {
        ErrorCode::WorkerLost => Error::WorkerLost {
            worker: e.worker.unwrap_or(u32::MAX),
            message: e.message,
        },
        ErrorCode::Fenced => Error::Fenced {
            worker: e.worker.unwrap_or(u32::MAX),
            current: e.value,
        },
        code => Error::Remote {
            shard,
            code,
            worker: e.worker,
            message: e.message,
        },
    }
}

impl Conn {
    /// Sends `frame` until a reply comes or `deadline` passes.
    pub(super) fn call(
        &mut self,
        frame: &mut [u8],
        cfg: &ClientConfig,
        deadline: Instant,
    ) -> Result<Response> {
        let mut backoff = Duration::from_millis(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let last = match self.attempt(
                frame,
                cfg,
                cfg.attempt_timeout.min(left.max(Duration::from_millis(1))),
            ) {
                Ok(Response::Error(e)) if e.code.is_protocol() => {
                    // Our frame arrived damaged; the shard dropped the connection.
                    format!("shard saw a malformed frame: {}", e.message)
                }
                Ok(Response::Error(e)) if e.code == ErrorCode::Busy => {
                    format!("shard busy: {}", e.message)
                }
                Ok(Response::Error(e)) if e.code == ErrorCode::Durability => {
                    // Not acknowledged; the shard repairs its log before the next append,
                    // and a resent push keeps its sequence number (applied once).
                    format!("shard could not make it durable: {}", e.message)
                }
                Ok(Response::Error(e)) => return Err(remote_to_error(self.shard, e)),
                Ok(r) => return Ok(r),
                Err(e) => e.to_string(),
            };
            self.stream = None;
            if Instant::now() + backoff >= deadline {
                return Err(Error::Timeout {
                    shard: self.shard,
                    addr: self.addr,
                    last,
                });
            }
            tracing::debug!(shard = self.shard, %last, "retrying");
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
    }
}
