//! Workers as a shard sees them: id and incarnation checks, fencing, registration and
//! liveness.

use std::time::Instant;

use crate::spec::WorkerId;
use crate::wire::{ErrorCode, Request};

use super::*;

impl Shard {
    /// Checks the worker id and incarnation, refreshes liveness, and (on a newer
    /// incarnation, or `hello`) registers it.
    pub(super) fn touch(
        &self,
        st: &mut State,
        worker: WorkerId,
        incarnation: Option<u64>,
        hello: bool,
    ) -> Result<(), Rejection> {
        let w = worker.0;
        if w >= self.cfg.num_workers {
            return Err(err(
                ErrorCode::UnknownWorker,
                Some(w),
                self.cfg.num_workers as u64,
                format!(
                    "worker {w} is not below the shard's worker count {}",
                    self.cfg.num_workers
                ),
            ));
        }
        let slot = &mut st.workers[w as usize];
        let Some(inc) = incarnation else {
            slot.last_seen = Instant::now();
            return Ok(());
        };
        if inc < slot.incarnation {
            return Err(err(
                ErrorCode::Fenced,
                Some(w),
                slot.incarnation,
                format!(
                    "worker {w} incarnation {inc} is fenced off (current {})",
                    slot.incarnation
                ),
            ));
        }
        // Only a current (or newer) incarnation keeps the worker alive: a fenced zombie's
        // heartbeats do not.
        slot.last_seen = Instant::now();
        if inc > slot.incarnation || (hello && slot.left) {
            let req = Request::Hello {
                worker,
                incarnation: inc,
            };
            self.log_request(st, &req)?;
            Self::apply_hello(st, w, inc);
        }
        Ok(())
    }

    pub(super) fn apply_hello(st: &mut State, w: u32, inc: u64) {
        let slot = &mut st.workers[w as usize];
        if inc > slot.incarnation {
            slot.incarnation = inc;
            slot.base = 0;
            slot.above.clear();
        }
        slot.left = false;
    }

    pub(super) fn liveness(&self, st: &State, w: u32, now: Instant) -> Live {
        let s = &st.workers[w as usize];
        if s.left {
            Live::Left
        } else if now.saturating_duration_since(s.last_seen) > self.cfg.heartbeat_timeout {
            Live::Dead
        } else {
            Live::Alive
        }
    }
}
