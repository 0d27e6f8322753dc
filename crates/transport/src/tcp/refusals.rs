//! Rate-limited logging of the connections an accepting rank drops: the first one after a
//! quiet interval is logged at once with its reason; those that follow within the interval
//! are counted by kind and logged as one line when the interval ends (or the log is dropped).
//! A flood of strangers costs a line per interval, not a line each.

use std::fmt::Display;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How often at most a line is logged.
pub(super) const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Counts of dropped connections, logged at most once per interval.
pub(super) struct RefusalLog {
    rank: u32,
    interval: Duration,
    /// When the last line was logged.
    last_line: Option<Instant>,
    /// Drops since the last line, by kind (few kinds: a short list).
    counts: Vec<(&'static str, u64)>,
    /// The last drop since the last line: from where, and why.
    last: Option<(SocketAddr, String)>,
}

impl RefusalLog {
    /// A log for the accepting rank (or service) `rank`.
    pub(super) fn new(rank: u32) -> RefusalLog {
        RefusalLog::with_interval(rank, LOG_INTERVAL)
    }

    pub(super) fn with_interval(rank: u32, interval: Duration) -> RefusalLog {
        RefusalLog {
            rank,
            interval,
            last_line: None,
            counts: Vec::new(),
            last: None,
        }
    }

    /// Notes one dropped connection of `kind` (a short fixed phrase), for reason `why`.
    pub(super) fn dropped(&mut self, from: SocketAddr, kind: &'static str, why: &dyn Display) {
        let now = Instant::now();
        let quiet = self
            .last_line
            .is_none_or(|t| now.duration_since(t) >= self.interval);
        if quiet && self.counts.is_empty() {
            self.last_line = Some(now);
            tracing::warn!(%from, rank = self.rank, "refused a connection: {why}");
            return;
        }
        match self.counts.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.counts.push((kind, 1)),
        }
        self.last = Some((from, why.to_string()));
        self.tick();
    }

    /// Logs the counts once the interval since the last line has passed.
    pub(super) fn tick(&mut self) {
        if self.last_line.is_none_or(|t| t.elapsed() >= self.interval) {
            self.flush();
        }
    }

    /// Logs the counts now, if any.
    pub(super) fn flush(&mut self) {
        if self.counts.is_empty() {
            return;
        }
        let total: u64 = self.counts.iter().map(|(_, n)| n).sum();
        let kinds = self
            .counts
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", ");
        let since = self.last_line.map_or(String::new(), |t| {
            format!(" in the last {:.1?}", t.elapsed())
        });
        let (from, why) = self
            .last
            .take()
            .unwrap_or_else(|| (SocketAddr::from(([0, 0, 0, 0], 0)), String::from("unknown")));
        tracing::warn!(
            rank = self.rank,
            refused = total,
            "refused {total} connection(s){since}: {kinds}; the last from {from}: {why}"
        );
        self.counts.clear();
        self.last_line = Some(Instant::now());
    }
}

impl Drop for RefusalLog {
    fn drop(&mut self) {
        self.flush();
    }
}
