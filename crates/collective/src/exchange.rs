//! The segmented point-to-point steps every algorithm is built from.
//!
//! A message of many elements travels as `nseg` segments. Both sides must compute the same
//! `nseg` (callers derive it from numbers both sides know), and split their slices with
//! [`chunks::range`], so segment `j` of the sender matches segment `j` of the receiver.

use std::ops::Range;

use gradwire_transport::Transport;

use crate::element::{bytes, bytes_mut};
use crate::fold::{Fold, Role};
use crate::scratch::Scratch;
use crate::{chunks, Element, ReduceOp, Result};

/// Segment size in elements of `E` for a segment size in bytes.
pub(crate) fn seg_elems<E: Element>(seg_bytes: usize) -> usize {
    (seg_bytes / std::mem::size_of::<E>()).max(1)
}

/// Segment count both partners of a pairwise exchange agree on.
pub(crate) fn pair_segments(send_len: usize, recv_len: usize, seg: usize) -> usize {
    chunks::segments(send_len.max(recv_len), seg)
}

/// One step of a reducing schedule over one buffer: send `buf[send]` to `to` while
/// receiving `recv.len()` elements from `from`, then reduce them into `buf[recv]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Step {
    pub to: usize,
    pub from: usize,
    pub send: Range<usize>,
    pub recv: Range<usize>,
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Runs the `n` steps `step(0..n)` in order.
///
/// Pipelined when the transport splits a step ([`Transport::split_step`]): step `i + 1` is
/// posted (its segment handed to the kernel, the peer's next segment free to arrive) before
/// step `i` is reduced, so the wire never waits for the adder. A step that sends what the
/// previous one reduces (a one-segment ring, a new round of a doubling schedule) is posted
/// after that reduction instead. Either way `buf[send]` of a posted step is unchanged until
/// `complete_into` gets it again (the TCP transport sends the rest from it, without a
/// copy). Without a split step, each step is one `send_recv_into`.
pub(crate) fn reduce_steps<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    n: usize,
    scratch: &mut Scratch,
    step: impl Fn(usize) -> Step,
) -> Result<()> {
    let Some(ss) = t.split_step() else {
        for i in 0..n {
            let st = step(i);
            let tmp = scratch.elems::<E>(st.recv.len());
            t.send_recv_into(st.to, bytes(&buf[st.send]), st.from, bytes_mut(tmp))?;
            E::reduce(op, &mut buf[st.recv], tmp);
        }
        return Ok(());
    };
    if n == 0 {
        return Ok(());
    }
    let mut cur = step(0);
    ss.post(cur.to, bytes(&buf[cur.send.clone()]), cur.from)?;
    for i in 0..n {
        let tmp = scratch.elems::<E>(cur.recv.len());
        ss.complete_into(bytes(&buf[cur.send.clone()]), bytes_mut(tmp))?;
        let next = (i + 1 < n).then(|| step(i + 1));
        let early = next
            .as_ref()
            .is_some_and(|nx| !overlaps(&nx.send, &cur.recv));
        if let (true, Some(nx)) = (early, &next) {
            ss.post(nx.to, bytes(&buf[nx.send.clone()]), nx.from)?;
        }
        E::reduce(op, &mut buf[cur.recv.clone()], tmp);
        if let Some(nx) = next {
            if !early {
                ss.post(nx.to, bytes(&buf[nx.send.clone()]), nx.from)?;
            }
            cur = nx;
        }
    }
    Ok(())
}

/// Sends `send` to `to` while receiving `recv.len()` elements from `from` straight into
/// `recv`, in `nseg` segments.
pub(crate) fn send_recv_copy<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    to: usize,
    send: &[E],
    from: usize,
    recv: &mut [E],
    nseg: usize,
) -> Result<()> {
    for j in 0..nseg {
        let s = chunks::range(send.len(), nseg, j);
        let r = chunks::range(recv.len(), nseg, j);
        t.send_recv_into(to, bytes(&send[s]), from, bytes_mut(&mut recv[r]))?;
    }
    Ok(())
}

/// Sends `buf` to `to` in `nseg` segments.
pub(crate) fn send_segs<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    to: usize,
    buf: &[E],
    nseg: usize,
) -> Result<()> {
    for j in 0..nseg {
        t.send(to, bytes(&buf[chunks::range(buf.len(), nseg, j)]))?;
    }
    Ok(())
}

/// Receives `buf.len()` elements from `from` into `buf`, in `nseg` segments.
pub(crate) fn recv_segs<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    from: usize,
    buf: &mut [E],
    nseg: usize,
) -> Result<()> {
    let len = buf.len();
    for j in 0..nseg {
        t.recv_into(from, bytes_mut(&mut buf[chunks::range(len, nseg, j)]))?;
    }
    Ok(())
}

/// Receives `acc.len()` elements from `from` and reduces them into `acc`, in `nseg` segments.
pub(crate) fn recv_reduce<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    from: usize,
    acc: &mut [E],
    op: ReduceOp,
    nseg: usize,
    scratch: &mut Scratch,
) -> Result<()> {
    let len = acc.len();
    for j in 0..nseg {
        let r = chunks::range(len, nseg, j);
        let tmp = scratch.elems::<E>(r.len());
        t.recv_into(from, bytes_mut(tmp))?;
        E::reduce(op, &mut acc[r], tmp);
    }
    Ok(())
}

/// Runs a power-of-two all-reduce `core` on a world of any size through the [`fold`]
/// (`crate::fold`): an extra sends its buffer to its proxy and receives the result from it;
/// a proxy first reduces its extra's buffer into its own and sends it the result after; every
/// rank that takes part runs `core` with the fold and its virtual rank. The hand-overs travel
/// in `nseg` segments.
///
/// [`fold`]: crate::fold
pub(crate) fn folded<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    nseg: usize,
    core: impl FnOnce(&mut T, &Fold, usize, &mut [E], &mut Scratch) -> Result<()>,
) -> Result<()> {
    let fold = Fold::new(t.world_size());
    let mut scratch = Scratch::take();
    match fold.role(t.rank()) {
        Role::Extra { proxy } => {
            send_segs(t, proxy, buf, nseg)?;
            recv_segs(t, proxy, buf, nseg)
        }
        Role::Proxy { extra, vrank } => {
            recv_reduce(t, extra, buf, op, nseg, &mut scratch)?;
            core(t, &fold, vrank, buf, &mut scratch)?;
            send_segs(t, extra, buf, nseg)
        }
        Role::Member { vrank } => core(t, &fold, vrank, buf, &mut scratch),
    }
}

/// Two disjoint sub-slices of `buf`: `(&buf[a], &mut buf[b])`.
pub(crate) fn split_pair<E>(
    buf: &mut [E],
    a: std::ops::Range<usize>,
    b: std::ops::Range<usize>,
) -> (&[E], &mut [E]) {
    if a.is_empty() {
        return (&[], &mut buf[b]);
    }
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.end - b.start])
    } else {
        debug_assert!(b.end <= a.start, "overlapping ranges {a:?} {b:?}");
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.end - a.start], &mut lo[b])
    }
}
