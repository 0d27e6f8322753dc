//! Ring reduce-scatter, all-gather and all-reduce (Baidu / Horovod ring, Patarasuk & Yuan).
//!
//! The buffer is cut into `P` chunks ([`chunks::range`]); rank `r` owns chunk `r`. Each step,
//! every rank sends one chunk to its right neighbour and receives one from its left (one
//! full-duplex [`Transport::send_recv`] per segment), so every link carries `1/P` of the
//! buffer per step and nothing ever waits in a cycle.
//!
//! ```text
//! reduce-scatter (P = 4; "a+b" = chunk reduced over those ranks; arrows: step 0 sends)
//!
//!            chunk0  chunk1  chunk2  chunk3
//! rank 0:      a0      a1      a2     [a3]──▶ rank 1     step s: rank r sends chunk r-s-1,
//! rank 1:     [b0]──▶  b1      b2      b3     rank 2       receives chunk r-s-2 and adds it
//! rank 2:      c0     [c1]──▶  c2      c3     rank 3
//! rank 3:      d0      d1     [d2]──▶  d3     rank 0
//!
//! after P-1 = 3 steps rank r holds chunk r reduced over all ranks:
//! rank 0: Σ0 · · ·      rank 1: · Σ1 · ·      rank 2: · · Σ2 ·      rank 3: · · · Σ3
//!
//! all-gather: step s: rank r sends chunk r-s, receives chunk r-s-1 (copied, no reduction);
//! after P-1 more steps every rank holds Σ0 Σ1 Σ2 Σ3.
//! ```
//!
//! Pipelining: each step's chunk travels in `nseg` segments (at least two once a chunk
//! reaches [`PIPELINE_MIN_CHUNK_BYTES`]), and the (step, segment) pairs run in order.
//! Segment `j` of step `s+1` only needs segment `j` of step `s` reduced, so on a transport
//! that splits a step ([`Transport::split_step`]: TCP, local) the reduce-scatter posts the
//! next segment before it reduces the current one (`exchange::reduce_steps`): the kernel
//! moves both directions while the adder works, and the wire never waits for it. The
//! all-gather has nothing to reduce and receives straight into the buffer, one
//! `send_recv_into` per segment. The scratch buffer is one segment.
//!
//! Measured (`examples/tcp_busbw.rs`, TCP loopback on a shared 2-core VM, load average 5-6,
//! best of 7, paths interleaved), bus GB/s lockstep → pipelined: P = 2: 4K 0.21 → 0.21,
//! 64K 1.97 → 1.94, 1M 1.49 → 1.50, 16M 0.63 → 0.62, 64M 0.45 → 0.45; P = 4: 4K 0.062 →
//! 0.056, 64K 0.61 → 0.56, 1M 0.83 → 0.76, 16M 0.35 → 0.34, 64M 0.21 → 0.22. Parity within
//! the noise: on loopback the kernel's copies run on the same two cores as the adders, so
//! there is no idle wire to fill; the gain needs a NIC (DMA) or spare cores. (A first
//! version that copied the unsent tail at `post` lost 15-25% at P = 2; completion now
//! resends from the caller's bytes.)

use std::ops::Range;

use gradwire_transport::Transport;

use crate::exchange::{reduce_steps, seg_elems, split_pair, Step};
use crate::scratch::Scratch;
use crate::{chunks, element, Element, ReduceOp, Result};

/// `(send chunk, receive chunk)` of rank `rank` at reduce-scatter step `step`
/// (`0..world-1`); after the last step rank `r` holds chunk `r` fully reduced.
pub fn reduce_scatter_step(rank: usize, world: usize, step: usize) -> (usize, usize) {
    debug_assert!(step + 1 < world.max(2));
    let send = (rank + 2 * world - step - 1) % world;
    let recv = (rank + 2 * world - step - 2) % world;
    (send, recv)
}

/// `(send chunk, receive chunk)` of rank `rank` at all-gather step `step` (`0..world-1`),
/// starting from rank `r` holding chunk `r`.
pub fn all_gather_step(rank: usize, world: usize, step: usize) -> (usize, usize) {
    debug_assert!(step + 1 < world.max(2));
    let send = (rank + world - step) % world;
    let recv = (rank + 2 * world - step - 1) % world;
    (send, recv)
}

/// The right neighbour (receiver of this rank's sends).
pub fn right(rank: usize, world: usize) -> usize {
    (rank + 1) % world
}

/// The left neighbour (sender of what this rank receives).
pub fn left(rank: usize, world: usize) -> usize {
    (rank + world - 1) % world
}

/// Segments per ring step for `len` elements on `world` ranks (the same on every rank).
fn ring_segments(len: usize, world: usize, seg: usize) -> usize {
    chunks::segments(len.div_ceil(world), seg)
}

/// Chunks of at least this many bytes travel in at least two segments in the ring's
/// reduce-scatter, so the pipeline always has a next segment to post while one is reduced.
pub const PIPELINE_MIN_CHUNK_BYTES: usize = 64 << 10;

/// Segments per reduce-scatter step: as [`ring_segments`], but at least two for chunks of
/// [`PIPELINE_MIN_CHUNK_BYTES`] or more.
fn reduce_scatter_segments<E: Element>(len: usize, world: usize, seg_bytes: usize) -> usize {
    let n = ring_segments(len, world, seg_elems::<E>(seg_bytes));
    let chunk_bytes = len.div_ceil(world) * std::mem::size_of::<E>();
    if n == 1 && chunk_bytes >= PIPELINE_MIN_CHUNK_BYTES {
        2
    } else {
        n
    }
}

/// Ring reduce-scatter of `buf` in place: returns the range of `buf` (chunk `rank`) that now
/// holds the reduction over all ranks (for `Mean`, already divided).
pub fn reduce_scatter<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    seg_bytes: usize,
) -> Result<Range<usize>> {
    let (rank, world) = (t.rank(), t.world_size());
    let mine = chunks::range(buf.len(), world, rank);
    reduce_scatter_raw(t, buf, op, seg_bytes)?;
    element::finish(op, &mut buf[mine.clone()], world);
    Ok(mine)
}

/// Reduce-scatter without the final divide of `Mean`.
pub(crate) fn reduce_scatter_raw<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    seg_bytes: usize,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if world == 1 {
        return Ok(());
    }
    let len = buf.len();
    let nseg = reduce_scatter_segments::<E>(len, world, seg_bytes);
    let (to, from) = (right(rank, world), left(rank, world));
    let mut scratch = Scratch::take();
    reduce_steps(t, buf, op, (world - 1) * nseg, &mut scratch, |i| {
        let (step, j) = (i / nseg, i % nseg);
        let (sc, rc) = reduce_scatter_step(rank, world, step);
        let (sr, rr) = (chunks::range(len, world, sc), chunks::range(len, world, rc));
        let s = chunks::range(sr.len(), nseg, j);
        let r = chunks::range(rr.len(), nseg, j);
        Step {
            to,
            from,
            send: sr.start + s.start..sr.start + s.end,
            recv: rr.start + r.start..rr.start + r.end,
        }
    })
}

/// Ring all-gather in place: rank `r` contributes chunk `r` of `buf`; afterwards every
/// rank's `buf` holds every chunk.
pub fn all_gather<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    seg_bytes: usize,
) -> Result<()> {
    let world = t.world_size();
    let len = buf.len();
    let seg = seg_elems::<E>(seg_bytes);
    all_gather_by(t, buf, 0, ring_segments(len, world, seg), |i| {
        chunks::range(len, world, i)
    })
}

/// Ring all-gather where rank `r` holds chunk `(r - shift) mod P`, chunks given by `chunk`.
pub(crate) fn all_gather_by<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    shift: usize,
    nseg: usize,
    chunk: impl Fn(usize) -> Range<usize>,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if world == 1 {
        return Ok(());
    }
    let (to, from) = (right(rank, world), left(rank, world));
    let vrank = (rank + world - shift % world) % world;
    for step in 0..world - 1 {
        let (sc, rc) = all_gather_step(vrank, world, step);
        let (sr, rr) = (chunk(sc), chunk(rc));
        for j in 0..nseg {
            let s = chunks::range(sr.len(), nseg, j);
            let r = chunks::range(rr.len(), nseg, j);
            let s = sr.start + s.start..sr.start + s.end;
            let r = rr.start + r.start..rr.start + r.end;
            let (send, recv) = split_pair(buf, s, r);
            t.send_recv_into(to, element::bytes(send), from, element::bytes_mut(recv))?;
        }
    }
    Ok(())
}

/// Ring all-reduce: reduce-scatter then all-gather (`2 (P-1)` steps).
pub fn all_reduce<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    seg_bytes: usize,
) -> Result<()> {
    let world = t.world_size();
    let mine = reduce_scatter(t, buf, op, seg_bytes)?;
    debug_assert_eq!(mine, chunks::range(buf.len(), world, t.rank()));
    all_gather(t, buf, seg_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates the schedule on chunk-ownership sets: after reduce-scatter rank r holds
    /// chunk r with every contribution; after all-gather everyone holds everything.
    #[test]
    fn schedule_reduces_every_contribution_once() {
        for world in 1..=9 {
            // have[r][c] = set of ranks whose contribution to chunk c rank r holds (bitmask)
            let mut have: Vec<Vec<u32>> = (0..world).map(|r| vec![1u32 << r; world]).collect();
            for step in 0..world.saturating_sub(1) {
                let before = have.clone();
                for r in 0..world {
                    let (_, rc) = reduce_scatter_step(r, world, step);
                    let l = left(r, world);
                    let (lsc, _) = reduce_scatter_step(l, world, step);
                    assert_eq!(lsc, rc, "left neighbour sends what I receive");
                    assert_eq!(before[r][rc] & before[l][rc], 0, "no double counting");
                    have[r][rc] |= before[l][rc];
                }
            }
            let all = (1u32 << world) - 1;
            for (r, h) in have.iter().enumerate() {
                assert_eq!(h[r], all, "world {world} rank {r}");
            }
            let mut full: Vec<Vec<bool>> = (0..world)
                .map(|r| (0..world).map(|c| c == r).collect())
                .collect();
            for step in 0..world.saturating_sub(1) {
                let before = full.clone();
                for r in 0..world {
                    let (sc, _) = all_gather_step(r, world, step);
                    assert!(before[r][sc], "sends only what it has");
                    let (_, rc) = all_gather_step(right(r, world), world, step);
                    assert_eq!(rc, sc);
                    full[right(r, world)][rc] = true;
                }
            }
            assert!(full.iter().all(|f| f.iter().all(|&b| b)));
        }
    }
}
