//! Pushes: decoding a payload into a dense delta, the exactly-once checks, and applying
//! (async, SSP) or joining the open round (sync).

use std::sync::MutexGuard;
use std::time::Instant;

use gradwire_codec::Codec;

use crate::spec::{Consistency, PushMode};
use crate::twobit::TwoBit;
use crate::updater::apply;
use crate::wire::{read_f32s, Encoding, ErrorCode, Push, Request};

use super::*;

impl Shard {
    /// Decodes a push's payload into a dense delta of the chunk's length.
    /// `pre`: the dense payload already decoded (outside the shard lock).
    pub(super) fn decode_delta(
        c: &Chunk,
        p: &Push,
        pre: Option<Vec<f32>>,
    ) -> Result<Vec<f32>, Rejection> {
        let n = c.values.len();
        let delta = match p.encoding {
            Encoding::Dense => {
                if p.payload.len() != 4 * n {
                    return Err(err(
                        ErrorCode::ShapeMismatch,
                        None,
                        n as u64,
                        format!(
                            "{}: dense push of {} bytes for {n} elements",
                            p.chunk,
                            p.payload.len()
                        ),
                    ));
                }
                pre.unwrap_or_else(|| read_f32s(&p.payload))
            }
            Encoding::Codec => {
                let dec = c.decoder.as_ref().ok_or_else(|| {
                    invalid(format!(
                        "{}: codec payload for a table without a codec",
                        p.chunk
                    ))
                })?;
                let mut d = vec![0.0; n];
                dec.decode_add(&p.payload, &mut d)
                    .map_err(|e| invalid(format!("{}: {e}", p.chunk)))?;
                d
            }
            Encoding::TwoBit => {
                let mut d = vec![0.0; n];
                TwoBit::decode_add(&p.payload, &mut d)
                    .map_err(|e| invalid(format!("{}: {e}", p.chunk)))?;
                d
            }
        };
        if !delta.iter().all(|v| v.is_finite()) {
            return Err(invalid(format!("{}: non-finite values pushed", p.chunk)));
        }
        Ok(delta)
    }

    /// Applies (async, SSP) or joins to the open round (sync) an accepted push.
    pub(super) fn apply_push(st: &mut State, p: &Push, delta: Vec<f32>) -> u64 {
        let w = p.worker.0;
        st.stats.applied += 1;
        let c = st.chunks.get_mut(&p.chunk).expect("checked by caller");
        let round;
        if c.spec.consistency == Consistency::Sync {
            round = c.round;
            match p.mode {
                PushMode::Grad => {
                    if c.pend_grad.is_empty() {
                        c.pend_grad = delta;
                    } else {
                        for (a, d) in c.pend_grad.iter_mut().zip(&delta) {
                            *a += d;
                        }
                    }
                    c.n_grad += 1;
                }
                PushMode::Add | PushMode::Assign => {
                    if c.pend_add.is_empty() {
                        c.pend_add = delta;
                    } else {
                        for (a, d) in c.pend_add.iter_mut().zip(&delta) {
                            *a += d;
                        }
                    }
                }
            }
            c.contributors.insert(w);
        } else {
            match p.mode {
                PushMode::Grad => apply(&c.spec.updater, &mut c.opt, &mut c.values, &delta),
                PushMode::Add => {
                    for (v, d) in c.values.iter_mut().zip(&delta) {
                        *v += d;
                    }
                }
                PushMode::Assign => c.values.copy_from_slice(&delta),
            }
            c.round += 1;
            round = c.round;
        }
        if let Some(clk) = c.clocks.get_mut(w as usize) {
            *clk += 1;
        }
        let slot = &mut st.workers[w as usize];
        slot.record(p.seq);
        slot.last_joined.insert(p.chunk, round);
        round
    }

    pub(super) fn push(
        &self,
        p: Push,
        deadline: Instant,
    ) -> Result<(u64, MutexGuard<'_, State>), Rejection> {
        // Decode a dense payload before taking the lock (other connections keep going).
        let pre = (p.encoding == Encoding::Dense).then(|| read_f32s(&p.payload));
        let mut st = self.lock();
        self.touch(&mut st, p.worker, Some(p.incarnation), false)?;
        let w = p.worker.0;
        let Some(c) = st.chunks.get(&p.chunk) else {
            return Err(err(
                ErrorCode::NotInitialized,
                None,
                0,
                format!("{} was never initialized on this shard", p.chunk),
            ));
        };
        let sync = c.spec.consistency == Consistency::Sync;
        if sync && p.mode == PushMode::Assign {
            return Err(invalid("assign pushes need an async or SSP table"));
        }
        let dup = |st: &State| {
            let slot = &st.workers[w as usize];
            slot.seen(p.seq).then(|| {
                slot.last_joined
                    .get(&p.chunk)
                    .copied()
                    .unwrap_or(st.chunks[&p.chunk].round)
            })
        };
        if let Some(r) = dup(&st) {
            st.stats.duplicates += 1;
            return Ok((r, st));
        }
        let slot = &st.workers[w as usize];
        if p.seq >= slot.base.saturating_add(self.cfg.dedup_window) {
            return Err(err(
                ErrorCode::WindowExceeded,
                Some(w),
                slot.base,
                format!(
                    "seq {} is beyond the dedup window (base {})",
                    p.seq, slot.base
                ),
            ));
        }
        let delta = Self::decode_delta(c, &p, pre)?;
        if sync {
            // A worker already in the open round waits for the next one.
            st = self.wait(
                st,
                deadline,
                |this, st, now| {
                    if !st.chunks[&p.chunk].contributors.contains(&w) {
                        return Ok(true);
                    }
                    this.try_close(st, p.chunk, now)?;
                    Ok(!st.chunks[&p.chunk].contributors.contains(&w))
                },
                |st| self.missing_sync(st, p.chunk),
            )?;
            if let Some(r) = dup(&st) {
                st.stats.duplicates += 1;
                return Ok((r, st));
            }
            // The incarnation may have moved on while we waited.
            self.touch(&mut st, p.worker, Some(p.incarnation), false)?;
        }
        let p = Push {
            payload: p.payload,
            ..p
        };
        self.log_request(&mut st, &Request::Push(p.clone()))?;
        let round = Self::apply_push(&mut st, &p, delta);
        if sync {
            self.try_close(&mut st, p.chunk, Instant::now())?;
        }
        self.cv.notify_all();
        Ok((round, st))
    }
}
