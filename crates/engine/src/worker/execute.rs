//! Executing the ready tensors: grouped by kind within `fusion_bytes`
//! ([`crate::fusion::plan_groups`]), each group run by [`crate::fusion`]'s executor (or, for
//! the speculative batch, already done in the negotiation round), its submissions completed,
//! and the bookkeeping of each group: bytes per step, stragglers, and the timeline's spans.

use crate::error::Result;
use crate::fusion::{plan_groups, Clock, Item, Kind};
use crate::timeline::{Phase, Span};

use super::negotiate::SpecDone;
use super::{lock, stamp, Worker};

impl Worker {
    /// Executes the ready tensors, fused, in id order. A selection unit runs once all of its
    /// tensors are ready; until then its ready ones stay pending (the ready set is the same
    /// on every rank, so every rank holds the same ones back).
    pub(super) fn execute(&mut self, ready: &[usize], negotiated_us: u64) -> Result<()> {
        if ready.is_empty() {
            return Ok(());
        }
        // Which units are complete, looked up once per round (not per member: a unit can
        // hold every tensor of the model); nothing allocated without units.
        let unit_ready: Vec<bool> = if self.units.is_empty() {
            Vec::new()
        } else {
            let mut is_ready = vec![false; self.entries.len()];
            for &id in ready {
                is_ready[id] = true;
            }
            self.units
                .iter()
                .map(|u| u.iter().all(|&m| is_ready[m]))
                .collect()
        };
        let plan: Vec<(usize, Kind, usize)> = ready
            .iter()
            .filter(|&&id| match self.states[id].kind {
                Kind::SparseUnit(u) | Kind::GatherUnit(u) => unit_ready[u],
                _ => true,
            })
            .map(|&id| (id, self.states[id].kind, 4 * self.entries[id].len))
            .collect();
        for mut group in plan_groups(&plan, self.cfg.fusion_bytes) {
            group.sort_unstable();
            self.run_group(&group, negotiated_us, None)?;
        }
        Ok(())
    }

    /// Runs one group; `reduced`: the speculative batch's buffer, whose owned chunk the
    /// combined round has already reduced (only the all-gather is left), with the bytes that
    /// round sent for it.
    pub(super) fn run_group(
        &mut self,
        group: &[usize],
        negotiated_us: u64,
        reduced: Option<SpecDone>,
    ) -> Result<()> {
        let timeline = self.shared.timeline;
        let start = stamp(timeline);
        // Last group's (emptied) buffer: no allocation per group.
        let mut subs = std::mem::take(&mut self.group_subs);
        subs.extend(group.iter().map(|&id| {
            if !self.warned.is_empty() {
                self.warned.remove(&self.entries[id].desc.name);
            }
            self.pending
                .take_id(id)
                .expect("ready tensors are pending here")
        }));
        let kind = self.states[group[0]].kind;
        let spec_sent = reduced.as_ref().map_or(0, |d| d.bytes);
        let mut clock = Clock::start(timeline);
        let before = self.t.bytes_sent() + self.exec.local_bytes_sent();
        let res = if let Some(done) = &reduced {
            // Reduced and gathered in the negotiation round, in the submissions' buffers.
            clock.span(Phase::Wire, done.gather_us.0, done.gather_us.1);
            Ok(())
        } else {
            let mut items: Vec<Item<'_>> = Vec::with_capacity(group.len());
            let mut subs_it = subs.iter_mut();
            for (id, state) in self.states.iter_mut().enumerate() {
                if group.binary_search(&id).is_ok() {
                    let s = subs_it.next().expect("one submission per id");
                    items.push(Item {
                        state,
                        data: &mut s.data,
                        encoded: s.encoded.as_ref(),
                        progress: s.progress,
                    });
                }
            }
            self.exec.run(
                &mut *self.t,
                self.cfg.momentum.as_ref(),
                &mut items,
                &mut clock,
            )
        };
        let wire =
            (self.t.bytes_sent() + self.exec.local_bytes_sent()).saturating_sub(before) + spec_sent;
        if let Err(e) = res {
            for s in subs.drain(..) {
                s.slot.complete(Err(e.clone()));
            }
            self.group_subs = subs;
            return Err(e);
        }
        // Stragglers: per rank, the latest submit time among the group's tensors.
        let per_rank = (0..self.world).map(|r| {
            group
                .iter()
                .map(|&id| self.ready_at[id][r])
                .max()
                .unwrap_or(0)
        });
        let (mut last_rank, mut hi, mut lo) = (0, 0u64, u64::MAX);
        for (r, t) in per_rank.enumerate() {
            if t > hi {
                hi = t;
                last_rank = r;
            }
            lo = lo.min(t);
        }
        {
            let mut st = lock(&self.shared.stats);
            if matches!(kind, Kind::AllGather | Kind::Broadcast(_) | Kind::Barrier) {
                st.bytes.other_bytes += wire;
            } else {
                let raw: u64 = group
                    .iter()
                    .map(|&id| 4 * self.entries[id].len as u64)
                    .sum();
                st.add_step(subs[0].progress.step, raw, wire, group.len() as u64);
            }
            st.stragglers.record(
                self.world,
                &self.entries[group[0]].desc.name,
                group.len(),
                last_rank,
                hi.saturating_sub(lo),
            );
        }
        if timeline {
            let mut spans = lock(&self.shared.spans);
            for s in &subs {
                let tensor = &s.desc.name;
                let mut push = |phase, start_us, end_us| {
                    spans.push(Span {
                        tensor: tensor.clone(),
                        phase,
                        rank: self.rank,
                        start_us,
                        end_us,
                    })
                };
                push(Phase::Negotiate, s.ready_us, negotiated_us.max(s.ready_us));
                push(Phase::Queue, negotiated_us, start.max(negotiated_us));
                for &(phase, a, b) in &clock.spans {
                    push(phase, a, b);
                }
            }
        }
        for s in subs.drain(..) {
            s.slot.complete(Ok(s.data));
        }
        self.group_subs = subs;
        Ok(())
    }
}
