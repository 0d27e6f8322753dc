//! One operation on a table ([`KvStore`]'s push, pull and push-pull): a frame per chunk
//! (encoded by the chunk's codec), sent per shard in parallel, the replies merged into the
//! output and the table's rounds.

use std::time::Instant;

use super::conn::Conn;
use super::store::{Enc, KvStore, PullInfo};
use crate::spec::{ChunkId, Consistency, Key, PushMode};
use crate::wire::{encode_push, Encoding, ErrorCode, Payload, Push, Request, Response};
use crate::{Error, Result};

impl KvStore {
    pub(super) fn run(
        &mut self,
        key: Key,
        push: Option<(&[f32], PushMode)>,
        out: Option<&mut [f32]>,
        rows: Option<&[u32]>,
    ) -> Result<PullInfo> {
        let deadline = Instant::now() + self.cfg.deadline;
        let cfg = &self.cfg;
        let table = self.tables.get_mut(&key).ok_or(Error::UnknownKey(key.0))?;
        if let Some((g, _)) = push {
            if g.len() != table.len {
                return Err(Error::Length {
                    key: key.0,
                    expected: table.len,
                    got: g.len(),
                });
            }
        }
        let row_len = table.spec.row_len as usize;
        // Which rows of the request fall into which chunk (row-sparse pull).
        let mut chunk_rows: Vec<Vec<(usize, u32)>> = vec![Vec::new(); table.places.len()];
        if let Some(rows) = rows {
            let want = rows.len() * row_len;
            if out.as_ref().map(|o| o.len()) != Some(want) {
                return Err(Error::Length {
                    key: key.0,
                    expected: want,
                    got: out.as_ref().map_or(0, |o| o.len()),
                });
            }
            for (pos, &r) in rows.iter().enumerate() {
                let start = r as usize * row_len;
                let ci = table
                    .places
                    .iter()
                    .position(|p| start >= p.start && start < p.start + p.len)
                    .ok_or(Error::Remote {
                        shard: 0,
                        code: ErrorCode::InvalidArgument,
                        worker: None,
                        message: format!("row {r} out of range"),
                    })?;
                chunk_rows[ci].push((pos, ((start - table.places[ci].start) / row_len) as u32));
            }
        } else if let Some(o) = out.as_ref() {
            if o.len() != table.len {
                return Err(Error::Length {
                    key: key.0,
                    expected: table.len,
                    got: o.len(),
                });
            }
        }
        let pulling = out.is_some();
        // Build one frame per chunk that has work.
        let mut frames: Vec<Option<Vec<u8>>> = Vec::with_capacity(table.places.len());
        for (i, p) in table.places.iter().enumerate() {
            let chunk = ChunkId {
                key,
                index: p.index,
            };
            // Frame buffers are kept per chunk and reused across calls.
            let mut f = std::mem::take(&mut table.frames[i]);
            let frame = if let Some((g, mode)) = push {
                let g = &g[p.start..p.start + p.len];
                let payload = &mut self.scratch;
                let encoding = match (&mut table.encs[i], mode) {
                    (Enc::TwoBit(q), PushMode::Grad) => {
                        q.encode(g, payload);
                        Encoding::TwoBit
                    }
                    (Enc::Codec(c), PushMode::Grad) => {
                        c.encode(g, payload);
                        Encoding::Codec
                    }
                    _ => Encoding::Dense,
                };
                let conn = &mut self.conns[p.shard];
                let seq = conn.next_seq;
                conn.next_seq += 1;
                let push = Push {
                    worker: cfg.worker,
                    incarnation: cfg.incarnation,
                    seq,
                    chunk,
                    clock: table.pushes,
                    mode,
                    encoding,
                    payload: Vec::new(),
                };
                let body = match encoding {
                    Encoding::Dense => Payload::F32(g),
                    _ => Payload::Bytes(payload),
                };
                encode_push(&push, body, pulling, 0, &mut f);
                Some(f)
            } else if rows.is_some() && chunk_rows[i].is_empty() {
                table.frames[i] = f;
                None
            } else {
                Request::Pull {
                    worker: cfg.worker,
                    chunk,
                    clock: table.wait_round[i],
                    rows: rows.map(|_| chunk_rows[i].iter().map(|x| x.1).collect()),
                }
                .encode(0, &mut f);
                Some(f)
            };
            frames.push(frame);
        }
        // Send, per shard in parallel.
        let mut by_shard: Vec<Vec<(usize, Vec<u8>)>> =
            (0..self.conns.len()).map(|_| Vec::new()).collect();
        for (i, f) in frames.into_iter().enumerate() {
            if let Some(f) = f {
                by_shard[table.places[i].shard].push((i, f));
            }
        }
        let busy = by_shard.iter().filter(|v| !v.is_empty()).count();
        type Done = (usize, Result<Response>, Vec<u8>);
        let mut results: Vec<Done> = Vec::new();
        let work = |conn: &mut Conn, jobs: Vec<(usize, Vec<u8>)>| -> Vec<Done> {
            jobs.into_iter()
                .map(|(i, mut f)| {
                    let r = conn.call(&mut f, cfg, deadline);
                    (i, r, f)
                })
                .collect()
        };
        if busy <= 1 {
            for (conn, jobs) in self.conns.iter_mut().zip(by_shard) {
                if !jobs.is_empty() {
                    results.extend(work(conn, jobs));
                }
            }
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = self
                    .conns
                    .iter_mut()
                    .zip(by_shard)
                    .filter(|(_, j)| !j.is_empty())
                    .map(|(conn, jobs)| s.spawn(move || work(conn, jobs)))
                    .collect();
                for h in handles {
                    results.extend(h.join().expect("shard thread does not panic"));
                }
            });
        }
        let mut info = PullInfo {
            round: u64::MAX,
            min_clock: u64::MAX,
            clock: 0,
        };
        let mut out = out;
        let mut first_err = None;
        let sync = table.spec.consistency == Consistency::Sync;
        for (i, r, f) in results {
            table.frames[i] = f;
            match r {
                Err(e) => {
                    first_err.get_or_insert(e);
                }
                Ok(Response::Ok { value }) => {
                    if sync && push.is_some() {
                        table.wait_round[i] = value + 1;
                    }
                }
                Ok(Response::Values {
                    round,
                    min_clock,
                    values,
                }) => {
                    if sync {
                        table.wait_round[i] = table.wait_round[i].max(round);
                    }
                    info.round = info.round.min(round);
                    info.min_clock = info.min_clock.min(min_clock);
                    let p = table.places[i];
                    let o = out.as_deref_mut().expect("values only for pulls");
                    if rows.is_some() {
                        if values.len() != chunk_rows[i].len() * row_len {
                            first_err.get_or_insert(Error::Length {
                                key: key.0,
                                expected: chunk_rows[i].len() * row_len,
                                got: values.len(),
                            });
                            continue;
                        }
                        for (j, &(pos, _)) in chunk_rows[i].iter().enumerate() {
                            o[pos * row_len..(pos + 1) * row_len]
                                .copy_from_slice(&values[j * row_len..(j + 1) * row_len]);
                        }
                    } else if values.len() == p.len {
                        o[p.start..p.start + p.len].copy_from_slice(&values);
                    } else {
                        first_err.get_or_insert(Error::Length {
                            key: key.0,
                            expected: p.len,
                            got: values.len(),
                        });
                    }
                }
                Ok(_) => {}
            }
        }
        if push.is_some() {
            table.pushes += 1;
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if info.round == u64::MAX {
            info.round = 0;
            info.min_clock = 0;
        }
        info.clock = table.pushes;
        Ok(info)
    }
}
