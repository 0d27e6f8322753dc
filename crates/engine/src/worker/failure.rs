//! What fails operations: a failed cycle (every queued and pending operation gets its
//! error, and the worker with the transport is dropped), the stall inspector (tensors some
//! ranks submitted and others did not: warned about, then aborted with
//! [`Error::Stalled`]), and, at shutdown, tensors some ranks never submitted
//! ([`Error::NotSubmittedEverywhere`]).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::stats::StallReport;
use crate::wire::Message;

use super::{lock, Worker};

/// A cycle failed: every queued and pending operation gets the error, the engine is marked
/// exited, and the worker (with the transport) is dropped so that peers see this rank gone.
pub(super) fn fail(slot: &mut Option<Worker>, e: Error) {
    let Some(mut w) = slot.take() else {
        return;
    };
    tracing::error!(rank = w.rank, "engine failed: {e}");
    let mut q = lock(&w.shared.queue);
    q.exited = true;
    q.fatal = Some(e.clone());
    for s in q.subs.drain(..) {
        s.slot.complete(Err(e.clone()));
    }
    drop(q);
    for (_, s) in w.pending.drain() {
        s.slot.complete(Err(e.clone()));
    }
    w.shared.wake.notify_all();
}

impl Worker {
    /// The stall inspector: tensors some ranks submitted and others did not.
    pub(super) fn inspect(&mut self, msgs: &[Message], now: u64) -> Result<()> {
        let mut stalls: Vec<(String, Vec<usize>, Vec<usize>, u64)> = Vec::new();
        for id in 0..self.entries.len() {
            let count = msgs.iter().filter(|m| m.bit(id)).count();
            if count == 0 || count == self.world {
                continue;
            }
            let have: Vec<usize> = (0..self.world).filter(|&r| msgs[r].bit(id)).collect();
            let first = have
                .iter()
                .map(|&r| self.ready_at[id][r])
                .min()
                .unwrap_or(now);
            let missing = (0..self.world).filter(|r| !have.contains(r)).collect();
            stalls.push((self.entries[id].desc.name.clone(), have, missing, first));
        }
        // A selection unit waits for all of its tensors: one nobody submitted holds back
        // those submitted everywhere (reported as missing on every rank, since the first of
        // those).
        for unit in &self.units {
            let count = |id: usize| msgs.iter().filter(|m| m.bit(id)).count();
            let first = unit
                .iter()
                .filter(|&&id| count(id) == self.world)
                .flat_map(|&id| self.ready_at[id].iter().copied())
                .min();
            let Some(first) = first else { continue };
            for &id in unit.iter().filter(|&&id| count(id) == 0) {
                let missing = (0..self.world).collect();
                stalls.push((self.entries[id].desc.name.clone(), vec![], missing, first));
            }
        }
        for a in &self.adhoc {
            let have: Vec<usize> = (0..self.world)
                .filter(|&r| a.by_rank[r].is_some())
                .collect();
            let first = a
                .by_rank
                .iter()
                .flatten()
                .map(|(t, _)| *t)
                .min()
                .unwrap_or(now);
            let missing = (0..self.world).filter(|r| !have.contains(r)).collect();
            stalls.push((a.name.clone(), have, missing, first));
        }
        for (tensor, ready_ranks, missing_ranks, first) in stalls {
            let waited = Duration::from_micros(now.saturating_sub(first));
            if let Some(abort) = self.cfg.stall_abort {
                if waited >= abort {
                    return Err(Error::Stalled {
                        tensor,
                        missing_ranks,
                        waited,
                    });
                }
            }
            if let Some(warn) = self.cfg.stall_warning {
                if waited >= warn && !self.warned.contains(&tensor) {
                    tracing::warn!(
                        tensor = %tensor,
                        ?missing_ranks,
                        ?ready_ranks,
                        "stall: tensor '{tensor}' submitted by ranks {ready_ranks:?} but not by \
                         ranks {missing_ranks:?} for {waited:?}"
                    );
                    self.warned.insert(tensor.clone());
                    lock(&self.shared.stats).stalls.push(StallReport {
                        tensor,
                        ready_ranks,
                        missing_ranks,
                        waited_ms: waited.as_millis() as u64,
                    });
                }
            }
        }
        Ok(())
    }

    /// At shutdown: what some ranks submitted and others never did fails, naming them.
    pub(super) fn fail_unmatched(&mut self, msgs: &[Message]) {
        for (id, s) in self.pending.drain() {
            let name = s.desc.name.clone();
            let missing = match id {
                Some(id) => (0..self.world).filter(|&r| !msgs[r].bit(id)).collect(),
                None => self
                    .adhoc
                    .iter()
                    .find(|a| a.name == name)
                    .map(|a| {
                        (0..self.world)
                            .filter(|&r| a.by_rank[r].is_none())
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            s.slot.complete(Err(Error::NotSubmittedEverywhere {
                tensor: name,
                missing_ranks: missing,
            }));
        }
    }
}
