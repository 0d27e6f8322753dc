//! Split tests over the in-process and TCP loopback worlds: grids of 2x2 and 2x3 whose two
//! groups per rank are used at once from two threads, a dead or stalled member named by
//! both ranks within the deadline, nested splits, calls out of step, and the error text.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::*;
use crate::local::Local;
use crate::tcp::loopback_world;
use crate::Op;

type World = Vec<Box<dyn Transport>>;

fn local(n: usize) -> World {
    Local::world(n)
        .into_iter()
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .collect()
}

fn tcp(n: usize) -> World {
    loopback_world(n)
        .unwrap()
        .into_iter()
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .collect()
}

/// Runs `f` on every rank of `world`, one thread each; results by rank.
fn on_ranks<R: Send>(world: World, f: impl Fn(Box<dyn Transport>) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .map(|t| {
                let f = &f;
                s.spawn(move || f(t))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A message from global rank `g` in round `i` of the test's traffic on `tag`'s group:
/// `len` bytes that say who sent them and when.
fn message(g: usize, tag: u8, i: usize, len: usize) -> Vec<u8> {
    let mut m = vec![g as u8, tag, i as u8];
    m.extend((0..len).map(|k| (k * 31 + g * 7 + i) as u8));
    m
}

/// Traffic on one group, as its members all do it: ring steps (send to the next group
/// rank, receive from the previous, large enough to pass the socket buffers), then
/// point-to-point sends to group rank 0, which receives from each in turn. Checks every byte
/// and returns the global ranks heard from.
fn traffic(g: &mut Group, tag: u8) -> Vec<usize> {
    let (me, n) = (g.rank(), g.world_size());
    let members = g.members().to_vec();
    let mut heard = Vec::new();
    let mut buf = Vec::new();
    for i in 0..4 {
        let len = if i % 2 == 0 { 3 << 20 } else { 100 };
        let (to, from) = ((me + 1) % n, (me + n - 1) % n);
        g.send_recv(to, &message(members[me], tag, i, len), from, &mut buf)
            .unwrap();
        assert!(
            buf == message(members[from], tag, i, len),
            "{}: ring step {i} from group rank {from}: wrong bytes",
            g.label()
        );
        heard.push(members[from]);
    }
    if me == 0 {
        for (from, &global) in members.iter().enumerate().skip(1) {
            g.recv(from, &mut buf).unwrap();
            assert_eq!(buf, message(global, tag, 99, 10), "{}", g.label());
            heard.push(global);
        }
    } else {
        g.send(0, &message(members[me], tag, 99, 10)).unwrap();
    }
    heard
}

/// Every rank's grid groups: the layout, then both groups' traffic at once from two
/// threads, then the world itself still works.
fn grid_works(world: World, replicas: usize, partitions: usize) {
    let n = replicas * partitions;
    let got = on_ranks(world, |mut t| {
        let me = t.rank();
        let (mut rep, mut part) = grid(&mut t, replicas, partitions).unwrap();
        let (r, j) = (me / partitions, me % partitions);
        assert_eq!((rep.rank(), rep.world_size()), (j, partitions));
        assert_eq!((part.rank(), part.world_size()), (r, replicas));
        assert_eq!(
            rep.members(),
            (0..partitions)
                .map(|k| r * partitions + k)
                .collect::<Vec<_>>()
        );
        assert_eq!(
            part.members(),
            (0..replicas)
                .map(|q| q * partitions + j)
                .collect::<Vec<_>>()
        );
        assert_eq!(rep.label(), format!("replica {r}"));
        assert_eq!(part.label(), format!("partition group {j}"));
        assert_eq!((rep.global_rank(), part.global_rank()), (me, me));
        assert_eq!(rep.timeout(), t.timeout());
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| traffic(&mut rep, b'R'));
            let b = s.spawn(|| traffic(&mut part, b'P'));
            (a.join().unwrap(), b.join().unwrap())
        });
        // The world is untouched by its groups.
        let mut buf = Vec::new();
        t.send_recv((me + 1) % n, &[me as u8], (me + n - 1) % n, &mut buf)
            .unwrap();
        assert_eq!(buf, vec![((me + n - 1) % n) as u8]);
        (a, b)
    });
    for (me, (a, b)) in got.into_iter().enumerate() {
        let (r, j) = (me / partitions, me % partitions);
        let prev_in_rep = r * partitions + (j + partitions - 1) % partitions;
        let prev_in_part = ((r + replicas - 1) % replicas) * partitions + j;
        assert_eq!(a[..4], [prev_in_rep; 4], "rank {me}");
        assert_eq!(b[..4], [prev_in_part; 4], "rank {me}");
        if j == 0 {
            assert_eq!(
                a[4..],
                (r * partitions + 1..(r + 1) * partitions).collect::<Vec<_>>()
            );
        }
        if r == 0 {
            assert_eq!(
                b[4..],
                (1..replicas)
                    .map(|q| q * partitions + j)
                    .collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn local_grids_2x2_and_2x3_carry_both_groups_at_once() {
    grid_works(local(4), 2, 2);
    grid_works(local(6), 2, 3);
}

#[test]
fn tcp_grids_2x2_and_2x3_carry_both_groups_at_once() {
    grid_works(tcp(4), 2, 2);
    grid_works(tcp(6), 2, 3);
}

/// What the member at global rank `victim` does to its replica group.
#[derive(Clone, Copy)]
enum Fate {
    /// Drops it (its connections close).
    Dropped,
    /// Keeps it and says nothing (stalls).
    Silent,
}

/// In a 2x3 grid (deadline `deadline`), global rank 4 (rank 1 of replica 1) drops or stalls
/// its replica group while the other members receive from it: each survivor gets, within the
/// deadline, an error naming the group and the member by group rank 1 and global rank 4.
/// Replica 0 and the partition groups go on working meanwhile.
fn dead_member_is_named(world: World, fate: Fate) {
    let deadline = Duration::from_millis(1500);
    let done = Barrier::new(6);
    let got = on_ranks(world, |mut t| {
        t.set_timeout(deadline);
        let me = t.rank();
        let (rep, mut part) = grid(&mut t, 2, 3).unwrap();
        assert_eq!(rep.timeout(), deadline);
        let mut rep = Some(rep);
        let mut out = None;
        if me == 4 {
            if let Fate::Dropped = fate {
                rep = None;
            }
        } else if me / 3 == 1 {
            let t0 = Instant::now();
            let err = rep.as_mut().unwrap().recv(1, &mut Vec::new()).unwrap_err();
            out = Some((err, t0.elapsed()));
        } else {
            traffic(rep.as_mut().unwrap(), b'R');
        }
        // The partition groups (rank 4's included) are untouched.
        traffic(&mut part, b'P');
        done.wait();
        drop(rep);
        out
    });
    for me in [3, 5] {
        let (err, took) = got[me].as_ref().unwrap();
        let text = err.to_string();
        assert_eq!(err.group(), Some("replica 1"), "{text}");
        assert_eq!(err.peer(), Some(1), "{text}");
        assert_eq!(err.global_peer(), Some(4), "{text}");
        assert!(
            text.starts_with("replica 1: rank 1 (global rank 4)"),
            "rank {me}: {text}"
        );
        match fate {
            Fate::Dropped => assert!(
                matches!(
                    err.ungrouped(),
                    Error::PeerClosed { peer: 1, .. } | Error::PeerFailed { peer: 1, .. }
                ),
                "{text}"
            ),
            Fate::Silent => match err.ungrouped() {
                Error::Timeout { peer: 1, .. } => {
                    assert!(*took >= deadline - Duration::from_millis(50), "{took:?}")
                }
                // Over TCP the first survivor to time out may tell the other.
                Error::PeerFailed { peer: 1, .. } => {}
                _ => panic!("rank {me}: {text}"),
            },
        }
        assert!(*took < deadline + Duration::from_secs(2), "took {took:?}");
    }
}

#[test]
fn local_dead_member_is_named_by_both_ranks_within_the_deadline() {
    dead_member_is_named(local(6), Fate::Dropped);
    dead_member_is_named(local(6), Fate::Silent);
}

#[test]
fn tcp_dead_member_is_named_by_both_ranks_within_the_deadline() {
    dead_member_is_named(tcp(6), Fate::Dropped);
    dead_member_is_named(tcp(6), Fate::Silent);
}

/// Over TCP a failure travels through the group: in replica 1, global rank 5 waits on the
/// dropped rank 4 and rank 3 waits on rank 5; rank 5 sees the close and tells rank 3, whose
/// error names rank 4 too, and who reported it.
#[test]
fn tcp_failure_in_a_group_reaches_every_member() {
    let got = on_ranks(tcp(6), |mut t| {
        t.set_timeout(Duration::from_secs(5));
        let me = t.rank();
        let (mut rep, _part) = grid(&mut t, 2, 3).unwrap();
        match me {
            4 => None,
            5 => Some(rep.recv(1, &mut Vec::new()).unwrap_err()),
            3 => Some(rep.recv(2, &mut Vec::new()).unwrap_err()),
            _ => {
                traffic(&mut rep, b'R');
                None
            }
        }
    });
    for me in [3, 5] {
        let err = got[me].as_ref().unwrap();
        assert_eq!(err.global_peer(), Some(4), "rank {me}: {err}");
        assert!(
            err.to_string().contains("rank 1 (global rank 4)"),
            "rank {me}: {err}"
        );
    }
    let e3 = got[3].as_ref().unwrap().to_string();
    assert!(
        e3.contains("reported by rank 2 (global rank 5)"),
        "rank 3: {e3}"
    );
}

/// A group splits again (global ranks compose), and a `Box<dyn Transport>` splits.
fn nested_split_composes_global_ranks(world: World) {
    let got = on_ranks(world, |mut t| {
        let me = t.rank() as u32;
        // Evens and odds, ordered backwards by key.
        let mut half = split(&mut t, me % 2, 10 - me).unwrap();
        // Within each half, pairs.
        let pair = half.rank() as u32 / 2;
        let mut quarter = split(&mut half, pair, 0).unwrap();
        let mut buf = Vec::new();
        let other = 1 - quarter.rank();
        quarter
            .send_recv(other, &[me as u8], other, &mut buf)
            .unwrap();
        (
            half.members().to_vec(),
            quarter.members().to_vec(),
            quarter.label().to_string(),
            buf[0],
        )
    });
    // Evens: keys 10, 8, 6, 4 for ranks 0, 2, 4, 6 -> group order 6, 4, 2, 0.
    assert_eq!(got[0].0, vec![6, 4, 2, 0]);
    assert_eq!(got[1].0, vec![7, 5, 3, 1]);
    assert_eq!(got[6].1, vec![6, 4]);
    assert_eq!(got[0].1, vec![2, 0]);
    assert_eq!(got[0].2, "group 1 of group 0");
    assert_eq!(got[6].3, 4);
    assert_eq!(got[0].3, 2);
    assert_eq!(got[1].3, 3);
}

#[test]
fn local_nested_split_composes_global_ranks() {
    nested_split_composes_global_ranks(local(8));
}

#[test]
fn tcp_nested_split_composes_global_ranks() {
    nested_split_composes_global_ranks(tcp(8));
}

#[test]
fn bad_grids_and_calls_out_of_step_are_typed_errors() {
    let mut w = local(1);
    assert!(matches!(
        grid(&mut w[0], 2, 1),
        Err(Error::BadGrid {
            world_size: 1,
            replicas: 2,
            partitions: 1
        })
    ));
    // A rank that sends a plain message where the other splits: named, not a panic.
    // Rank 1 stays until rank 0 is done (its messages to rank 1 must not fail).
    let done = Barrier::new(2);
    let got = on_ranks(local(2), |mut t| {
        if t.rank() == 1 {
            t.send(0, b"not an offer").unwrap();
            done.wait();
            return None;
        }
        let err = split(&mut t, 0, 0).unwrap_err();
        done.wait();
        Some(err)
    });
    let err = got[0].as_ref().unwrap();
    assert!(
        matches!(
            err,
            Error::BadSplit {
                peer: 1,
                source: OfferError::Short { len: 12 }
            }
        ),
        "{err}"
    );
    // A rank one split ahead of the other.
    let got = on_ranks(tcp(2), |mut t| {
        t.set_timeout(Duration::from_secs(2));
        if t.rank() == 1 {
            let mine = Offer {
                seq: 1,
                color: 0,
                key: 0,
                payload: &[],
            };
            let _ = t.send_recv(0, &mine.encode().unwrap(), 0, &mut Vec::new());
            return None;
        }
        Some(split(&mut t, 0, 0).unwrap_err())
    });
    let err = got[0].as_ref().unwrap();
    assert!(
        matches!(
            err,
            Error::BadSplit {
                peer: 1,
                source: OfferError::OutOfStep { ours: 0, theirs: 1 }
            }
        ),
        "{err}"
    );
}

#[test]
fn transports_that_cannot_split_say_so() {
    let ranks =
        crate::link::Throttled::wrap_all(Local::world(1), &"1gbit".parse().expect("a link spec"));
    let mut t = ranks.into_iter().next().unwrap();
    let err = split(&mut t, 0, 0).unwrap_err();
    assert!(matches!(err, Error::SplitUnsupported { .. }), "{err}");
}

/// The text of a group's errors: the group, then the peer by group and global rank.
#[test]
fn group_errors_name_both_ranks() {
    let members = [2, 3];
    let named = |e| super::group::name_error("partition group 1", &members, e);
    let e = named(Error::Timeout {
        peer: 0,
        op: Op::Recv,
        after: Duration::from_secs(2),
    });
    assert_eq!(
        e.to_string(),
        "partition group 1: rank 0 (global rank 2): timed out after 2s during receive (peer \
         dead or stalled?)"
    );
    assert_eq!((e.peer(), e.global_peer()), (Some(0), Some(2)));
    let e = named(Error::PeerFailed {
        peer: 1,
        reported_by: 0,
    });
    assert_eq!(
        e.to_string(),
        "partition group 1: rank 1 (global rank 3) failed (reported by rank 0 (global rank 2))"
    );
    let e = named(Error::Misuse { what: "x" });
    assert_eq!(
        e.to_string(),
        "partition group 1: transport used out of order: x"
    );
    assert_eq!(e.global_peer(), None);
    // Renumbering (as a collective's view does) keeps the global ranks.
    let e = named(Error::PeerClosed {
        peer: 1,
        op: Op::Send,
    })
    .map_ranks(|r| r + 10);
    assert_eq!((e.peer(), e.global_peer()), (Some(11), Some(3)));
}
