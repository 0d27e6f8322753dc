//! The shard's durable state: WAL records, checkpoints (snapshot and restore) and replay.

use std::time::Instant;

use crate::durability::write_checkpoint;
use crate::spec::ChunkId;
use crate::wire::{Cursor, ErrorCode, FrameHeader, Request, WireError, HEADER_LEN};

use super::vecops::VecPlan;
use super::*;

impl Shard {
    pub(super) fn log_request(&self, st: &mut State, req: &Request) -> Result<(), Rejection> {
        if st.wal.is_none() {
            return Ok(());
        }
        let mut frame = std::mem::take(&mut st.frame);
        req.encode(0, &mut frame);
        let r = self.log(st, 1, &frame);
        st.frame = frame;
        r
    }

    pub(super) fn log(&self, st: &mut State, kind: u8, data: &[u8]) -> Result<(), Rejection> {
        let lsn = st.lsn + 1;
        if let Some(wal) = st.wal.as_mut() {
            let mut body = Vec::with_capacity(9 + data.len());
            body.extend_from_slice(&lsn.to_le_bytes());
            body.push(kind);
            body.extend_from_slice(data);
            wal.append(&body).map_err(|e| {
                err(
                    ErrorCode::Durability,
                    None,
                    lsn,
                    format!("WAL append failed: {e}"),
                )
            })?;
            st.stats.wal_records += 1;
        }
        st.lsn = lsn;
        Ok(())
    }

    /// Writes a checkpoint (parameters, optimizer state, rounds, clocks, dedup state,
    /// scratch vectors) and then, only once it is durable, empties the WAL. Returns the
    /// checkpoint's lsn.
    pub fn checkpoint(&self) -> Result<u64, Rejection> {
        if self.cfg.dir.is_none() {
            return Err(invalid("this shard has no checkpoint directory"));
        }
        let mut st = self.lock();
        self.checkpoint_in(&mut st)
    }

    fn checkpoint_in(&self, st: &mut State) -> Result<u64, Rejection> {
        let body = self.snapshot(st);
        write_checkpoint(&self.ckpt_path(), &body).map_err(|e| {
            err(
                ErrorCode::Durability,
                None,
                st.lsn,
                format!("checkpoint write failed: {e}"),
            )
        })?;
        if let Some(w) = st.wal.as_mut() {
            w.truncate().map_err(|e| {
                err(
                    ErrorCode::Durability,
                    None,
                    0,
                    format!("WAL truncate failed: {e}"),
                )
            })?;
        }
        Ok(st.lsn)
    }

    /// Rotates the WAL: a checkpoint once the log holds more than `wal_rotate_bytes`
    /// (called between requests, when every logged record has been applied).
    pub(super) fn maybe_rotate(&self) {
        if self.cfg.dir.is_none() {
            return;
        }
        let mut st = self.lock();
        if st
            .wal
            .as_ref()
            .is_none_or(|w| w.len() <= self.cfg.wal_rotate_bytes)
        {
            return;
        }
        match self.checkpoint_in(&mut st) {
            Ok(lsn) => tracing::debug!(lsn, "WAL rotated into a checkpoint"),
            Err(e) => tracing::warn!(error = %e.message, "WAL rotation: checkpoint failed"),
        }
    }

    pub(super) fn snapshot(&self, st: &State) -> Vec<u8> {
        let mut b = Vec::new();
        let put_f32s = |b: &mut Vec<u8>, v: &[f32]| {
            b.extend_from_slice(&(v.len() as u32).to_le_bytes());
            crate::wire::put_raw_f32s(b, v);
        };
        b.extend_from_slice(&st.lsn.to_le_bytes());
        b.extend_from_slice(&(st.workers.len() as u32).to_le_bytes());
        for s in &st.workers {
            b.extend_from_slice(&s.incarnation.to_le_bytes());
            b.extend_from_slice(&s.base.to_le_bytes());
            b.push(s.left as u8);
            b.extend_from_slice(&(s.above.len() as u32).to_le_bytes());
            for q in &s.above {
                b.extend_from_slice(&q.to_le_bytes());
            }
            let mut lj: Vec<_> = s.last_joined.iter().collect();
            lj.sort();
            b.extend_from_slice(&(lj.len() as u32).to_le_bytes());
            for (c, r) in lj {
                b.extend_from_slice(&c.key.0.to_le_bytes());
                b.extend_from_slice(&c.index.to_le_bytes());
                b.extend_from_slice(&r.to_le_bytes());
            }
        }
        b.extend_from_slice(&(st.chunks.len() as u32).to_le_bytes());
        let mut frame = Vec::new();
        for (id, c) in &st.chunks {
            Request::Init {
                chunk: *id,
                spec: c.spec.clone(),
                values: c.values.clone(),
            }
            .encode(0, &mut frame);
            b.extend_from_slice(&(frame.len() as u32).to_le_bytes());
            b.extend_from_slice(&frame);
            b.extend_from_slice(&c.opt.step.to_le_bytes());
            put_f32s(&mut b, &c.opt.a);
            put_f32s(&mut b, &c.opt.b);
            b.extend_from_slice(&c.round.to_le_bytes());
            b.extend_from_slice(&c.n_grad.to_le_bytes());
            put_f32s(&mut b, &c.pend_grad);
            put_f32s(&mut b, &c.pend_add);
            b.extend_from_slice(&(c.contributors.len() as u32).to_le_bytes());
            for w in &c.contributors {
                b.extend_from_slice(&w.to_le_bytes());
            }
            b.extend_from_slice(&(c.clocks.len() as u32).to_le_bytes());
            for k in &c.clocks {
                b.extend_from_slice(&k.to_le_bytes());
            }
        }
        let mut slots: Vec<_> = st.vecs.iter().collect();
        slots.sort_by_key(|(slot, _)| **slot);
        b.extend_from_slice(&(slots.len() as u32).to_le_bytes());
        for (slot, m) in slots {
            b.extend_from_slice(&slot.to_le_bytes());
            b.extend_from_slice(&(m.len() as u32).to_le_bytes());
            for (id, v) in m {
                b.extend_from_slice(&id.key.0.to_le_bytes());
                b.extend_from_slice(&id.index.to_le_bytes());
                put_f32s(&mut b, v);
            }
        }
        b
    }

    /// Rebuilds the state from a checkpoint body of format `version` (1: no scratch
    /// vectors).
    pub(super) fn restore(
        &self,
        st: &mut State,
        body: &[u8],
        version: u8,
        now: Instant,
    ) -> Result<(), WireError> {
        let nw = self.cfg.num_workers as usize;
        let mut c = Cursor::new(body);
        st.lsn = c.u64()?;
        let workers = c.u32()? as usize;
        if workers != nw {
            return Err(WireError::BadField {
                field: "checkpoint worker count",
            });
        }
        for slot in st.workers.iter_mut() {
            *slot = WorkerSlot::new(now);
            slot.incarnation = c.u64()?;
            slot.base = c.u64()?;
            slot.left = c.u8()? != 0;
            let n = c.u32()? as usize;
            for _ in 0..n {
                slot.above.insert(c.u64()?);
            }
            let n = c.u32()? as usize;
            for _ in 0..n {
                let id = ChunkId {
                    key: crate::spec::Key(c.u64()?),
                    index: c.u32()?,
                };
                let r = c.u64()?;
                slot.last_joined.insert(id, r);
            }
        }
        let n = c.u32()? as usize;
        for _ in 0..n {
            let len = c.u32()? as usize;
            let frame = c.bytes(len, "init frame")?;
            let h = FrameHeader::decode(frame, usize::MAX)?;
            let Request::Init {
                chunk,
                spec,
                values,
            } = Request::decode(&h, &frame[HEADER_LEN.min(frame.len())..])?
            else {
                return Err(WireError::BadField {
                    field: "checkpoint chunk",
                });
            };
            let mut ch = self.new_chunk(spec, values);
            ch.opt.step = c.u64()?;
            ch.opt.a = c.f32s("opt a")?;
            ch.opt.b = c.f32s("opt b")?;
            ch.round = c.u64()?;
            ch.n_grad = c.u32()?;
            ch.pend_grad = c.f32s("pend_grad")?;
            ch.pend_add = c.f32s("pend_add")?;
            let n = ch.values.len();
            for v in [&ch.opt.a, &ch.opt.b, &ch.pend_grad, &ch.pend_add] {
                if !v.is_empty() && v.len() != n {
                    return Err(WireError::BadLength {
                        field: "checkpoint state vector",
                    });
                }
            }
            let k = c.u32()? as usize;
            for _ in 0..k {
                let w = c.u32()?;
                if w as usize >= nw {
                    return Err(WireError::BadField {
                        field: "contributor",
                    });
                }
                ch.contributors.insert(w);
            }
            let k = c.u32()? as usize;
            if k != nw {
                return Err(WireError::BadLength { field: "clocks" });
            }
            for clk in ch.clocks.iter_mut() {
                *clk = c.u64()?;
            }
            st.chunks.insert(chunk, ch);
        }
        if version >= 2 {
            let slots = c.u32()?;
            for _ in 0..slots {
                let slot = c.u64()?;
                let n = c.u32()?;
                for _ in 0..n {
                    let id = ChunkId {
                        key: crate::spec::Key(c.u64()?),
                        index: c.u32()?,
                    };
                    let v = c.f32s("scratch vector")?;
                    st.vecs.entry(slot).or_default().insert(id, v);
                }
            }
        }
        c.finish()
    }

    /// Re-applies one WAL record (skipping those the checkpoint already holds).
    pub(super) fn replay(&self, st: &mut State, record: &[u8], _now: Instant) {
        let r = (|| -> Result<(), WireError> {
            let mut c = Cursor::new(record);
            let lsn = c.u64()?;
            let kind = c.u8()?;
            if lsn <= st.lsn {
                return Ok(());
            }
            st.lsn = lsn;
            st.stats.replayed += 1;
            let rest = c.bytes(record.len() - 9, "record")?;
            match kind {
                1 => {
                    let h = FrameHeader::decode(rest, usize::MAX)?;
                    let req = Request::decode(&h, rest.get(HEADER_LEN..).unwrap_or(&[]))?;
                    match req {
                        Request::Hello {
                            worker,
                            incarnation,
                        } if worker.0 < self.cfg.num_workers => {
                            Self::apply_hello(st, worker.0, incarnation)
                        }
                        Request::Leave { worker, .. } if worker.0 < self.cfg.num_workers => {
                            st.workers[worker.0 as usize].left = true
                        }
                        Request::Init {
                            chunk,
                            spec,
                            values,
                        } => {
                            let ch = self.new_chunk(spec, values);
                            st.chunks.entry(chunk).or_insert(ch);
                        }
                        Request::Push(p) if p.worker.0 < self.cfg.num_workers => {
                            if let Some(c) = st.chunks.get(&p.chunk) {
                                if let Ok(delta) = Self::decode_delta(c, &p, None) {
                                    Self::apply_push(st, &p, delta);
                                }
                            }
                        }
                        Request::VecOp(op) => {
                            if let Ok(VecPlan::Write(c, outs)) = self.plan_vec_op(st, op, false) {
                                Self::apply_vec_op(st, c, outs);
                            }
                        }
                        Request::SetVec {
                            slot,
                            chunk,
                            values,
                        } => {
                            if self.check_set_vec(st, slot, chunk, &values, false).is_ok() {
                                st.vecs.entry(slot).or_default().insert(chunk, values);
                            }
                        }
                        _ => {
                            return Err(WireError::BadField {
                                field: "WAL request",
                            })
                        }
                    }
                }
                2 => {
                    let mut c = Cursor::new(rest);
                    let id = ChunkId {
                        key: crate::spec::Key(c.u64()?),
                        index: c.u32()?,
                    };
                    c.finish()?;
                    Self::close(st, id);
                }
                _ => return Err(WireError::BadField { field: "WAL kind" }),
            }
            Ok(())
        })();
        if let Err(e) = r {
            tracing::warn!(error = %e, "skipping a bad WAL record");
        }
    }
}

/// Decodes a checkpoint body into a throw-away shard state (for the fuzz target): never
/// panics, whatever the bytes.
#[cfg(any(test, fuzzing))]
pub fn check_checkpoint_body(num_workers: u32, body: &[u8]) -> Result<(), WireError> {
    let shard = Shard::open(ShardConfig {
        num_workers,
        ..ShardConfig::default()
    })
    .map_err(|_| WireError::BadField { field: "config" })?;
    let now = Instant::now();
    let mut st = shard.lock();
    let mut fresh = State {
        chunks: std::collections::BTreeMap::new(),
        workers: (0..num_workers).map(|_| WorkerSlot::new(now)).collect(),
        vecs: std::collections::HashMap::new(),
        lsn: 0,
        wal: None,
        stats: ShardStats::default(),
        frame: Vec::new(),
    };
    let r = shard.restore(&mut fresh, body, crate::durability::CKPT_VERSION, now);
    *st = fresh;
    r
}

/// Replays WAL bytes into a throw-away shard state (for the fuzz target).
#[cfg(any(test, fuzzing))]
pub fn check_wal_bytes(num_workers: u32, bytes: &[u8]) {
    let Ok(shard) = Shard::open(ShardConfig {
        num_workers,
        ..ShardConfig::default()
    }) else {
        return;
    };
    let (records, _) = crate::durability::decode_wal(bytes, 1 << 20);
    let now = Instant::now();
    let mut st = shard.lock();
    for r in records {
        shard.replay(&mut st, r, now);
    }
}
