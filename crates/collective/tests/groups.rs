//! Collectives on the groups of a split world: a 6-rank in-process world and a 4-rank TCP
//! world on 127.0.0.1 are split by `grid` into replica and partition groups, and every
//! rank runs all-reduce (ring, recursive doubling, Rabenseifner; sum and max), broadcast
//! and all-gather on both of its groups at once, one thread per group. Each result must
//! equal the naive oracle of `gradwire_collective::reference` computed from the inputs of
//! that group's own members only, where the members are derived from the grid layout, not
//! read back from the group. Every rank's input says who made it (bit `g` of each value
//! belongs to global rank `g`), so a result that mixes in another group's rank, or misses
//! one, differs from the oracle.
//!
//! The transports run under a deadline, so a bug fails with an error instead of hanging;
//! a guard over the whole world fails the test should a thread still hang past it.

use std::sync::mpsc;
use std::time::Duration;

use gradwire_collective::{reference, Algorithm, Collectives, ReduceOp, Transport};
use gradwire_transport::local::Local;
use gradwire_transport::split::{grid, Group};
use gradwire_transport::tcp::loopback_world;

/// Every transport's no-progress deadline.
const DEADLINE: Duration = Duration::from_secs(20);
/// How long a whole world may take before the test gives up on its threads.
const GUARD: Duration = Duration::from_secs(300);

type World = Vec<Box<dyn Transport>>;

/// Global rank `g`'s f32 input for round `round`: bit `g` plus a multiple of 64 that varies
/// along the buffer. Sums over at most 6 ranks stay exact in f32, in any order, and the low
/// 6 bits of a sum are the set of ranks summed.
fn input(g: usize, round: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|k| ((1usize << g) + 64 * (round * 7 + k % 100)) as f32)
        .collect()
}

/// Global rank `g`'s i32 input for the max all-reduce: the largest member wins everywhere
/// but at every third element, where the smallest does.
fn input_i32(g: usize, len: usize) -> Vec<i32> {
    (0..len)
        .map(|k| {
            let v = (g as i32 + 1) * 1000 + (k % 50) as i32;
            if k % 3 == 0 {
                -v
            } else {
                v
            }
        })
        .collect()
}

/// Runs every collective of the test on `g`, whose members (by group rank) must be the
/// global ranks `members`; `me` is this rank's global rank. Panics, naming the group, on
/// any error or result that is not the oracle's.
fn run_collectives(g: &mut Group, members: &[usize], me: usize) {
    let label = g.label().to_string();
    assert_eq!(g.members(), members, "{label}: members");
    assert_eq!(g.world_size(), members.len(), "{label}: size");
    assert_eq!(
        members[g.rank()],
        me,
        "{label}: group rank of global rank {me}"
    );
    let fail = |what: &str, e: gradwire_collective::Error| -> ! {
        panic!("{label}: global rank {me}: {what}: {e}")
    };

    let algos = [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::Rabenseifner,
    ];
    let mut round = 0;
    for algo in algos {
        for len in [1, 5, 1000, 65_537] {
            round += 1;
            let mut buf = input(me, round, len);
            g.all_reduce_with(&mut buf, ReduceOp::Sum, algo)
                .unwrap_or_else(|e| fail(&format!("{algo} all-reduce of {len}"), e));
            let inputs: Vec<Vec<f32>> = members.iter().map(|&m| input(m, round, len)).collect();
            assert!(
                buf == reference::all_reduce(&inputs, ReduceOp::Sum),
                "{label}: global rank {me}: {algo} all-reduce of {len} is not the sum over \
                 {members:?} (first element {})",
                buf[0]
            );
        }
    }

    let mut ints = input_i32(me, 999);
    g.all_reduce(&mut ints, ReduceOp::Max)
        .unwrap_or_else(|e| fail("max all-reduce", e));
    let inputs: Vec<Vec<i32>> = members.iter().map(|&m| input_i32(m, 999)).collect();
    assert_eq!(
        ints,
        reference::all_reduce(&inputs, ReduceOp::Max),
        "{label}: global rank {me}: max all-reduce"
    );

    let n = members.len();
    for (root, &root_global) in members.iter().enumerate() {
        round += 1;
        let mut buf = input(me, round, 3000);
        g.broadcast(&mut buf, root)
            .unwrap_or_else(|e| fail(&format!("broadcast from {root}"), e));
        assert!(
            buf == input(root_global, round, 3000),
            "{label}: global rank {me}: broadcast from group rank {root}"
        );
    }

    round += 1;
    let inputs: Vec<Vec<f32>> = members.iter().map(|&m| input(m, round, 77)).collect();
    let mut out = vec![0.0f32; n * 77];
    g.all_gather_into(&input(me, round, 77), &mut out)
        .unwrap_or_else(|e| fail("all-gather of equal parts", e));
    assert!(
        out == reference::concat(&inputs),
        "{label}: global rank {me}: all-gather of equal parts"
    );

    round += 1;
    let inputs: Vec<Vec<f32>> = members.iter().map(|&m| input(m, round, 1001)).collect();
    let mut buf = input(me, round, 1001);
    g.all_gather(&mut buf)
        .unwrap_or_else(|e| fail("in-place all-gather", e));
    assert!(
        buf == reference::all_gather(&inputs),
        "{label}: global rank {me}: in-place all-gather"
    );
}

/// Splits `world` (`replicas * partitions` ranks) with `grid` and runs the collectives on
/// both groups of every rank at once, then an all-reduce on the world itself. One thread
/// per rank and per group, all joined; the whole run is bounded by [`GUARD`].
fn grid_collectives(world: World, replicas: usize, partitions: usize) {
    let n = replicas * partitions;
    assert_eq!(world.len(), n);
    let (tx, rx) = mpsc::channel();
    let runner = std::thread::spawn(move || {
        let handles: Vec<_> = world
            .into_iter()
            .map(|mut t| {
                std::thread::spawn(move || {
                    t.set_timeout(DEADLINE);
                    let me = t.rank();
                    let (r, j) = (me / partitions, me % partitions);
                    let (mut rep, mut part) = grid(&mut t, replicas, partitions)
                        .unwrap_or_else(|e| panic!("rank {me}: grid: {e}"));
                    let rep_members: Vec<usize> =
                        (0..partitions).map(|k| r * partitions + k).collect();
                    let part_members: Vec<usize> =
                        (0..replicas).map(|q| q * partitions + j).collect();
                    std::thread::scope(|s| {
                        let a = s.spawn(|| run_collectives(&mut rep, &rep_members, me));
                        let b = s.spawn(|| run_collectives(&mut part, &part_members, me));
                        let (a, b) = (a.join(), b.join());
                        if let Err(p) = a.and(b) {
                            std::panic::resume_unwind(p);
                        }
                    });
                    // The world still reduces over everyone, its groups alive beside it.
                    let mut buf = input(me, 0, 4096);
                    t.all_reduce(&mut buf, ReduceOp::Sum)
                        .unwrap_or_else(|e| panic!("rank {me}: world all-reduce: {e}"));
                    let inputs: Vec<Vec<f32>> = (0..n).map(|g| input(g, 0, 4096)).collect();
                    assert!(
                        buf == reference::all_reduce(&inputs, ReduceOp::Sum),
                        "rank {me}: world all-reduce"
                    );
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        let _ = tx.send(());
        results
    });
    rx.recv_timeout(GUARD).unwrap_or_else(|_| {
        panic!("{replicas}x{partitions} grid: still running after {GUARD:?} (a collective hangs)")
    });
    let results = runner.join().expect("the runner thread joins its ranks");
    for (rank, res) in results.into_iter().enumerate() {
        if let Err(p) = res {
            eprintln!("rank {rank} failed");
            std::panic::resume_unwind(p);
        }
    }
}

fn local(n: usize) -> World {
    Local::world(n)
        .into_iter()
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .collect()
}

fn tcp(n: usize) -> World {
    loopback_world(n)
        .expect("a TCP world on 127.0.0.1")
        .into_iter()
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .collect()
}

#[test]
fn local_grid_2x3_groups_reduce_only_their_members() {
    grid_collectives(local(6), 2, 3);
}

#[test]
fn tcp_grid_2x2_groups_reduce_only_their_members() {
    grid_collectives(tcp(4), 2, 2);
}

/// Groups of one (a 1x3 and a 3x1 grid) and a world of one pass every collective through.
#[test]
fn local_grids_with_groups_of_one() {
    grid_collectives(local(3), 1, 3);
    grid_collectives(local(3), 3, 1);
    grid_collectives(local(1), 1, 1);
}
