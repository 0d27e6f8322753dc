//! `hierarchical`: Horovod's hierarchical all-reduce — ranks that share a host reduce among
//! themselves (over shared memory), one leader per host all-reduces across hosts (over the
//! network), and each leader broadcasts the result to its host.
//!
//! Steps, for a host of `n` ranks with local rank 0 as its leader:
//! 1. reduce to the leader: a local reduce-scatter ([`crate::ring::reduce_scatter`]; each
//!    local rank then holds its reduced chunk [`chunks::range`]`(len, n, i)`), and every
//!    non-leader sends its chunk to the leader;
//! 2. the leaders all-reduce over the cross-host transport (the usual size-chosen algorithm);
//! 3. the leader broadcasts over the local transport.
//!
//! `Mean` reduces as a sum at every step and divides by the job's size once at the end, so
//! hosts of different sizes weigh each rank equally. Sums are grouped by host, so floating
//! point results may differ from the flat all-reduce's in the last bits (every rank of the
//! job still gets the same bits: the leader's, broadcast).
//!
//! Where the ranks are comes from [`Layout`]: host names per rank, exchanged with
//! [`exchange_layout`] (each rank says its host, e.g. its hostname or a declared
//! `GRADWIRE_HOST`). [`Group`] views some ranks of a transport as a world of their own, so
//! the leaders can run over the job's network transport without a second rendezvous.
//! [`Hierarchy::all_reduce`] reports failures with the job's rank numbers (the local and cross
//! transports number their own ranks; errors are mapped back).
//!
//! Deviation from Horovod's NCCL path: that one reduce-scatters within the host, all-reduces
//! every local rank's shard across hosts and all-gathers within the host, using every local
//! rank's network link; this is Horovod's MPI-only path (reduce to one leader, broadcast),
//! which needs a single network path per host.

use std::ops::Range;

use gradwire_transport::Transport;

use crate::element::finish;
use crate::{chunks, select, Collectives, Element, Error, ReduceOp, Result};

/// Longest host name accepted from a peer in [`exchange_layout`] (bytes).
pub const MAX_HOST_NAME: usize = 255;

/// Which ranks share a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The ranks of each host, ascending; hosts in order of their lowest rank.
    hosts: Vec<Vec<usize>>,
}

impl Layout {
    /// The layout of a job whose rank `r` runs on host `names[r]`.
    pub fn from_hosts<S: AsRef<str>>(names: &[S]) -> Layout {
        let mut hosts: Vec<(String, Vec<usize>)> = Vec::new();
        for (rank, name) in names.iter().enumerate() {
            match hosts.iter_mut().find(|(h, _)| h == name.as_ref()) {
                Some((_, ranks)) => ranks.push(rank),
                None => hosts.push((name.as_ref().to_string(), vec![rank])),
            }
        }
        Layout {
            hosts: hosts.into_iter().map(|(_, r)| r).collect(),
        }
    }

    /// The ranks of each host (ascending), hosts in order of their lowest rank.
    pub fn hosts(&self) -> &[Vec<usize>] {
        &self.hosts
    }

    /// Ranks in the job.
    pub fn world_size(&self) -> usize {
        self.hosts.iter().map(Vec::len).sum()
    }

    /// The ranks on `rank`'s host (ascending; the first is the host's leader).
    pub fn host_of(&self, rank: usize) -> Option<&[usize]> {
        self.hosts
            .iter()
            .find(|h| h.contains(&rank))
            .map(Vec::as_slice)
    }

    /// The leader of every host (its lowest rank), in host order.
    pub fn leaders(&self) -> Vec<usize> {
        self.hosts.iter().map(|h| h[0]).collect()
    }

    /// Whether the hierarchy differs from a flat all-reduce: several hosts, one of them with
    /// several ranks.
    pub fn is_hierarchical(&self) -> bool {
        self.hosts.len() > 1 && self.hosts.len() < self.world_size()
    }
}

/// Every rank tells the others its host name; all ranks return the same [`Layout`]. A name
/// longer than [`MAX_HOST_NAME`] or not UTF-8 is refused ([`Error::Malformed`] naming the
/// rank).
pub fn exchange_layout<T: Transport + ?Sized>(t: &mut T, host: &str) -> Result<Layout> {
    if host.len() > MAX_HOST_NAME {
        return Err(Error::Malformed {
            peer: t.rank(),
            what: "host name longer than 255 bytes",
        });
    }
    let mut all = Vec::new();
    crate::gather::all_gather_bytes(t, host.as_bytes(), &mut all)?;
    layout_from_gathered(all)
}

/// The layout from every rank's host-name bytes as received (untrusted: a name longer than
/// [`MAX_HOST_NAME`] or not UTF-8 is refused, naming the rank).
pub(crate) fn layout_from_gathered(all: Vec<Vec<u8>>) -> Result<Layout> {
    let mut names = Vec::with_capacity(all.len());
    for (peer, b) in all.into_iter().enumerate() {
        if b.len() > MAX_HOST_NAME {
            return Err(Error::Malformed {
                peer,
                what: "host name longer than 255 bytes",
            });
        }
        names.push(String::from_utf8(b).map_err(|_| Error::Malformed {
            peer,
            what: "host name is not UTF-8",
        })?);
    }
    Ok(Layout::from_hosts(&names))
}

/// Fuzz entry (cargo-fuzz target `host_layout`): `data` split at zero bytes is every rank's
/// host name as received; a layout that decodes must place every rank exactly once.
#[cfg(fuzzing)]
pub fn fuzz_layout(data: &[u8]) {
    let all: Vec<Vec<u8>> = data.split(|b| *b == 0).map(<[u8]>::to_vec).collect();
    let n = all.len();
    if let Ok(layout) = layout_from_gathered(all) {
        assert_eq!(layout.world_size(), n);
        for r in 0..n {
            assert!(layout.host_of(r).is_some_and(|h| h.contains(&r)));
        }
        assert!(layout.leaders().iter().all(|&l| l < n));
    }
}

/// Some ranks of a transport as a world of their own: rank `i` of the group is
/// `members[i]` of the underlying transport, which also numbers the ranks in its errors.
/// Only members call it, all in the same order (like any collective).
pub struct Group<'a, T: ?Sized> {
    t: &'a mut T,
    members: Vec<usize>,
    me: usize,
}

impl<'a, T: Transport + ?Sized> Group<'a, T> {
    /// The group of `members` (distinct ranks of `t`); `None` when `t`'s rank is not one.
    pub fn new(t: &'a mut T, members: Vec<usize>) -> Option<Group<'a, T>> {
        let me = members.iter().position(|&m| m == t.rank())?;
        Some(Group { t, members, me })
    }

    fn member(&self, i: usize) -> gradwire_transport::Result<usize> {
        self.members
            .get(i)
            .copied()
            .ok_or(gradwire_transport::Error::InvalidRank {
                rank: i,
                world_size: self.members.len(),
            })
    }
}

impl<T: Transport + ?Sized> Transport for Group<'_, T> {
    fn rank(&self) -> usize {
        self.me
    }
    fn world_size(&self) -> usize {
        self.members.len()
    }
    fn send(&mut self, to: usize, msg: &[u8]) -> gradwire_transport::Result<()> {
        let to = self.member(to)?;
        self.t.send(to, msg)
    }
    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> gradwire_transport::Result<()> {
        let from = self.member(from)?;
        self.t.recv(from, buf)
    }
    fn send_recv(
        &mut self,
        to: usize,
        msg: &[u8],
        from: usize,
        buf: &mut Vec<u8>,
    ) -> gradwire_transport::Result<()> {
        let (to, from) = (self.member(to)?, self.member(from)?);
        self.t.send_recv(to, msg, from, buf)
    }
    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> gradwire_transport::Result<()> {
        let from = self.member(from)?;
        self.t.recv_into(from, out)
    }
    fn send_recv_into(
        &mut self,
        to: usize,
        msg: &[u8],
        from: usize,
        out: &mut [u8],
    ) -> gradwire_transport::Result<()> {
        let (to, from) = (self.member(to)?, self.member(from)?);
        self.t.send_recv_into(to, msg, from, out)
    }
    fn timeout(&self) -> std::time::Duration {
        self.t.timeout()
    }
    fn set_timeout(&mut self, timeout: std::time::Duration) {
        self.t.set_timeout(timeout)
    }
    /// The underlying transport's count (the group's traffic is part of it).
    fn bytes_sent(&self) -> u64 {
        self.t.bytes_sent()
    }
}

/// One rank's view of the hierarchy: the transport among the ranks of its host, the one
/// among the hosts' leaders (leaders only), and the job ranks both number.
pub struct Hierarchy<L, C> {
    /// The ranks of this host; local rank 0 is the leader.
    pub local: L,
    /// The leaders of every host (`Some` on leaders only).
    pub cross: Option<C>,
    /// Job rank of each local rank.
    pub local_ranks: Vec<usize>,
    /// Job rank of each leader, in the cross transport's order.
    pub leader_ranks: Vec<usize>,
    /// Ranks in the job (the divisor of `Mean`).
    pub world: usize,
}

impl<L: Transport, C: Transport> Hierarchy<L, C> {
    /// The hierarchical all-reduce of `buf` with `op` (see the module doc); every rank of
    /// the job calls it with the same length. Errors name job ranks.
    pub fn all_reduce<E: Element>(&mut self, buf: &mut [E], op: ReduceOp) -> Result<()> {
        all_reduce(
            &mut self.local,
            self.cross.as_mut(),
            &self.local_ranks,
            &self.leader_ranks,
            self.world,
            buf,
            op,
        )
    }
}

/// [`Hierarchy::all_reduce`] over borrowed transports: `local` among this host's ranks
/// (job ranks `local_ranks`), `cross` among the leaders (job ranks `leader_ranks`; `Some`
/// on leaders only), `world` ranks in the job.
pub fn all_reduce<L, C, E>(
    local: &mut L,
    cross: Option<&mut C>,
    local_ranks: &[usize],
    leader_ranks: &[usize],
    world: usize,
    buf: &mut [E],
    op: ReduceOp,
) -> Result<()>
where
    L: Transport + ?Sized,
    C: Transport + ?Sized,
    E: Element,
{
    let step_op = if op == ReduceOp::Mean {
        ReduceOp::Sum
    } else {
        op
    };
    let to_job = |i: usize| local_ranks.get(i).copied().unwrap_or(i);
    reduce_to_leader(local, buf, step_op).map_err(|e| e.map_ranks(to_job))?;
    if let Some(cross) = cross {
        cross
            .all_reduce(buf, step_op)
            .map_err(|e| e.map_ranks(|i| leader_ranks.get(i).copied().unwrap_or(i)))?;
    }
    if local.world_size() > 1 {
        local.broadcast(buf, 0).map_err(|e| e.map_ranks(to_job))?;
    }
    finish(op, buf, world);
    Ok(())
}

/// Step 1: local reduce-scatter, then every chunk to local rank 0 (whose `buf` ends up
/// holding the host's reduction; the others' `buf` holds partial sums).
fn reduce_to_leader<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
) -> Result<()> {
    let (me, n) = (t.rank(), t.world_size());
    if n == 1 {
        return Ok(());
    }
    let mine: Range<usize> = crate::ring::reduce_scatter(t, buf, op, select::segment_bytes())?;
    debug_assert_eq!(mine, chunks::range(buf.len(), n, me));
    if me != 0 {
        t.send(0, bytemuck::cast_slice(&buf[mine]))?;
        return Ok(());
    }
    for r in 1..n {
        let range = chunks::range(buf.len(), n, r);
        t.recv_into(r, bytemuck::cast_slice_mut(&mut buf[range]))
            .map_err(|e| match e {
                gradwire_transport::Error::SizeMismatch {
                    peer,
                    expected,
                    got,
                } => Error::LengthMismatch {
                    peer,
                    expected: expected / std::mem::size_of::<E>(),
                    got: got / std::mem::size_of::<E>(),
                },
                e => Error::Transport(e),
            })?;
    }
    Ok(())
}
