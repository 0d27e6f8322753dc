//! Fault injection for the write-ahead log: tests and failure drills make appends tear
//! (half a record written, then an error) or fsyncs fail, to check that a shard stops
//! acknowledging and loses nothing it acknowledged.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};

/// Failures a [`super::Wal`] injects into its next appends and fsyncs.
#[derive(Debug, Default)]
pub struct WalFaults {
    torn_writes: AtomicU32,
    failed_syncs: AtomicU32,
}

impl WalFaults {
    /// No failures until asked.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `n` appends write half their record, then fail.
    pub fn tear_writes(&self, n: u32) {
        self.torn_writes.store(n, Ordering::SeqCst);
    }

    /// The next `n` fsyncs of the log fail (after their data was written).
    pub fn fail_syncs(&self, n: u32) {
        self.failed_syncs.store(n, Ordering::SeqCst);
    }

    fn take(counter: &AtomicU32) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Whether this write tears (consumes one).
    pub(super) fn tear(&self) -> bool {
        Self::take(&self.torn_writes)
    }

    /// An injected fsync error, if one is due (consumes one).
    pub(super) fn sync_error(&self) -> io::Result<()> {
        if Self::take(&self.failed_syncs) {
            return Err(io::Error::other("injected fsync failure"));
        }
        Ok(())
    }
}
