//! All-gather of variable-size byte payloads (compressed gradients), of equal-size element
//! slices into a separate output, and the barrier.

use gradwire_transport::Transport;

use crate::exchange::seg_elems;
use crate::ring::{all_gather_step, left, right};
use crate::{chunks, ring, Element, Error, Result};

/// Ring all-gather of byte payloads whose sizes differ per rank: afterwards `out[r]` holds
/// rank `r`'s `mine` (`out` is resized to `world`; its buffers' capacity is reused).
pub fn all_gather_bytes<T: Transport + ?Sized>(
    t: &mut T,
    mine: &[u8],
    out: &mut Vec<Vec<u8>>,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    out.resize_with(world, Vec::new);
    out[rank].clear();
    out[rank].extend_from_slice(mine);
    let (to, from) = (right(rank, world), left(rank, world));
    for step in 0..world.saturating_sub(1) {
        let (sc, rc) = all_gather_step(rank, world, step);
        let mut incoming = std::mem::take(&mut out[rc]);
        let res = t.send_recv(to, &out[sc], from, &mut incoming);
        out[rc] = incoming;
        res?;
    }
    Ok(())
}

/// All-gather of equal-size contributions: `out` (of length `world * mine.len()`) receives
/// rank `r`'s `mine` at `r * mine.len()..`.
pub fn all_gather_into<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    mine: &[E],
    out: &mut [E],
    seg_bytes: usize,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    let m = mine.len();
    if out.len() != m * world {
        return Err(Error::BadOutputLength {
            expected: m * world,
            got: out.len(),
        });
    }
    out[rank * m..(rank + 1) * m].copy_from_slice(mine);
    let nseg = chunks::segments(m, seg_elems::<E>(seg_bytes));
    ring::all_gather_by(t, out, 0, nseg, |i| i * m..(i + 1) * m)
}

/// Dissemination barrier: `ceil(log2 P)` rounds of empty messages; returns once every rank
/// has entered.
pub fn barrier<T: Transport + ?Sized>(t: &mut T) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    let mut dist = 1;
    while dist < world {
        let to = (rank + dist) % world;
        let from = (rank + world - dist) % world;
        t.send_recv_into(to, &[], from, &mut [])?;
        dist *= 2;
    }
    Ok(())
}
