//! `link::clock`: where the link emulator reads the time and waits for it. A job uses the
//! host's `CLOCK_MONOTONIC` ([`Monotonic`]); a test drives the emulator's schedule on a
//! simulated [`Clock`], so what it checks does not depend on the machine's load.

use std::time::Duration;

/// The emulator's time source, in nanoseconds. Every rank of a job must read the same clock
/// (the processes of one host share `CLOCK_MONOTONIC`); ranks on different hosts may be
/// skewed, which the emulator tolerates (see the module doc of [`crate::link`]).
pub trait Clock: Send {
    /// The time now, in nanoseconds.
    fn now_ns(&self) -> u64;

    /// Waits until [`Clock::now_ns`] reads at least `target_ns`; returns the time it woke,
    /// which may be later than `target_ns` (oversleep, a descheduled thread).
    fn sleep_until(&self, target_ns: u64) -> u64;
}

/// `CLOCK_MONOTONIC`: the same clock in every process of one host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Monotonic;

/// Below this much time left, yield instead of sleeping (sleeps overshoot by ~50 µs).
const SPIN_NS: u64 = 80_000;

impl Clock for Monotonic {
    fn now_ns(&self) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    fn sleep_until(&self, target_ns: u64) -> u64 {
        loop {
            let now = self.now_ns();
            if now >= target_ns {
                return now;
            }
            let left = target_ns - now;
            if left > SPIN_NS {
                std::thread::sleep(Duration::from_nanos(left - SPIN_NS));
            } else {
                std::thread::yield_now();
            }
        }
    }
}
