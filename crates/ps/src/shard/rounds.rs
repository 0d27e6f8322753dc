//! Consistency bookkeeping: when a sync round may close, closing it, and when an SSP read
//! is within its staleness bound.

use std::time::Instant;

use crate::spec::{ChunkId, DeadPolicy};
use crate::updater::apply;
use crate::wire::ErrorCode;

use super::*;

impl Shard {
    /// Sync: whether the open round of `id` may close now.
    pub(super) fn round_ready(
        &self,
        st: &State,
        id: ChunkId,
        now: Instant,
    ) -> Result<bool, Rejection> {
        let c = &st.chunks[&id];
        if c.contributors.is_empty() {
            return Ok(false);
        }
        let mut waiting = false;
        for w in 0..self.cfg.num_workers {
            if c.contributors.contains(&w) {
                continue;
            }
            match self.liveness(st, w, now) {
                Live::Left => {}
                Live::Dead if c.spec.dead_policy == DeadPolicy::Strict => {
                    return Err(err(
                        ErrorCode::WorkerLost,
                        Some(w),
                        c.round,
                        format!(
                            "worker {w} is dead; sync round {} of {id} cannot close",
                            c.round
                        ),
                    ))
                }
                Live::Dead => {}
                Live::Alive => waiting = true,
            }
        }
        Ok(!waiting)
    }

    /// Sync: closes the round of `id` if it may, logging the close first.
    pub(super) fn try_close(
        &self,
        st: &mut State,
        id: ChunkId,
        now: Instant,
    ) -> Result<(), Rejection> {
        if self.round_ready(st, id, now)? {
            let mut data = Vec::with_capacity(12);
            data.extend_from_slice(&id.key.0.to_le_bytes());
            data.extend_from_slice(&id.index.to_le_bytes());
            self.log(st, 2, &data)?;
            Self::close(st, id);
            self.cv.notify_all();
        }
        Ok(())
    }

    pub(super) fn close(st: &mut State, id: ChunkId) {
        let Some(c) = st.chunks.get_mut(&id) else {
            return;
        };
        if c.n_grad > 0 {
            let inv = 1.0 / c.n_grad as f32;
            for g in c.pend_grad.iter_mut() {
                *g *= inv;
            }
            apply(&c.spec.updater, &mut c.opt, &mut c.values, &c.pend_grad);
        }
        if !c.pend_add.is_empty() {
            for (v, a) in c.values.iter_mut().zip(&c.pend_add) {
                *v += a;
            }
        }
        c.n_grad = 0;
        c.pend_grad.clear();
        c.pend_add.clear();
        c.contributors.clear();
        c.round += 1;
        st.stats.rounds += 1;
    }

    pub(super) fn missing_sync(&self, st: &State, id: ChunkId) -> (Option<u32>, String) {
        let c = &st.chunks[&id];
        let missing: Vec<u32> = (0..self.cfg.num_workers)
            .filter(|w| !c.contributors.contains(w) && !st.workers[*w as usize].left)
            .collect();
        (
            missing.first().copied(),
            format!(
                "sync round {} of {id} still waits for workers {missing:?}",
                c.round
            ),
        )
    }

    /// SSP: whether worker `w` may read `id` now; the slowest considered clock.
    pub(super) fn ssp_ready(
        &self,
        st: &State,
        id: ChunkId,
        w: u32,
        s: u64,
        now: Instant,
    ) -> Result<(bool, u64), Rejection> {
        let c = &st.chunks[&id];
        let mine = c.clocks[w as usize];
        let mut ready = true;
        let mut min = mine;
        for v in 0..self.cfg.num_workers {
            let live = self.liveness(st, v, now);
            if live == Live::Left
                || (live == Live::Dead && c.spec.dead_policy == DeadPolicy::Shrink)
            {
                continue;
            }
            let cv = c.clocks[v as usize];
            min = min.min(cv);
            if cv + s < mine {
                if live == Live::Dead {
                    return Err(err(
                        ErrorCode::WorkerLost,
                        Some(v),
                        cv,
                        format!("worker {v} is dead at clock {cv}; worker {w} at clock {mine} cannot read {id} within staleness {s}"),
                    ));
                }
                ready = false;
            }
        }
        Ok((ready, min))
    }
}
