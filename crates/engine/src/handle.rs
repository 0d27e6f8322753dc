//! [`Handle`]: the result of one non-blocking operation (Aluminum's request), waitable and
//! testable in any order. Dropping a handle detaches it; the operation still runs.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::worker::Shared;

/// Where the progress thread leaves an operation's outcome.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    state: Mutex<Option<Result<Vec<f32>>>>,
    ready: Condvar,
}

impl Slot {
    /// Stores the outcome (the first one wins) and wakes the waiter.
    pub(crate) fn complete(&self, outcome: Result<Vec<f32>>) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_none() {
            *s = Some(outcome);
        }
        self.ready.notify_all();
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
        let slot = Arc::new(Slot::default());
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
            if let Some(r) = s.take() {
                return r;
            }
            match &self.driver {
                Some(d) => {
                    drop(s);
                    let ran = d.drive();
                    s = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
                    if !ran && s.is_none() {
                        s = self
                            .slot
                            .ready
                            .wait_timeout(s, d.cycle)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
                None => s = self.slot.ready.wait(s).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// [`Handle::wait`] with a deadline: gives the handle back if it is still pending.
    pub fn wait_timeout(self, timeout: Duration) -> std::result::Result<Result<Vec<f32>>, Handle> {
        let deadline = std::time::Instant::now() + timeout;
        {
            let mut s = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(r) = s.take() {
                    return Ok(r);
                }
                let now = std::time::Instant::now();
                if now >= deadline {
                    break;
                }
                s = self
                    .slot
                    .ready
                    .wait_timeout(s, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        Err(self)
    }
}
