//! Byte accounting, straggler analysis and stall reports (serde, for the trainer's run.json).
//!
//! **Bytes.** `wire_bytes` are payload bytes this rank's transport reports sent
//! ([`Transport::bytes_sent`](gradwire_transport::Transport::bytes_sent) deltas, frame headers
//! excluded) during the collectives that carry all-reduced tensors: codec payloads, shared
//! scalars, sparse pairs, dense chunks, everything the strategy sends, but not negotiation
//! (`negotiation_bytes`) nor all-gather/broadcast operations (`other_bytes`). `raw_bytes` is
//! `4 x` the elements of those tensors. Both are attributed to the step of
//! [`Engine::set_progress`](crate::Engine::set_progress) current when the tensor was submitted.
//!
//! **Compression ratio** (one definition, everywhere): `raw_bytes / wire_bytes` of this rank:
//! raw fp32 bytes of the gradient divided by the bytes this rank put on the wire to reduce it.
//! It includes the collective's own cost, so an uncompressed ring all-reduce scores
//! `P / (2 (P-1))` (below 1), gather-decode of a codec with payload `p` scores
//! `raw / ((P-1) p)`, and a rank alone (nothing sent) scores infinity (reported as `None`).

use serde::{Deserialize, Serialize};

/// Bytes of one training step on this rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepBytes {
    /// The step (from `set_progress`).
    pub step: u64,
    /// `4 x` elements of the tensors all-reduced in this step.
    pub raw_bytes: u64,
    /// Bytes this rank sent to reduce them.
    pub wire_bytes: u64,
    /// How many tensors.
    pub tensors: u64,
}

impl StepBytes {
    /// `raw_bytes / wire_bytes`; `None` when nothing was sent.
    pub fn compression_ratio(&self) -> Option<f64> {
        ratio(self.raw_bytes, self.wire_bytes)
    }
}

fn ratio(raw: u64, wire: u64) -> Option<f64> {
    (wire > 0).then(|| raw as f64 / wire as f64)
}

/// Cumulative bytes of this rank since the engine started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ByteStats {
    /// `4 x` elements all-reduced.
    pub raw_bytes: u64,
    /// Bytes sent to all-reduce them.
    pub wire_bytes: u64,
    /// Bytes sent by negotiation rounds and the registration check.
    pub negotiation_bytes: u64,
    /// Bytes sent by all-gather and broadcast operations.
    pub other_bytes: u64,
}

impl ByteStats {
    /// `raw_bytes / wire_bytes`; `None` when nothing was sent.
    pub fn compression_ratio(&self) -> Option<f64> {
        ratio(self.raw_bytes, self.wire_bytes)
    }
}

/// One negotiated collective (a fused group): which rank submitted its tensors last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StragglerRecord {
    /// The group's first tensor.
    pub tensor: String,
    /// Tensors in the group.
    pub tensors: usize,
    /// The rank whose submission (the latest of its tensors in the group) came last.
    pub last_rank: usize,
    /// How much later than the earliest rank, in µs.
    pub lag_us: u64,
}

/// Straggler summary over every negotiated collective.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StragglerSummary {
    /// Collectives (fused groups) executed.
    pub collectives: u64,
    /// `last_count[r]`: how many times rank `r` was ready last (ties: the lowest rank).
    pub last_count: Vec<u64>,
    /// Mean lag of the last rank behind the first, µs.
    pub mean_lag_us: f64,
    /// Largest lag, µs.
    pub max_lag_us: u64,
    /// The most recent records (at most [`StragglerSummary::RECENT`]).
    pub recent: Vec<StragglerRecord>,
}

impl StragglerSummary {
    /// How many recent records are kept.
    pub const RECENT: usize = 64;

    /// Records one collective: its first tensor, its tensor count, the rank ready last and
    /// by how much (µs). Once [`StragglerSummary::RECENT`] are kept, the oldest record's
    /// place (and its name's allocation) is reused: nothing is allocated per step.
    pub(crate) fn record(
        &mut self,
        world: usize,
        tensor: &str,
        tensors: usize,
        last_rank: usize,
        lag_us: u64,
    ) {
        if self.last_count.len() < world {
            self.last_count.resize(world, 0);
        }
        self.last_count[last_rank] += 1;
        self.mean_lag_us = (self.mean_lag_us * self.collectives as f64 + lag_us as f64)
            / (self.collectives + 1) as f64;
        self.collectives += 1;
        self.max_lag_us = self.max_lag_us.max(lag_us);
        if self.recent.len() < Self::RECENT {
            self.recent.push(StragglerRecord {
                tensor: tensor.to_string(),
                tensors,
                last_rank,
                lag_us,
            });
            return;
        }
        self.recent.rotate_left(1);
        let r = self.recent.last_mut().expect("RECENT records kept");
        r.tensor.clear();
        r.tensor.push_str(tensor);
        (r.tensors, r.last_rank, r.lag_us) = (tensors, last_rank, lag_us);
    }
}

/// A tensor submitted by some ranks but not all for longer than the warning threshold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StallReport {
    /// The tensor.
    pub tensor: String,
    /// Ranks that had submitted it.
    pub ready_ranks: Vec<usize>,
    /// Ranks that had not.
    pub missing_ranks: Vec<usize>,
    /// How long the earliest rank had waited, ms.
    pub waited_ms: u64,
}

/// Everything the engine measured, for run.json.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineStats {
    /// Cumulative bytes.
    pub bytes: ByteStats,
    /// Bytes per step, in step order.
    pub steps: Vec<StepBytes>,
    /// Stragglers.
    pub stragglers: StragglerSummary,
    /// Stall warnings raised.
    pub stalls: Vec<StallReport>,
    /// Negotiation rounds run.
    pub cycles: u64,
    /// Rounds that also reduced the registered dense batch (the speculative batch: one round
    /// fewer, see `worker.rs`).
    #[serde(default)]
    pub speculative_rounds: u64,
}

impl EngineStats {
    pub(crate) fn add_step(&mut self, step: u64, raw: u64, wire: u64, tensors: u64) {
        self.bytes.raw_bytes += raw;
        self.bytes.wire_bytes += wire;
        let i = match self.steps.binary_search_by_key(&step, |s| s.step) {
            Ok(i) => i,
            Err(i) => {
                self.steps.insert(
                    i,
                    StepBytes {
                        step,
                        ..Default::default()
                    },
                );
                i
            }
        };
        let s = &mut self.steps[i];
        s.raw_bytes += raw;
        s.wire_bytes += wire;
        s.tensors += tensors;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past [`StragglerSummary::RECENT`] records the oldest go first and the rest stay in
    /// order, with every field of the newest; the totals count every record.
    #[test]
    fn recent_records_keep_the_newest_in_order() {
        let mut s = StragglerSummary::default();
        let n = StragglerSummary::RECENT + 6;
        for i in 0..n {
            s.record(3, &format!("t{i}"), i + 1, i % 3, 10 * i as u64);
        }
        assert_eq!(s.collectives, n as u64);
        assert_eq!(s.recent.len(), StragglerSummary::RECENT);
        for (k, r) in s.recent.iter().enumerate() {
            let i = k + 6;
            let want = StragglerRecord {
                tensor: format!("t{i}"),
                tensors: i + 1,
                last_rank: i % 3,
                lag_us: 10 * i as u64,
            };
            assert_eq!(*r, want);
        }
        assert_eq!(s.max_lag_us, 10 * (n as u64 - 1));
        assert_eq!(s.last_count.iter().sum::<u64>(), n as u64);
    }
}
