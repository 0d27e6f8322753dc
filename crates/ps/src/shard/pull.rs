//! Pulls: waiting as the chunk's consistency says, then the whole chunk or some rows.

use std::time::Instant;

use crate::spec::{ChunkId, Consistency, WorkerId};
use crate::wire::{ErrorCode, Response};

use super::*;

impl Shard {
    pub(super) fn pull(
        &self,
        worker: WorkerId,
        id: ChunkId,
        clock: u64,
        rows: Option<Vec<u32>>,
        deadline: Instant,
        frame: Option<(u64, &mut Vec<u8>)>,
    ) -> Result<Out, Rejection> {
        let mut st = self.lock();
        self.touch(&mut st, worker, None, false)?;
        let w = worker.0;
        let Some(c) = st.chunks.get(&id) else {
            return Err(err(
                ErrorCode::NotInitialized,
                None,
                0,
                format!("{id} was never initialized on this shard"),
            ));
        };
        // The reply's size is known before anything is built or waited for.
        let n = match &rows {
            None => c.values.len(),
            Some(r) => r.len().saturating_mul(c.spec.row_len as usize),
        };
        self.check_reply(id, n)?;
        let mut min_clock = 0;
        match c.spec.consistency {
            Consistency::Sync => {
                st = self.wait(
                    st,
                    deadline,
                    |this, st, now| {
                        if st.chunks[&id].round >= clock {
                            return Ok(true);
                        }
                        this.try_close(st, id, now)?;
                        Ok(st.chunks[&id].round >= clock)
                    },
                    |st| self.missing_sync(st, id),
                )?;
            }
            Consistency::Async => {
                min_clock = c.clocks.iter().copied().min().unwrap_or(0);
            }
            Consistency::Ssp { staleness } => {
                let s = staleness as u64;
                let mut seen_min = 0;
                st = self.wait(st, deadline, |this, st, now| {
                    let (ok, m) = this.ssp_ready(st, id, w, s, now)?;
                    seen_min = m;
                    Ok(ok)
                }, |st| {
                    let c = &st.chunks[&id];
                    let mine = c.clocks[w as usize];
                    let behind: Vec<u32> = (0..self.cfg.num_workers)
                        .filter(|v| c.clocks[*v as usize] + s < mine && !st.workers[*v as usize].left)
                        .collect();
                    (behind.first().copied(), format!("worker {w} at clock {mine} waits for workers {behind:?} (staleness {s})"))
                })?;
                min_clock = seen_min;
            }
        }
        let c = &st.chunks[&id];
        if let (None, Some((rid, out))) = (&rows, frame) {
            crate::wire::encode_values(c.round, min_clock, &c.values, rid, out);
            return Ok(Out::Encoded);
        }
        let values = match rows {
            None => c.values.clone(),
            Some(rows) => {
                let rl = c.spec.row_len as usize;
                let nrows = c.values.len() / rl;
                let mut out = Vec::with_capacity(rows.len().min(nrows) * rl);
                for r in rows {
                    let r = r as usize;
                    if r >= nrows {
                        return Err(invalid(format!(
                            "{id}: row {r} out of range ({nrows} rows)"
                        )));
                    }
                    out.extend_from_slice(&c.values[r * rl..(r + 1) * rl]);
                }
                out
            }
        };
        Ok(Out::Resp(Response::Values {
            round: c.round,
            min_clock,
            values,
        }))
    }
}
