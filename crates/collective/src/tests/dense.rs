//! Dense collectives against the naive reference, every algorithm, worlds 1..=8, awkward
//! lengths, tiny and default segment sizes.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rand::{Rng, SeedableRng};

use super::{for_each_transport, run_world, WorldFactory};
use crate::{broadcast, gather, reference, Algorithm, Collectives, Element, ReduceOp};
use gradwire_transport::Transport;

const ALGOS: [Algorithm; 4] = [
    Algorithm::Auto,
    Algorithm::Ring,
    Algorithm::RecursiveDoubling,
    Algorithm::Rabenseifner,
];
const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max];
/// Tiny segments (forcing many per message) and the default.
const SEGS: [usize; 2] = [8, crate::select::DEFAULT_SEGMENT_BYTES];

fn rng(seed: u64, rank: usize, salt: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed ^ (rank as u64).wrapping_mul(0x9E37_79B9) ^ salt << 40)
}

/// Small integer-valued f32s: every summation order gives the same bits.
fn ints_f32(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut g = rng(seed, rank, 1);
    (0..len).map(|_| g.gen_range(-64i32..64) as f32).collect()
}
fn ints_i32(seed: u64, rank: usize, len: usize) -> Vec<i32> {
    let mut g = rng(seed, rank, 2);
    (0..len).map(|_| g.gen_range(-1000..1000)).collect()
}
fn floats_f64(seed: u64, rank: usize, len: usize) -> Vec<f64> {
    let mut g = rng(seed, rank, 3);
    (0..len).map(|_| g.gen_range(-1.0..1.0)).collect()
}
fn floats_f32(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut g = rng(seed, rank, 4);
    (0..len).map(|_| g.gen_range(-1.0f32..1.0)).collect()
}

fn all_inputs<E>(world: usize, f: impl Fn(usize) -> Vec<E>) -> Vec<Vec<E>> {
    (0..world).map(f).collect()
}

fn check<E: Element>(errs: &mut Vec<String>, what: &str, got: &[E], want: &[E]) {
    if got != want {
        errs.push(format!("{what}: got {got:?}, want {want:?}"));
    }
}

/// All-reduces this rank's input of `inputs` with `op` and checks it against the reference
/// (`what` names the case).
fn check_all_reduce<E: Element>(
    t: &mut dyn Transport,
    inputs: &[Vec<E>],
    (op, algo, seg): (ReduceOp, Algorithm, usize),
    errs: &mut Vec<String>,
    what: &str,
) {
    let mut b = inputs[t.rank()].clone();
    match crate::all_reduce(t, &mut b, op, algo, seg) {
        Ok(()) => check(errs, what, &b, &reference::all_reduce(inputs, op)),
        Err(e) => errs.push(format!("{what}: {e}")),
    }
}

fn check_close(errs: &mut Vec<String>, what: &str, got: &[f64], want: &[f64], tol: f64) {
    if got.len() != want.len() || got.iter().zip(want).any(|(a, b)| (a - b).abs() > tol) {
        errs.push(format!("{what}: got {got:?}, want {want:?}"));
    }
}

/// One rank's whole battery for (world, len, seed): returns its mismatches and the bits of
/// its float all-reduce results (which must agree across ranks).
fn battery(t: &mut dyn Transport, len: usize, seed: u64) -> (Vec<String>, Vec<Vec<u32>>) {
    let (rank, world) = (t.rank(), t.world_size());
    let mut errs = Vec::new();
    let mut bits = Vec::new();
    let in_f32 = all_inputs(world, |r| ints_f32(seed, r, len));
    let in_i32 = all_inputs(world, |r| ints_i32(seed, r, len));
    let in_f64 = all_inputs(world, |r| floats_f64(seed, r, len));
    for algo in ALGOS {
        for seg in SEGS {
            for op in OPS {
                let tag = format!("rank {rank}/{world} len {len} {algo} seg {seg} {op}");
                let how = (op, algo, seg);
                check_all_reduce(t, &in_f32, how, &mut errs, &format!("{tag} f32"));
                check_all_reduce(t, &in_i32, how, &mut errs, &format!("{tag} i32"));
            }
            let tag = format!("rank {rank}/{world} len {len} {algo} seg {seg}");
            let mut b = in_f64[rank].clone();
            match crate::all_reduce(t, &mut b, ReduceOp::Sum, algo, seg) {
                Ok(()) => check_close(
                    &mut errs,
                    &format!("{tag} f64"),
                    &b,
                    &reference::all_reduce(&in_f64, ReduceOp::Sum),
                    1e-9,
                ),
                Err(e) => errs.push(format!("{tag} f64: {e}")),
            }
            let mut b = floats_f32(seed, rank, len);
            match crate::all_reduce(t, &mut b, ReduceOp::Sum, algo, seg) {
                Ok(()) => bits.push(b.iter().map(|x| x.to_bits()).collect()),
                Err(e) => errs.push(format!("{tag} f32 floats: {e}")),
            }
            for op in [ReduceOp::Sum, ReduceOp::Mean] {
                let mut b = in_f32[rank].clone();
                match crate::reduce_scatter(t, &mut b, op, algo, seg) {
                    Ok(r) => {
                        if r != crate::chunks::range(len, world, rank) {
                            errs.push(format!("{tag} reduce_scatter range {r:?}"));
                        } else {
                            check(
                                &mut errs,
                                &format!("{tag} reduce_scatter {op}"),
                                &b[r],
                                &reference::reduce_scatter(&in_f32, op, rank),
                            );
                        }
                    }
                    Err(e) => errs.push(format!("{tag} reduce_scatter: {e}")),
                }
            }
            let mut b = in_i32[rank].clone();
            match crate::all_gather(t, &mut b, algo, seg) {
                Ok(()) => check(
                    &mut errs,
                    &format!("{tag} all_gather"),
                    &b,
                    &reference::all_gather(&in_i32),
                ),
                Err(e) => errs.push(format!("{tag} all_gather: {e}")),
            }
        }
    }
    for seg in SEGS {
        for root in [0, world - 1, world / 2] {
            let tag = format!("rank {rank}/{world} len {len} seg {seg} root {root}");
            let want = &in_f32[root];
            let mut b = in_f32[rank].clone();
            match broadcast::binomial(t, &mut b, root, seg) {
                Ok(()) => check(&mut errs, &format!("{tag} binomial"), &b, want),
                Err(e) => errs.push(format!("{tag} binomial: {e}")),
            }
            let mut b = in_f32[rank].clone();
            match broadcast::scatter_all_gather(t, &mut b, root, seg) {
                Ok(()) => check(&mut errs, &format!("{tag} scatter+allgather"), &b, want),
                Err(e) => errs.push(format!("{tag} scatter+allgather: {e}")),
            }
            let mut b = in_f32[rank].clone();
            match broadcast::broadcast(t, &mut b, root, seg) {
                Ok(()) => check(&mut errs, &format!("{tag} broadcast"), &b, want),
                Err(e) => errs.push(format!("{tag} broadcast: {e}")),
            }
            let payload = |r: usize| vec![r as u8; (len + r * 3) % 17];
            let mut b = if rank == root {
                payload(root)
            } else {
                vec![9; 3]
            };
            match broadcast::broadcast_bytes(t, &mut b, root, seg, 1 << 20) {
                Ok(()) => {
                    if b != payload(root) {
                        errs.push(format!("{tag} broadcast_bytes: {b:?}"));
                    }
                }
                Err(e) => errs.push(format!("{tag} broadcast_bytes: {e}")),
            }
        }
        let tag = format!("rank {rank}/{world} len {len} seg {seg}");
        let mut out = vec![0i32; len * world];
        match gather::all_gather_into(t, &in_i32[rank], &mut out, seg) {
            Ok(()) => check(
                &mut errs,
                &format!("{tag} all_gather_into"),
                &out,
                &reference::concat(&in_i32),
            ),
            Err(e) => errs.push(format!("{tag} all_gather_into: {e}")),
        }
    }
    // Variable-size payloads, reusing `out` across calls.
    let mut out = vec![vec![1u8; 5]; 2];
    for round in 0..2usize {
        let payload = |r: usize| -> Vec<u8> {
            (0..(len + 7 * r + round) % 23)
                .map(|i| (i + r) as u8)
                .collect()
        };
        match t.all_gather_bytes(&payload(rank), &mut out) {
            Ok(()) => {
                let want: Vec<Vec<u8>> = (0..world).map(payload).collect();
                if out != want {
                    errs.push(format!("rank {rank}/{world} all_gather_bytes: {out:?}"));
                }
            }
            Err(e) => errs.push(format!("all_gather_bytes: {e}")),
        }
    }
    if let Err(e) = t.barrier() {
        errs.push(format!("barrier: {e}"));
    }
    (errs, bits)
}

fn len_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        prop::sample::select(vec![0usize, 1, 2, 3, 5, 7, 13, 31, 97, 1000]),
        0usize..12,
    ]
}

fn all_collectives_match_reference(factory: &WorldFactory) {
    let mut runner = TestRunner::new(Config {
        cases: 40,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(1usize..=8, len_strategy(), any::<u64>()),
            |(world, len, seed)| {
                let results = run_world(factory(world), |t| battery(t, len, seed));
                let errs: Vec<&String> = results.iter().flat_map(|(e, _)| e).collect();
                prop_assert!(
                    errs.is_empty(),
                    "{} mismatches, first: {:?}",
                    errs.len(),
                    errs.iter().take(3).collect::<Vec<_>>()
                );
                for (r, (_, bits)) in results.iter().enumerate() {
                    prop_assert_eq!(
                        bits,
                        &results[0].1,
                        "rank {} float results differ from rank 0",
                        r
                    );
                }
                Ok(())
            },
        )
        .unwrap();
}
for_each_transport!(matches_reference, all_collectives_match_reference);

/// Sizes past the auto thresholds, through the public trait (default segments).
fn large_messages_through_trait(factory: &WorldFactory) {
    for world in [3usize, 4] {
        for len in [20_000usize, 300_001] {
            let inputs = all_inputs(world, |r| ints_f32(7, r, len));
            let want = reference::all_reduce(&inputs, ReduceOp::Sum);
            let inputs = &inputs;
            let res = run_world(factory(world), |t| {
                let r = t.rank();
                let mut b = inputs[r].clone();
                t.all_reduce(&mut b, ReduceOp::Sum).unwrap();
                let mut c = inputs[r].clone();
                t.broadcast(&mut c, world - 1).unwrap();
                let mut d = inputs[r].clone();
                let mine = t.reduce_scatter(&mut d, ReduceOp::Max).unwrap();
                d[mine.clone()].copy_from_slice(&reference::reduce_scatter(
                    inputs,
                    ReduceOp::Max,
                    r,
                ));
                t.all_gather(&mut d).unwrap();
                (
                    b,
                    c == inputs[world - 1],
                    d == reference::all_reduce(inputs, ReduceOp::Max),
                )
            });
            for (b, bc, ag) in res {
                assert!(b == want && bc && ag, "world {world} len {len}");
            }
        }
    }
}
for_each_transport!(large_messages, large_messages_through_trait);

/// Errors name the rank and do not hang.
fn errors_are_reported(factory: &WorldFactory) {
    // Bad root.
    let res = run_world(factory(2), |t| {
        t.broadcast(&mut [1.0f32], 5).unwrap_err().to_string()
    });
    assert!(res.iter().all(|e| e.contains("root 5")), "{res:?}");
    // Ranks disagree on the length: every algorithm fails (no hang) naming a rank.
    for algo in [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::Rabenseifner,
    ] {
        let res = run_world(factory(3), |t| {
            let mut b = vec![1i32; 10 + t.rank()];
            t.all_reduce_with(&mut b, ReduceOp::Sum, algo)
        });
        let errs: Vec<_> = res.into_iter().filter_map(|r| r.err()).collect();
        assert!(!errs.is_empty(), "{algo}: mismatch went unnoticed");
        assert!(errs.iter().all(|e| e.peer().is_some()), "{algo}: {errs:?}");
    }
    // all_gather_into checks its output length.
    let res = run_world(factory(1), |t| {
        t.all_gather_into(&[1.0f32; 3], &mut [0.0; 2])
            .unwrap_err()
            .to_string()
    });
    assert!(res[0].contains("needs 3"), "{res:?}");
}
for_each_transport!(errors, errors_are_reported);

/// Compile-time guard: the collectives are usable on `Box<dyn Transport>` and `dyn Transport`.
#[test]
fn works_on_trait_objects() {
    let mut w = super::local_world(1);
    let t: &mut Box<dyn Transport> = &mut w[0];
    let mut b = [1.0f32, 2.0];
    t.all_reduce(&mut b, ReduceOp::Mean).unwrap();
    let d: &mut dyn Transport = &mut **t;
    d.all_reduce(&mut b, ReduceOp::Sum).unwrap();
    assert_eq!(b, [1.0, 2.0]);
}
