//! One operation on a table ([`KvStore`]'s push, pull and push-pull): a frame per chunk
//! (encoded by the chunk's codec), sent per shard in parallel, the replies merged into the
//! output and the table's rounds. [`KvStore::run`] runs the four phases in order: the
//! buffers checked and a row-sparse pull's rows routed to their chunks ([`route`]), the
//! frames built ([`build_frames`]), the frames sent and answered ([`exchange`]), the
//! replies merged ([`merge_replies`]).

use std::time::Instant;

use super::conn::Conn;
use super::store::{Enc, KvStore, PullInfo, Table};
use super::ClientConfig;
use crate::spec::{ChunkId, Consistency, Key, PushMode};
use crate::wire::{encode_push, Encoding, ErrorCode, Payload, Push, Request, Response};
use crate::{Error, Result};

/// Per chunk, the rows a row-sparse pull asks of it: (position in the request, row within
/// the chunk). Empty lists for a whole pull or a push.
type ChunkRows = Vec<Vec<(usize, u32)>>;

/// A chunk's frame sent and answered: the chunk's index in the table, the reply, and the
/// frame buffer (kept for reuse).
type Done = (usize, Result<Response>, Vec<u8>);

impl KvStore {
    /// Pushes `push` (the whole table's gradient or values), pulls into `out` (the whole
    /// table, or the rows `rows` of it), or both, in one frame per chunk.
    pub(super) fn run(
        &mut self,
        key: Key,
        push: Option<(&[f32], PushMode)>,
        out: Option<&mut [f32]>,
        rows: Option<&[u32]>,
    ) -> Result<PullInfo> {
        let deadline = Instant::now() + self.cfg.deadline;
        let table = self.tables.get_mut(&key).ok_or(Error::UnknownKey(key.0))?;
        let chunk_rows = route(table, key, push, out.as_deref().map(<[f32]>::len), rows)?;
        let frames = build_frames(
            table,
            key,
            push,
            rows,
            &chunk_rows,
            out.is_some(),
            &self.cfg,
            &mut self.conns,
            &mut self.scratch,
        );
        let results = exchange(&mut self.conns, table, frames, &self.cfg, deadline);
        merge_replies(table, key, results, push.is_some(), rows, &chunk_rows, out)
    }
}

/// Checks the buffers' lengths against the table and, for a row-sparse pull, routes each
/// asked row to the chunk holding it.
fn route(
    table: &Table,
    key: Key,
    push: Option<(&[f32], PushMode)>,
    out_len: Option<usize>,
    rows: Option<&[u32]>,
) -> Result<ChunkRows> {
    let length = |expected: usize, got: usize| {
        if got == expected {
            Ok(())
        } else {
            Err(Error::Length {
                key: key.0,
                expected,
                got,
            })
        }
    };
    if let Some((g, _)) = push {
        length(table.len, g.len())?;
    }
    let row_len = table.spec.row_len as usize;
    let mut chunk_rows: ChunkRows = vec![Vec::new(); table.places.len()];
    match (rows, out_len) {
        (Some(rows), out_len) => {
            length(rows.len() * row_len, out_len.unwrap_or(0))?;
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
        }
        (None, Some(n)) => length(table.len, n)?,
        (None, None) => {}
    }
    Ok(chunk_rows)
}

/// One frame per chunk that has work (`None` for a chunk a row-sparse pull does not touch):
/// a push (encoded by the chunk's codec, asking for the values back when `pulling`) or a
/// pull. The frame buffers are the table's, reused across calls.
#[allow(clippy::too_many_arguments)]
fn build_frames(
    table: &mut Table,
    key: Key,
    push: Option<(&[f32], PushMode)>,
    rows: Option<&[u32]>,
    chunk_rows: &ChunkRows,
    pulling: bool,
    cfg: &ClientConfig,
    conns: &mut [Conn],
    payload: &mut Vec<u8>,
) -> Vec<Option<Vec<u8>>> {
    let mut frames = Vec::with_capacity(table.places.len());
    for (i, p) in table.places.iter().enumerate() {
        let chunk = ChunkId {
            key,
            index: p.index,
        };
        let mut f = std::mem::take(&mut table.frames[i]);
        let frame = if let Some((g, mode)) = push {
            let g = &g[p.start..p.start + p.len];
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
            let conn = &mut conns[p.shard];
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
    frames
}

/// Sends each shard its frames and collects the replies: in this thread when one shard has
/// work, else a thread per busy shard.
fn exchange(
    conns: &mut [Conn],
    table: &Table,
    frames: Vec<Option<Vec<u8>>>,
    cfg: &ClientConfig,
    deadline: Instant,
) -> Vec<Done> {
    let mut by_shard: Vec<Vec<(usize, Vec<u8>)>> = (0..conns.len()).map(|_| Vec::new()).collect();
    for (i, f) in frames.into_iter().enumerate() {
        if let Some(f) = f {
            by_shard[table.places[i].shard].push((i, f));
        }
    }
    let busy = by_shard.iter().filter(|v| !v.is_empty()).count();
    let work = |conn: &mut Conn, jobs: Vec<(usize, Vec<u8>)>| -> Vec<Done> {
        jobs.into_iter()
            .map(|(i, mut f)| {
                let r = conn.call(&mut f, cfg, deadline);
                (i, r, f)
            })
            .collect()
    };
    let mut results = Vec::new();
    if busy <= 1 {
        for (conn, jobs) in conns.iter_mut().zip(by_shard) {
            if !jobs.is_empty() {
                results.extend(work(conn, jobs));
            }
        }
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = conns
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
    results
}

/// Merges the replies: values into `out` (whole chunks, or a row-sparse pull's rows in
/// request order), the sync rounds to wait for next, the lowest round and clock seen. The
/// first failure is returned after every reply is taken (the frame buffers go back to the
/// table either way); a reply that does not fit the request is an error, never a panic.
fn merge_replies(
    table: &mut Table,
    key: Key,
    results: Vec<Done>,
    pushed: bool,
    rows: Option<&[u32]>,
    chunk_rows: &ChunkRows,
    mut out: Option<&mut [f32]>,
) -> Result<PullInfo> {
    let row_len = table.spec.row_len as usize;
    let mut info = PullInfo {
        round: u64::MAX,
        min_clock: u64::MAX,
        clock: 0,
    };
    let mut first_err = None;
    let sync = table.spec.consistency == Consistency::Sync;
    for (i, r, f) in results {
        table.frames[i] = f;
        match r {
            Err(e) => {
                first_err.get_or_insert(e);
            }
            Ok(Response::Ok { value }) => {
                if sync && pushed {
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
                let Some(o) = out.as_deref_mut() else {
                    first_err.get_or_insert(Error::BadReply {
                        shard: p.shard,
                        what: "values in reply to a push that asked for none",
                    });
                    continue;
                };
                let expected = if rows.is_some() {
                    chunk_rows[i].len() * row_len
                } else {
                    p.len
                };
                if values.len() != expected {
                    first_err.get_or_insert(Error::Length {
                        key: key.0,
                        expected,
                        got: values.len(),
                    });
                    continue;
                }
                if rows.is_some() {
                    for (j, &(pos, _)) in chunk_rows[i].iter().enumerate() {
                        o[pos * row_len..(pos + 1) * row_len]
                            .copy_from_slice(&values[j * row_len..(j + 1) * row_len]);
                    }
                } else {
                    o[p.start..p.start + p.len].copy_from_slice(&values);
                }
            }
            Ok(_) => {}
        }
    }
    if pushed {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::ChunkPlace;
    use crate::spec::TableSpec;

    /// A table of 4 flat elements in two chunks of 2, on shards 0 and 1.
    fn table() -> Table {
        let place = |index: u32, start| ChunkPlace {
            index,
            start,
            len: 2,
            shard: index as usize,
        };
        Table {
            spec: TableSpec::default(),
            len: 4,
            places: vec![place(0, 0), place(1, 2)],
            encs: vec![Enc::Dense, Enc::Dense],
            frames: vec![Vec::new(), Vec::new()],
            wait_round: vec![0, 0],
            pushes: 0,
        }
    }

    fn values(round: u64, values: Vec<f32>) -> Result<Response> {
        Ok(Response::Values {
            round,
            min_clock: 0,
            values,
        })
    }

    #[test]
    fn replies_fill_the_output_and_the_rounds() {
        let mut t = table();
        let mut out = [0.0f32; 4];
        let results = vec![
            (1, values(3, vec![3.0, 4.0]), Vec::new()),
            (0, values(5, vec![1.0, 2.0]), Vec::new()),
        ];
        let info = merge_replies(
            &mut t,
            Key(7),
            results,
            false,
            None,
            &vec![vec![]; 2],
            Some(&mut out),
        )
        .expect("replies fit");
        assert_eq!(out, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(info.round, 3);
        assert_eq!(t.wait_round, vec![5, 3]);
    }

    #[test]
    fn values_for_a_push_without_output_are_an_error_naming_the_shard() {
        let mut t = table();
        let results = vec![(1, values(1, vec![1.0, 2.0]), Vec::new())];
        let e = merge_replies(&mut t, Key(7), results, true, None, &vec![vec![]; 2], None)
            .expect_err("no output to fill");
        assert!(matches!(e, Error::BadReply { shard: 1, .. }), "{e}");
        // The push still counts, as it reached the shards.
        assert_eq!(t.pushes, 1);
    }

    #[test]
    fn a_reply_of_the_wrong_length_is_an_error() {
        let mut t = table();
        let mut out = [0.0f32; 4];
        let results = vec![(0, values(1, vec![1.0; 3]), Vec::new())];
        let e = merge_replies(
            &mut t,
            Key(7),
            results,
            false,
            None,
            &vec![vec![]; 2],
            Some(&mut out),
        )
        .expect_err("3 values for a chunk of 2");
        assert!(
            matches!(
                e,
                Error::Length {
                    key: 7,
                    expected: 2,
                    got: 3
                }
            ),
            "{e}"
        );
        assert_eq!(out, [0.0; 4]);
    }
}
