//! The split section: `grid` over MPI, both groups of a rank used at once from two threads,
//! a group split again, each checked against the oracle over the group's own members.

use gradwire_collective::{reference, Collectives, ReduceOp};
use gradwire_transport::mpi::Mpi;
use gradwire_transport::split::{self, Group};
use gradwire_transport::Transport;

use crate::suite::{Tally, ALGOS};

/// Global rank `g`'s input to a group's all-reduce: bit `g` plus a multiple of 64, so a
/// sum is exact in any order and its low bits say which ranks were summed.
pub(crate) fn tagged(g: usize, round: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((1usize << g) + 64 * (round * 5 + i % 97)) as f32)
        .collect()
}

/// The checks of one group whose members (by group rank) must be the global ranks
/// `members`: every algorithm's all-reduce and a broadcast, against the oracle over those
/// members' inputs. Returns its own tally, which [`merge`] adds to the rank's.
pub(crate) fn group_checks(g: &mut Group, members: &[usize], me: usize) -> Tally {
    let mut k = Tally::default();
    let label = g.label().to_string();
    k.eq(&format!("{label}: members"), g.members(), members);
    k.ok(
        &format!("{label}: group rank {} is not global rank {me}", g.rank()),
        members.get(g.rank()) == Some(&me),
    );
    for (round, algo) in ALGOS.into_iter().enumerate() {
        for len in [1usize, 1000, 70_001] {
            let mut buf = tagged(me, round, len);
            let what = format!("{label}: {algo} all-reduce of {len}");
            if k.res(&what, g.all_reduce_with(&mut buf, ReduceOp::Sum, algo))
                .is_none()
            {
                return k;
            }
            let inputs: Vec<Vec<f32>> = members.iter().map(|&m| tagged(m, round, len)).collect();
            k.eq(&what, &buf, &reference::all_reduce(&inputs, ReduceOp::Sum));
        }
    }
    let root = members.len() - 1;
    let mut buf = tagged(me, 9, 3000);
    let what = format!("{label}: broadcast from group rank {root}");
    if k.res(&what, g.broadcast(&mut buf, root)).is_some() {
        k.eq(&what, &buf, &tagged(members[root], 9, 3000));
    }
    k
}

/// Adds a group's tally to the rank's.
pub(crate) fn merge(k: &mut Tally, g: Tally) {
    k.checks += g.checks;
    k.errs.extend(g.errs);
    k.broken |= g.broken;
}

/// `grid` over MPI: both groups of every rank used at once from two threads (which needs
/// MPI_THREAD_MULTIPLE; without it, the split's refusal), then a partition group split
/// again by the parity of the replica index, and the world still reducing over everyone.
pub(crate) fn split_checks(t: &mut Mpi, k: &mut Tally) {
    let (me, n) = (t.rank(), t.world_size());
    if !t.thread_multiple() {
        // Groups need MPI_THREAD_MULTIPLE: without it the split is refused by name (on every
        // rank, before any message moves).
        let err = split::split(t, 0, 0).map(|_| ()).map_err(|e| e.to_string());
        k.ok(
            &format!("split without MPI_THREAD_MULTIPLE refused by name: {err:?}"),
            matches!(&err, Err(e) if e.contains("MPI_THREAD_MULTIPLE")),
        );
        if me == 0 {
            println!("mpi suite: the library lacks MPI_THREAD_MULTIPLE; groups not checked");
        }
        return;
    }
    let partitions = if n % 2 == 0 { 2 } else { n };
    let replicas = n / partitions;
    let Some((mut rep, mut part)) = k.res("grid", split::grid(t, replicas, partitions)) else {
        return;
    };
    let (r, j) = (me / partitions, me % partitions);
    let rep_members: Vec<usize> = (0..partitions).map(|q| r * partitions + q).collect();
    let part_members: Vec<usize> = (0..replicas).map(|q| q * partitions + j).collect();
    k.eq(
        "replica label",
        &[rep.label()],
        &[format!("replica {r}").as_str()],
    );
    k.eq(
        "partition label",
        &[part.label()],
        &[format!("partition group {j}").as_str()],
    );
    k.ok("group deadline", rep.timeout() == t.timeout());
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| group_checks(&mut rep, &rep_members, me));
        let b = s.spawn(|| group_checks(&mut part, &part_members, me));
        (
            a.join().expect("replica thread"),
            b.join().expect("partition thread"),
        )
    });
    merge(k, a);
    merge(k, b);
    // The partition group split again by the parity of the replica index.
    let Some(mut sub) = k.res("nested split", split::split(&mut part, (r % 2) as u32, 0)) else {
        return;
    };
    let sub_members: Vec<usize> = part_members
        .iter()
        .copied()
        .filter(|g| (g / partitions) % 2 == r % 2)
        .collect();
    merge(k, group_checks(&mut sub, &sub_members, me));
    drop((sub, rep, part));
    let mut buf = tagged(me, 11, 500);
    if k.res(
        "world all-reduce after the split",
        t.all_reduce(&mut buf, ReduceOp::Sum),
    )
    .is_some()
    {
        let inputs: Vec<Vec<f32>> = (0..n).map(|g| tagged(g, 11, 500)).collect();
        k.eq(
            "world all-reduce after the split",
            &buf,
            &reference::all_reduce(&inputs, ReduceOp::Sum),
        );
    }
}
