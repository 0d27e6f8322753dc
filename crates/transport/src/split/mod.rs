//! `split`: groups of ranks with transports of their own, like `MPI_Comm_split`.
//!
//! Every rank of a transport calls [`split`] (or [`Split::split`]) collectively, in the same
//! order as any other collective call, with a *color* (which group to join) and a *key* (where
//! to sort in it). Each gets a [`Group`]: a new, independent transport whose ranks are the
//! members of its color, ranked by key, ties by their rank in the parent. A group's
//! transport owns its own connections (or channels, or communicator), so a rank may hold the
//! parent and several groups at once and use each from its own thread; each group keeps the
//! parent's deadline ([`Transport::timeout`]) until [`Transport::set_timeout`] changes it.
//!
//! A group's errors name the group and both numbers of the peer ([`Error::InGroup`]):
//! "partition group 1: rank 0 (global rank 2): timed out after ...". The *global* rank is
//! the peer's rank in the transport first split (splitting a group again composes the
//! numbers), [`Error::peer`] stays the group rank and [`Error::global_peer`] gives the other.
//!
//! How each transport forms its groups (after one all-to-all of [`offer`]s over the parent,
//! which carries the colors, keys and the transport's own bytes):
//! - TCP ([`crate::tcp`]): every rank binds a fresh listener before the exchange and sends its
//!   address; then the members of a group form a full mesh among themselves (connect to
//!   lower group ranks, accept higher ones), every connection running the parent's handshake
//!   on the job's token, bound to an identity derived from the parent mesh's, the split's
//!   sequence number, the color and the members, so a rank of another group (or of another
//!   split) is refused like a rank of another job.
//! - Local ([`crate::local`]): group rank 0 builds an in-process world of the group's size
//!   and hands each member its end over the parent world's hand-off channels.
//! - MPI (feature `mpi`): `MPI_Comm_split`, with the same numbering; it needs a library that
//!   offers `MPI_THREAD_MULTIPLE`, since the groups are used from several threads.
//! - Shared memory (`shm`) and [`crate::link::Throttled`] cannot split:
//!   [`Error::SplitUnsupported`].
//!
//! [`grid`] splits a world of `R * K` ranks into the two groups of model parallelism in the
//! style of DistBelief: rank `r * K + j` is partition `j` of replica `r`.
//!
//! ```text
//!               partition 0   partition 1   partition 2      (K = 3)
//! replica 0       rank 0        rank 1        rank 2        <- replica group 0
//! replica 1       rank 3        rank 4        rank 5        <- replica group 1
//!                   ^             ^             ^
//!            partition group 0    1             2
//! ```
//! Rank `r * K + j` is rank `j` of replica `r`'s group (labelled "replica r") and rank `r`
//! of partition group `j` (labelled "partition group j").

mod group;
pub mod offer;
mod plan;
#[cfg(test)]
mod tests;

pub use group::Group;
pub(crate) use plan::Plan;

use crate::{Error, Result, Transport};
use offer::{Offer, OfferError};

/// A transport that can be split into groups (see the [module docs](self)).
pub trait Split: Transport {
    /// Collective over every rank of this transport: joins the group of ranks that passed the
    /// same `color`, ranked by `key` (ties by rank), and returns this rank's transport in it
    /// (labelled "group `color`"). Every rank of the transport must call it at the same
    /// point of its sequence of calls.
    fn split(&mut self, color: u32, key: u32) -> Result<Group>;
}

/// [`Split::split`] on any transport that can split (one whose [`Transport::splitter`]
/// gives one, such as [`crate::tcp::Tcp`], [`crate::local::Local`], `Mpi`, a [`Group`], or a
/// `Box<dyn Transport>` holding one); [`Error::SplitUnsupported`] otherwise.
pub fn split<T: Transport + ?Sized>(t: &mut T, color: u32, key: u32) -> Result<Group> {
    match t.splitter() {
        Some(s) => s.split(color, key),
        None => Err(Error::SplitUnsupported { transport: "this" }),
    }
}

/// [`split`], boxed for code that holds its transports as `Box<dyn Transport>`.
pub fn split_boxed<T: Transport + ?Sized>(
    t: &mut T,
    color: u32,
    key: u32,
) -> Result<Box<dyn Transport>> {
    Ok(Box::new(split(t, color, key)?))
}

/// Splits a world of `replicas * partitions` ranks into a replica group and a partition
/// group per rank (see the [module docs](self) for the layout): rank `r * K + j` gets
/// `(replica, partition)`, where `replica` holds the `K` partitions of replica `r`
/// (its rank there is `j`, label "replica r") and `partition` holds partition `j` of every
/// replica (its rank there is `r`, label "partition group j"). Collective; every rank calls
/// it with the same `replicas` and `partitions`.
pub fn grid<T: Transport + ?Sized>(
    world: &mut T,
    replicas: usize,
    partitions: usize,
) -> Result<(Group, Group)> {
    let n = world.world_size();
    let bad = Error::BadGrid {
        world_size: n,
        replicas,
        partitions,
    };
    if replicas == 0 || partitions == 0 || replicas.checked_mul(partitions) != Some(n) {
        return Err(bad);
    }
    let (Ok(r), Ok(j)) = (
        u32::try_from(world.rank() / partitions),
        u32::try_from(world.rank() % partitions),
    ) else {
        return Err(bad);
    };
    let mut replica = split(world, r, j)?;
    replica.set_label(format!("replica {r}"));
    let mut partition = split(world, j, r)?;
    partition.set_label(format!("partition group {j}"));
    Ok((replica, partition))
}

/// Every rank's offer, by rank: one all-to-all over `t` (`n - 1` full-duplex steps, each
/// rank sending to `rank + d` while receiving from `rank - d`). Refuses an offer that is
/// malformed or from another split (`seq`), naming its sender.
pub(crate) fn exchange<T: Transport + ?Sized>(t: &mut T, mine: &Offer<'_>) -> Result<Vec<Vec<u8>>> {
    let (me, n) = (t.rank(), t.world_size());
    let bytes = mine.encode().ok_or(Error::Misuse {
        what: "a split payload larger than an offer carries",
    })?;
    let mut all = vec![Vec::new(); n];
    for d in 1..n {
        let (to, from) = ((me + d) % n, (me + n - d) % n);
        t.send_recv(to, &bytes, from, &mut all[from])?;
        let theirs =
            Offer::decode(&all[from]).map_err(|source| Error::BadSplit { peer: from, source })?;
        if theirs.seq != mine.seq {
            return Err(Error::BadSplit {
                peer: from,
                source: OfferError::OutOfStep {
                    ours: mine.seq,
                    theirs: theirs.seq,
                },
            });
        }
    }
    all[me] = bytes;
    Ok(all)
}

/// The offers `exchange` returned, decoded (they were checked there), with this rank's
/// [`Plan`].
pub(crate) fn plan_of(me: usize, all: &[Vec<u8>]) -> Result<(Plan, Vec<Offer<'_>>)> {
    let offers = all
        .iter()
        .enumerate()
        .map(|(r, b)| Offer::decode(b).map_err(|source| Error::BadSplit { peer: r, source }))
        .collect::<Result<Vec<_>>>()?;
    let choices: Vec<(u32, u32)> = offers.iter().map(|o| (o.color, o.key)).collect();
    Ok((Plan::new(&choices, me), offers))
}

/// [`exchange`] then [`plan_of`], for transports whose offers carry no payload.
pub(crate) fn agree<T: Transport + ?Sized>(
    t: &mut T,
    seq: u32,
    color: u32,
    key: u32,
) -> Result<Plan> {
    let all = exchange(
        t,
        &Offer {
            seq,
            color,
            key,
            payload: &[],
        },
    )?;
    Ok(plan_of(t.rank(), &all)?.0)
}
