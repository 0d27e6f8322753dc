//! What an authenticated connection may ask of a shard: requests naming a worker only for
//! the worker the connection is bound to, and the coordinator's operations (checkpoints,
//! Sandblaster's vector ops) only from the coordinator. `Init` is decided in `tables.rs`:
//! the coordinator creates, a worker only joins an identical existing table.

use crate::auth::{Peer, Role};
use crate::spec::WorkerId;
use crate::wire::{ErrorCode, Request};

use super::*;

impl Shard {
    /// Refuses (`PermissionDenied`) what `peer` may not ask. The refusal names only the
    /// peer's own worker id: nothing about another worker's state.
    pub(super) fn authorize(&self, peer: &Peer, req: &Request) -> Result<(), Rejection> {
        let own = |w: WorkerId| {
            if w == peer.worker {
                Ok(())
            } else {
                Err(err(
                    ErrorCode::PermissionDenied,
                    None,
                    0,
                    format!(
                        "this connection is bound to worker {}; it may not act for another",
                        peer.worker.0
                    ),
                ))
            }
        };
        let coordinator = |what: &str| {
            if peer.role == Role::Coordinator {
                Ok(())
            } else {
                Err(err(
                    ErrorCode::PermissionDenied,
                    None,
                    0,
                    format!("{what} is the coordinator's; this connection is a worker's"),
                ))
            }
        };
        match req {
            Request::Hello { worker, .. }
            | Request::Heartbeat { worker, .. }
            | Request::Leave { worker, .. }
            | Request::Pull { worker, .. } => own(*worker),
            Request::Push(p) | Request::PushPull(p) => own(p.worker),
            Request::Init { .. } | Request::Stats => Ok(()),
            Request::Checkpoint => coordinator("a checkpoint"),
            Request::VecOp(_) | Request::SetVec { .. } => coordinator("a Sandblaster vector op"),
        }
    }
}
