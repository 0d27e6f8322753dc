//! A simulated [`Clock`] for the link emulator's tests: time moves only when a rank waits, so
//! the emulator's schedule is checked to the nanosecond whatever the machine's load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::Clock;

/// Where every simulated clock starts (a real monotonic clock never reads 0 either).
pub(super) const T0: u64 = 1_000_000_000;

/// Simulated time: `sleep_until(t)` moves the clock to `t` (plus `oversleep`, like a thread
/// woken late) and returns at once. Clones read the same time: one clock cloned into every
/// rank of a single-threaded test is a host's shared clock; a clock per rank (each rank in its
/// own thread) keeps the test deterministic whatever the threads' interleaving, since a rank's
/// time then depends only on its own waits and the stamps it receives.
#[derive(Debug, Clone)]
pub(super) struct FakeClock {
    now: Arc<AtomicU64>,
    oversleep: u64,
}

impl FakeClock {
    /// A clock reading [`T0`] that wakes exactly on time.
    pub(super) fn new() -> FakeClock {
        FakeClock::oversleeping(0)
    }

    /// A clock reading [`T0`] whose every sleep wakes `ns` late.
    pub(super) fn oversleeping(ns: u64) -> FakeClock {
        FakeClock {
            now: Arc::new(AtomicU64::new(T0)),
            oversleep: ns,
        }
    }

    /// Nanoseconds since [`T0`].
    pub(super) fn elapsed(&self) -> u64 {
        self.now_ns() - T0
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sleep_until(&self, target_ns: u64) -> u64 {
        let woke = target_ns + self.oversleep;
        self.now.fetch_max(woke, Ordering::SeqCst).max(woke)
    }
}
