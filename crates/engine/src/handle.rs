//! [`Handle`]: the result of one non-blocking operation (Aluminum's request), waitable and
//! testable in any order. Dropping a handle detaches it; the operation still runs.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::worker::Shared;

/// Where the progress thread leaves an operation's outcome.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    ready: Condvar,
}

/// A slot's outcome, and how many threads sleep on it.
#[derive(Debug, Default)]
struct SlotState {
    outcome: Option<Result<Vec<f32>>>,
    /// Threads inside a wait on `ready`: a completion wakes only when there is one (a
    /// condvar's notify is a system call even with nobody waiting, and most outcomes are
    /// taken by the thread that ran the round, which never sleeps on the slot).
    sleepers: u32,
}

impl Slot {
    /// Stores the outcome (the first one wins) and wakes the waiter, if one sleeps.
    pub(crate) fn complete(&self, outcome: Result<Vec<f32>>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.outcome.is_none() {
            s.outcome = Some(outcome);
        }
        if s.sleepers > 0 {
            self.ready.notify_all();
        }
    }

    /// Empties a slot nobody else holds, for its next operation.
    pub(crate) fn reset(&self) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = SlotState::default();
    }

    /// Sleeps on the slot (at most `timeout`; `None`: until woken), counted in `sleepers`
    /// while it does so that [`Slot::complete`] knows to wake it.
    fn sleep<'a>(
        &self,
        mut s: MutexGuard<'a, SlotState>,
        timeout: Option<Duration>,
    ) -> MutexGuard<'a, SlotState> {
        s.sleepers += 1;
        let mut s = match timeout {
            Some(t) => {
                self.ready
                    .wait_timeout(s, t)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => self.ready.wait(s).unwrap_or_else(|e| e.into_inner()),
        };
        s.sleepers -= 1;
        s
    }
}

/// One pending operation. [`Handle::wait`] blocks until the reduced tensor is back;
/// [`Handle::test`] polls.
#[must_use = "an operation's result is only reachable through its handle"]
pub struct Handle {
    slot: Arc<Slot>,
    name: Arc<str>,
    /// The engine, so that a waiting thread can run a cycle itself.
    driver: Option<Arc<Shared>>,
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("name", &self.name)
            .field("done", &self.test())
            .finish()
    }
}

impl Handle {
    pub(crate) fn new(name: Arc<str>) -> (Handle, Arc<Slot>) {
        Handle::with_slot(name, Arc::new(Slot::default()))
    }

    /// A handle on `slot` (an empty one: fresh, or [`Slot::reset`]).
    pub(crate) fn with_slot(name: Arc<str>, slot: Arc<Slot>) -> (Handle, Arc<Slot>) {
        (
            Handle {
                slot: slot.clone(),
                name,
                driver: None,
            },
            slot,
        )
    }

    pub(crate) fn with_driver(mut self, shared: Arc<Shared>) -> Handle {
        self.driver = Some(shared);
        self
    }

    /// A handle that is already complete (with an error found at submission).
    pub(crate) fn failed(name: Arc<str>, e: Error) -> Handle {
        let (h, slot) = Handle::new(name);
        slot.complete(Err(e));
        h
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the operation has completed (successfully or not); never blocks.
    pub fn test(&self) -> bool {
        self.slot
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .outcome
            .is_some()
    }

    /// Blocks until the operation completes and returns its result (the reduced tensor,
    /// the gathered concatenation, or the broadcast buffer).
    ///
    /// The waiting thread runs the negotiation rounds itself while the progress thread is not
    /// in one (no hand-off to the progress thread and back); otherwise it sleeps until the
    /// result arrives or the next cycle is due. It never spins.
    pub fn wait(self) -> Result<Vec<f32>> {
        let mut s = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = s.outcome.take() {
                return r;
            }
            match &self.driver {
                Some(d) => {
                    drop(s);
                    let ran = d.drive();
                    s = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
                    if !ran && s.outcome.is_none() {
                        s = self.slot.sleep(s, Some(d.cycle));
                    }
                }
                None => s = self.slot.sleep(s, None),
            }
        }
    }

    /// [`Handle::wait`] with a deadline: gives the handle back if it is still pending.
    pub fn wait_timeout(self, timeout: Duration) -> std::result::Result<Result<Vec<f32>>, Handle> {
        let deadline = std::time::Instant::now() + timeout;
        {
            let mut s = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(r) = s.outcome.take() {
                    return Ok(r);
                }
                let now = std::time::Instant::now();
                if now >= deadline {
                    break;
                }
                s = self.slot.sleep(s, Some(deadline - now));
            }
        }
        Err(self)
    }
}
