//! The hierarchical all-reduce against a naive reference, with ranks declared on hosts:
//! shared memory within a host, the job's transport (a [`Group`] of the leaders) across.

use std::time::Duration;

use gradwire_transport::local::Local;
use gradwire_transport::shm::{self, Shm};
use gradwire_transport::Transport;

use crate::hierarchical::{exchange_layout, Group, Hierarchy, Layout};
use crate::{Error, ReduceOp};

/// Rank `r`'s input: small integers, so every order of summation is exact.
fn input(r: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((r * 7 + i * 13) % 17) as f32 - 8.0)
        .collect()
}

/// The naive reduction of every rank's input, written out element by element.
fn reference(n: usize, len: usize, op: ReduceOp) -> Vec<f32> {
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, len)).collect();
    (0..len)
        .map(|i| {
            let col = inputs.iter().map(|x| x[i]);
            match op {
                ReduceOp::Sum => col.sum(),
                ReduceOp::Mean => col.sum::<f32>() / n as f32,
                ReduceOp::Max => col.fold(f32::NEG_INFINITY, f32::max),
                ReduceOp::Min => col.fold(f32::INFINITY, f32::min),
            }
        })
        .collect()
}

/// Runs `f` on every rank of a job whose rank `r` is on host `hosts[r]`: each gets the
/// job's transport (a `Local` world, standing in for the network) and its host's shared
/// memory transport, with its rank in it.
fn run_hosts<R: Send>(hosts: &[&str], f: impl Fn(usize, Local, Shm) -> R + Sync) -> Vec<R> {
    let layout = Layout::from_hosts(hosts);
    let n = hosts.len();
    let mut locals: Vec<Option<Shm>> = (0..n).map(|_| None).collect();
    for ranks in layout.hosts() {
        for (shm, &r) in shm::local_world(ranks.len(), 16 << 10)
            .expect("shm world")
            .into_iter()
            .zip(ranks)
        {
            locals[r] = Some(shm);
        }
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = Local::world(n)
            .into_iter()
            .zip(locals)
            .enumerate()
            .map(|(r, (mut t, local))| {
                let f = &f;
                s.spawn(move || {
                    let mut local = local.expect("every rank has a host");
                    t.set_timeout(Duration::from_secs(20));
                    local.set_timeout(Duration::from_secs(20));
                    f(r, t, local)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// One rank's hierarchical all-reduce of its input.
fn rank_all_reduce(
    layout: &Layout,
    r: usize,
    mut t: Local,
    local: Shm,
    len: usize,
    op: ReduceOp,
) -> crate::Result<Vec<f32>> {
    let leaders = layout.leaders();
    let mut h = Hierarchy {
        local,
        cross: Group::new(&mut t, leaders.clone()),
        local_ranks: layout.host_of(r).expect("rank in layout").to_vec(),
        leader_ranks: leaders,
        world: layout.world_size(),
    };
    let mut buf = input(r, len);
    h.all_reduce(&mut buf, op)?;
    Ok(buf)
}

#[test]
fn layout_groups_ranks_by_host() {
    let l = Layout::from_hosts(&["a", "b", "a", "c", "b"]);
    assert_eq!(l.hosts(), &[vec![0, 2], vec![1, 4], vec![3]]);
    assert_eq!(l.leaders(), vec![0, 1, 3]);
    assert_eq!(l.host_of(4), Some(&[1, 4][..]));
    assert_eq!(l.world_size(), 5);
    assert!(l.is_hierarchical());
    assert!(!Layout::from_hosts(&["a", "a", "a"]).is_hierarchical());
    assert!(!Layout::from_hosts(&["a", "b", "c"]).is_hierarchical());
}

#[test]
fn ranks_agree_on_the_exchanged_layout() {
    let hosts = ["n1", "n2", "n1", "n2", "n3"];
    let got = std::thread::scope(|s| {
        let hs: Vec<_> = Local::world(hosts.len())
            .into_iter()
            .map(|mut t| {
                s.spawn(move || {
                    let me = t.rank();
                    exchange_layout(&mut t, hosts[me]).unwrap()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for l in &got {
        assert_eq!(l.hosts(), &[vec![0, 2], vec![1, 3], vec![4]]);
    }
    let long = "h".repeat(300);
    let errs = std::thread::scope(|s| {
        let hs: Vec<_> = Local::world(2)
            .into_iter()
            .map(|mut t| {
                let name = if t.rank() == 1 {
                    long.clone()
                } else {
                    "a".into()
                };
                s.spawn(move || exchange_layout(&mut t, &name).map(|_| ()))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(
        matches!(errs[1], Err(Error::Malformed { peer: 1, .. })),
        "{errs:?}"
    );
}

#[test]
fn matches_the_naive_reference_on_declared_hosts() {
    let layouts: [&[&str]; 5] = [
        &["a", "a", "b", "b", "b", "c"],
        &["a", "b", "a", "b"],
        &["a", "a", "a"],
        &["a", "b", "c"],
        &["x", "y", "y", "x", "y", "z", "x"],
    ];
    for hosts in layouts {
        let layout = Layout::from_hosts(hosts);
        let n = hosts.len();
        for len in [0, 1, 5, 1000, 70_001] {
            for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
                let want = reference(n, len, op);
                let got = run_hosts(hosts, |r, t, local| {
                    rank_all_reduce(&layout, r, t, local, len, op)
                });
                for (r, g) in got.into_iter().enumerate() {
                    let g = g.unwrap_or_else(|e| panic!("{hosts:?} len {len} {op}: rank {r}: {e}"));
                    assert_eq!(g.len(), len);
                    for (i, (a, b)) in g.iter().zip(&want).enumerate() {
                        let ok = if op == ReduceOp::Mean {
                            (a - b).abs() <= 1e-6 * b.abs().max(1.0)
                        } else {
                            a == b
                        };
                        assert!(
                            ok,
                            "{hosts:?} len {len} {op}: rank {r} [{i}] = {a}, want {b}"
                        );
                    }
                }
            }
        }
    }
}

/// A host's leader that leaves: its own host's rank and the other leader both name it by
/// its job rank (the local transport numbers it 0, the leaders' group 1).
#[test]
fn a_leader_that_leaves_is_named_by_its_job_rank() {
    let hosts = ["a", "a", "b", "b"];
    let layout = Layout::from_hosts(&hosts);
    let got = run_hosts(&hosts, |r, t, local| {
        if r == 2 {
            drop((t, local));
            return None;
        }
        Some(rank_all_reduce(
            &layout,
            r,
            t,
            local,
            100_000,
            ReduceOp::Sum,
        ))
    });
    for r in [0, 3] {
        match &got[r] {
            Some(Err(e)) => assert_eq!(e.peer(), Some(2), "rank {r}: {e}"),
            other => panic!("rank {r}: expected an error naming rank 2, got {other:?}"),
        }
    }
}

/// The received host names are untrusted: seeded garbage (invalid UTF-8, names over the
/// limit, empty names) never panics, and a layout that decodes places every rank once (the
/// same entry the `host_layout` fuzz target drives).
#[test]
fn received_host_names_are_decoded_totally() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    for _ in 0..2000 {
        let len = rng.gen_range(0..600);
        let data: Vec<u8> = (0..len)
            .map(|_| match rng.gen_range(0..4) {
                0 => 0,
                1 => rng.gen(),
                _ => rng.gen_range(b'a'..=b'c'),
            })
            .collect();
        check_layout(&data);
    }
    check_layout(&[0xff, 0xfe]);
    check_layout(&[b'a'; 300]);
}

/// `data` split at zero bytes is every rank's host name as received: a layout that decodes
/// places every rank exactly once, and names its leaders among the ranks.
fn check_layout(data: &[u8]) {
    let all: Vec<Vec<u8>> = data.split(|b| *b == 0).map(<[u8]>::to_vec).collect();
    let n = all.len();
    if let Ok(layout) = crate::hierarchical::layout_from_gathered(all) {
        assert_eq!(layout.world_size(), n);
        for r in 0..n {
            assert!(layout.host_of(r).is_some_and(|h| h.contains(&r)));
        }
        assert!(layout.leaders().iter().all(|&l| l < n));
    }
}
