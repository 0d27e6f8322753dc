//! The segmented point-to-point steps every algorithm is built from.
//!
//! A message of many elements travels as `nseg` segments. Both sides must compute the same
//! `nseg` (callers derive it from numbers both sides know), and split their slices with
//! [`chunks::range`], so segment `j` of the sender matches segment `j` of the receiver.

use gradwire_transport::Transport;

use crate::element::{bytes, bytes_mut};
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

/// Sends `send` to `peer` while receiving `acc.len()` elements from it and reducing them
/// into `acc` with `op`, in `nseg` segments (full duplex each).
pub(crate) fn send_recv_reduce<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    peer: usize,
    send: &[E],
    acc: &mut [E],
    op: ReduceOp,
    nseg: usize,
    scratch: &mut Scratch,
) -> Result<()> {
    for j in 0..nseg {
        let s = chunks::range(send.len(), nseg, j);
        let r = chunks::range(acc.len(), nseg, j);
        let tmp = scratch.elems::<E>(r.len());
        t.send_recv_into(peer, bytes(&send[s]), peer, bytes_mut(tmp))?;
        E::reduce(op, &mut acc[r], tmp);
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
