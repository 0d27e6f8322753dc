//! Rabenseifner's all-reduce: recursive-halving reduce-scatter, then recursive-doubling
//! all-gather (`2 log2 P` steps, each rank sends `2 (p2-1)/p2` of the buffer). Any world
//! size, through the [`fold`](crate::fold).
//!
//! ```text
//! p2 = 4, chunks 0..4                      halving (mask 2, then 1)      doubling (mask 1, then 2)
//! vrank 0: keeps [0,2) sends [2,4) to 2 → keeps [0,1) sends [1,2) to 1 → has 0, swaps with 1 → 0..2, swaps with 2 → all
//! vrank 1: keeps [0,2) sends [2,4) to 3 → keeps [1,2) sends [0,1) to 0 → ...
//! ```

use std::ops::Range;

use gradwire_transport::Transport;

use crate::exchange::{
    folded, pair_segments, reduce_steps, seg_elems, send_recv_copy, split_pair, Step,
};
use crate::fold::Fold;
use crate::scratch::Scratch;
use crate::{chunks, element, ring, Element, ReduceOp, Result};

/// Rabenseifner all-reduce of `buf` in place.
pub fn all_reduce<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    seg_bytes: usize,
) -> Result<()> {
    let world = t.world_size();
    let seg = seg_elems::<E>(seg_bytes);
    let nseg = chunks::segments(buf.len(), seg);
    folded(t, buf, op, nseg, |t, fold, vrank, buf, scratch| {
        let mine = halving(t, fold, vrank, buf, op, seg, scratch)?;
        element::finish(op, &mut buf[mine], world);
        doubling(t, fold, vrank, buf, seg)
    })
}

/// Reduce-scatter: on power-of-two worlds by recursive halving, otherwise by the ring.
/// Returns this rank's chunk ([`chunks::range`]`(len, world, rank)`), fully reduced.
pub fn reduce_scatter<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    seg_bytes: usize,
) -> Result<Range<usize>> {
    let world = t.world_size();
    if !world.is_power_of_two() {
        return ring::reduce_scatter(t, buf, op, seg_bytes);
    }
    let fold = Fold::new(world);
    let mut scratch = Scratch::take();
    let mine = halving(
        t,
        &fold,
        t.rank(),
        buf,
        op,
        seg_elems::<E>(seg_bytes),
        &mut scratch,
    )?;
    element::finish(op, &mut buf[mine.clone()], world);
    Ok(mine)
}

/// All-gather in place: on power-of-two worlds by recursive doubling, otherwise by the ring.
pub fn all_gather<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    seg_bytes: usize,
) -> Result<()> {
    let world = t.world_size();
    if !world.is_power_of_two() {
        return ring::all_gather(t, buf, seg_bytes);
    }
    let fold = Fold::new(world);
    doubling(t, &fold, t.rank(), buf, seg_elems::<E>(seg_bytes))
}

/// Recursive halving among the `p2` virtual ranks; returns the range `vrank` owns.
fn halving<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    fold: &Fold,
    vrank: usize,
    buf: &mut [E],
    op: ReduceOp,
    seg: usize,
    scratch: &mut Scratch,
) -> Result<Range<usize>> {
    let (len, p2) = (buf.len(), fold.p2);
    let (mut lo, mut hi) = (0, p2);
    let mut mask = p2 / 2;
    while mask > 0 {
        let partner = fold.real(vrank ^ mask);
        let mid = lo + mask;
        let (keep, give) = if vrank & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let kr = chunks::span(len, p2, keep.0, keep.1);
        let gr = chunks::span(len, p2, give.0, give.1);
        let nseg = pair_segments(gr.len(), kr.len(), seg);
        reduce_steps(t, buf, op, nseg, scratch, |j| {
            let s = chunks::range(gr.len(), nseg, j);
            let r = chunks::range(kr.len(), nseg, j);
            Step {
                to: partner,
                from: partner,
                send: gr.start + s.start..gr.start + s.end,
                recv: kr.start + r.start..kr.start + r.end,
            }
        })?;
        (lo, hi) = keep;
        mask /= 2;
    }
    debug_assert_eq!((lo, hi), (vrank, vrank + 1));
    Ok(chunks::range(len, p2, vrank))
}

/// Recursive-doubling all-gather among the `p2` virtual ranks (vrank `v` holds chunk `v`).
fn doubling<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    fold: &Fold,
    vrank: usize,
    buf: &mut [E],
    seg: usize,
) -> Result<()> {
    let (len, p2) = (buf.len(), fold.p2);
    let mut mask = 1;
    while mask < p2 {
        let pv = vrank ^ mask;
        let partner = fold.real(pv);
        let (mlo, plo) = (vrank & !(mask - 1), pv & !(mask - 1));
        let mr = chunks::span(len, p2, mlo, mlo + mask);
        let pr = chunks::span(len, p2, plo, plo + mask);
        let nseg = pair_segments(mr.len(), pr.len(), seg);
        let (send, recv) = split_pair(buf, mr, pr);
        send_recv_copy(t, partner, send, partner, recv, nseg)?;
        mask *= 2;
    }
    Ok(())
}
