//! Broadcast: a binomial tree for small messages (`log2 P` rounds, pipelined by segment),
//! scatter then ring all-gather for large ones (van de Geijn: each link carries about
//! `2/P` of the buffer instead of all of it).

use gradwire_transport::Transport;

use crate::exchange::seg_elems;
use crate::{chunks, ring, select, Element, Error, Result};

/// Checks that `root` names a rank.
pub(crate) fn check_root(root: usize, world: usize) -> Result<()> {
    if root >= world {
        return Err(Error::InvalidRoot {
            root,
            world_size: world,
        });
    }
    Ok(())
}

/// Broadcasts `buf` from `root`, choosing tree or scatter + all-gather by size.
pub fn broadcast<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    root: usize,
    seg_bytes: usize,
) -> Result<()> {
    let world = t.world_size();
    check_root(root, world)?;
    if world <= 2 || std::mem::size_of_val(buf) < select::BCAST_TREE_BYTES || buf.len() < world {
        binomial(t, buf, root, seg_bytes)
    } else {
        scatter_all_gather(t, buf, root, seg_bytes)
    }
}

/// The binomial tree relative to `root`: `(parent, children)` of rank `rank`, children
/// in sending order (farthest subtree first).
pub fn binomial_tree(rank: usize, world: usize, root: usize) -> (Option<usize>, Vec<usize>) {
    let vr = (rank + world - root) % world;
    let real = |v: usize| (v + root) % world;
    let mut mask = 1;
    let mut parent = None;
    while mask < world {
        if vr & mask != 0 {
            parent = Some(real(vr - mask));
            break;
        }
        mask <<= 1;
    }
    let mut children = Vec::new();
    mask >>= 1;
    while mask > 0 {
        if vr + mask < world {
            children.push(real(vr + mask));
        }
        mask >>= 1;
    }
    (parent, children)
}

/// Binomial-tree broadcast; each segment is forwarded to the children as soon as it arrives.
pub fn binomial<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    root: usize,
    seg_bytes: usize,
) -> Result<()> {
    let world = t.world_size();
    check_root(root, world)?;
    let (parent, children) = binomial_tree(t.rank(), world, root);
    let nseg = chunks::segments(buf.len(), seg_elems::<E>(seg_bytes));
    down_tree(t, parent, &children, buf, nseg)
}

/// Passes `buf` down a tree in `nseg` segments: each segment is received from `parent`
/// (unless this rank is the root) and forwarded to the `children` as soon as it arrives.
fn down_tree<T: Transport + ?Sized, P: bytemuck::Pod>(
    t: &mut T,
    parent: Option<usize>,
    children: &[usize],
    buf: &mut [P],
    nseg: usize,
) -> Result<()> {
    let len = buf.len();
    for j in 0..nseg {
        let r = chunks::range(len, nseg, j);
        if let Some(p) = parent {
            t.recv_into(p, bytemuck::cast_slice_mut(&mut buf[r.clone()]))?;
        }
        for &c in children {
            t.send(c, bytemuck::cast_slice(&buf[r.clone()]))?;
        }
    }
    Ok(())
}

/// Van de Geijn broadcast: binomial scatter of the `P` chunks, then ring all-gather.
pub fn scatter_all_gather<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    root: usize,
    seg_bytes: usize,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    check_root(root, world)?;
    let len = buf.len();
    let seg = seg_elems::<E>(seg_bytes);
    let vr = (rank + world - root) % world;
    let real = |v: usize| (v + root) % world;
    // Scatter: vrank v ends with chunk v; a subtree rooted at v covers chunks v..v+size.
    let mut mask = 1;
    while mask < world {
        if vr & mask != 0 {
            let r = chunks::span(len, world, vr, (vr + mask).min(world));
            let nseg = chunks::segments(r.len(), seg);
            crate::exchange::recv_segs(t, real(vr - mask), &mut buf[r], nseg)?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vr + mask < world {
            let r = chunks::span(len, world, vr + mask, (vr + 2 * mask).min(world));
            let nseg = chunks::segments(r.len(), seg);
            crate::exchange::send_segs(t, real(vr + mask), &buf[r], nseg)?;
        }
        mask >>= 1;
    }
    let nseg = chunks::segments(len.div_ceil(world), seg);
    ring::all_gather_by(t, buf, root, nseg, |i| chunks::range(len, world, i))
}

/// Longest payload [`broadcast_bytes`] accepts by default from a peer's length prefix
/// (1 GiB): a corrupt or hostile prefix must not make every rank allocate without bound.
pub const DEFAULT_MAX_BROADCAST_BYTES: usize = 1 << 30;

/// Broadcasts a byte buffer of any length up to `max_len` from `root` (others learn the
/// length): a length prefix, then the bytes in segments, down a binomial tree. A longer
/// buffer at the root, or a longer announced length at another rank, is an error before
/// anything is allocated or sent.
pub fn broadcast_bytes<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut Vec<u8>,
    root: usize,
    seg_bytes: usize,
    max_len: usize,
) -> Result<()> {
    let world = t.world_size();
    check_root(root, world)?;
    let (parent, children) = binomial_tree(t.rank(), world, root);
    if parent.is_none() && buf.len() > max_len {
        return Err(Error::BadOutputLength {
            expected: max_len,
            got: buf.len(),
        });
    }
    let mut len_msg = (buf.len() as u64).to_le_bytes();
    if let Some(p) = parent {
        t.recv_into(p, &mut len_msg)?;
        let len = u64::from_le_bytes(len_msg);
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= max_len)
            .ok_or(Error::Malformed {
                peer: p,
                what: "broadcast length exceeds the limit",
            })?;
        buf.clear();
        buf.resize(len, 0);
    }
    for &c in &children {
        t.send(c, &len_msg)?;
    }
    let nseg = chunks::segments(buf.len(), seg_bytes);
    down_tree(t, parent, &children, buf, nseg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_is_spanning_and_consistent() {
        for world in 1..=17 {
            for root in 0..world {
                let mut reached = vec![false; world];
                reached[root] = true;
                let mut count = 1;
                for r in 0..world {
                    let (p, ch) = binomial_tree(r, world, root);
                    assert_eq!(p.is_none(), r == root);
                    for c in ch {
                        assert_eq!(binomial_tree(c, world, root).0, Some(r));
                        assert!(!reached[c]);
                        reached[c] = true;
                        count += 1;
                    }
                }
                assert_eq!(count, world);
            }
        }
    }

    #[test]
    fn broadcast_bytes_refuses_an_announced_length_over_the_limit() {
        use gradwire_transport::local::Local;
        let mut w = Local::world(2);
        let mut b = w.pop().unwrap();
        let mut a = w.pop().unwrap();
        a.send(1, &(1u64 << 40).to_le_bytes()).unwrap();
        let mut buf = Vec::new();
        let e = broadcast_bytes(&mut b, &mut buf, 0, 1024, 1 << 20).unwrap_err();
        assert!(matches!(e, Error::Malformed { peer: 0, .. }), "{e}");
        assert!(buf.capacity() < 1 << 20, "nothing allocated for the claim");
        let mut big = vec![0u8; 11];
        assert!(broadcast_bytes(&mut a, &mut big, 0, 1024, 10).is_err());
    }
}
