//! Negotiation: submission order, mismatches, stalls, dead ranks, shutdown, handles.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::{bits, grad, naive_mean, world, Killable};
use crate::{Engine, EngineConfig, Error, TensorSpec};

fn specs(lens: &[usize]) -> Vec<TensorSpec> {
    lens.iter()
        .enumerate()
        .map(|(i, &n)| TensorSpec::new(format!("t{i}"), [n]))
        .collect()
}

#[test]
fn random_submission_order_still_agrees() {
    let lens = [1, 7, 300, 2, 1000, 33, 64, 5, 129, 4096, 3, 17];
    let tensors = specs(&lens);
    let n = 4;
    let steps = 3;
    let got = world(n, |t| {
        let rank = gradwire_transport::Transport::rank(&t);
        let e = Engine::start(t, EngineConfig::default(), &tensors).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(rank as u64 + 7);
        let mut out = vec![Vec::new(); steps];
        for (step, out) in out.iter_mut().enumerate() {
            let mut order: Vec<usize> = (0..lens.len()).collect();
            order.shuffle(&mut rng);
            let mut hs: Vec<(usize, crate::Handle)> = order
                .iter()
                .map(|&i| {
                    (
                        i,
                        e.all_reduce(&format!("t{i}"), grad(rank, step, i, lens[i])),
                    )
                })
                .collect();
            hs.shuffle(&mut rng);
            let mut res = vec![Vec::new(); lens.len()];
            for (i, h) in hs {
                res[i] = h.wait().unwrap();
            }
            *out = res;
        }
        e.shutdown().unwrap();
        out
    });
    for step in 0..steps {
        for (i, &len) in lens.iter().enumerate() {
            let inputs: Vec<Vec<f32>> = (0..n).map(|r| grad(r, step, i, len)).collect();
            let want = bits(&naive_mean(&inputs));
            for (r, g) in got.iter().enumerate() {
                assert_eq!(bits(&g[step][i]), want, "step {step} tensor {i} rank {r}");
            }
        }
    }
}

#[test]
fn handles_complete_when_waited_in_any_order() {
    let tensors = specs(&[10; 20]);
    world(3, |t| {
        let e = Engine::start(t, EngineConfig::default(), &tensors).unwrap();
        let mut hs: Vec<_> = (0..20)
            .map(|i| e.all_reduce(&format!("t{i}"), vec![i as f32; 10]))
            .collect();
        // Poll one with test() until done, then wait the rest back to front.
        let first = hs.remove(7);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !first.test() {
            assert!(Instant::now() < deadline, "test() never turned true");
            std::thread::yield_now();
        }
        assert_eq!(first.wait().unwrap(), vec![7.0; 10]);
        for (k, h) in hs.into_iter().enumerate().rev() {
            let i = if k >= 7 { k + 1 } else { k };
            assert_eq!(h.wait().unwrap(), vec![i as f32; 10]);
        }
        e.shutdown().unwrap();
    });
}

#[test]
fn registration_mismatch_names_tensor_and_ranks() {
    let cases: [(&str, usize, &str); 4] = [
        ("shape", 1, "fc.w"),
        ("name", 2, "fc.w"),
        ("codec", 1, "b"),
        ("role", 2, "fc.w"),
    ];
    for (field, odd, tensor) in cases {
        let t0 = Instant::now();
        let errs = world(3, |t| {
            let rank = gradwire_transport::Transport::rank(&t);
            let mut tensors = vec![TensorSpec::new("b", [4]), TensorSpec::new("fc.w", [3, 4])];
            let mut cfg = EngineConfig::default();
            if rank == odd {
                match field {
                    "shape" => tensors[1].shape = vec![4, 3],
                    "name" => tensors[1].name = "fc.weight".into(),
                    "role" => tensors[1].role = crate::TensorRole::Output,
                    _ => cfg.codec = "topk:ratio=0.5".parse().unwrap(),
                }
            }
            Engine::start(t, cfg, &tensors).unwrap_err()
        });
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "{field}: took {:?}",
            t0.elapsed()
        );
        for e in errs {
            match e {
                Error::Mismatch {
                    tensor: t,
                    field: f,
                    ranks,
                    ..
                } => {
                    assert_eq!((t.as_str(), f, ranks), (tensor, field, vec![odd]));
                }
                other => panic!("{field}: {other}"),
            }
        }
    }
}

#[test]
fn unregistered_shape_mismatch_is_named_within_two_seconds() {
    let t0 = Instant::now();
    let errs = world(3, |t| {
        let rank = gradwire_transport::Transport::rank(&t);
        let e = Engine::start(t, EngineConfig::default(), &[]).unwrap();
        let len = if rank == 2 { 3 } else { 2 };
        let err = e.all_reduce("loss", vec![1.0; len]).wait().unwrap_err();
        // The engine keeps working after a mismatch.
        assert_eq!(
            e.all_reduce("ok", vec![rank as f32]).wait().unwrap(),
            vec![1.0]
        );
        e.shutdown().unwrap();
        err
    });
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t0.elapsed()
    );
    for e in errs {
        assert!(
            matches!(&e, Error::Mismatch { tensor, field: "shape", ranks, .. } if tensor == "loss" && ranks == &vec![2]),
            "{e}"
        );
    }
}

#[test]
fn tensor_missing_on_one_rank_gives_stall_warning() {
    let cfg = EngineConfig {
        stall_warning: Some(Duration::from_millis(50)),
        ..Default::default()
    };
    let tensors = specs(&[4, 4]);
    let reports = world(3, |t| {
        let rank = gradwire_transport::Transport::rank(&t);
        let e = Engine::start(t, cfg.clone(), &tensors).unwrap();
        let a = e.all_reduce("t0", vec![1.0; 4]);
        let b = if rank != 2 {
            Some(e.all_reduce("t1", vec![1.0; 4]))
        } else {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !e.stall_reports().iter().any(|r| r.tensor == "t1") {
                assert!(Instant::now() < deadline, "no stall report");
                std::thread::sleep(Duration::from_millis(5));
            }
            Some(e.all_reduce("t1", vec![1.0; 4]))
        };
        a.wait().unwrap();
        b.unwrap().wait().unwrap();
        let r = e.stall_reports();
        e.shutdown().unwrap();
        r
    });
    for r in reports {
        // (t0 may be reported too on a very loaded machine: it was submitted by all ranks,
        // but not necessarily within 50 ms of each other.)
        let t1: Vec<_> = r.iter().filter(|r| r.tensor == "t1").collect();
        assert_eq!(t1.len(), 1, "{r:?}");
        assert_eq!(t1[0].missing_ranks, vec![2]);
        assert_eq!(t1[0].ready_ranks, vec![0, 1]);
    }
}

#[test]
fn stall_abort_fails_every_rank_with_the_tensor_named() {
    let cfg = EngineConfig {
        stall_warning: Some(Duration::from_millis(20)),
        stall_abort: Some(Duration::from_millis(100)),
        ..Default::default()
    };
    let tensors = specs(&[4]);
    let errs = world(2, |t| {
        let rank = gradwire_transport::Transport::rank(&t);
        let e = Engine::start(t, cfg.clone(), &tensors).unwrap();
        if rank == 0 {
            e.all_reduce("t0", vec![1.0; 4]).wait().unwrap_err()
        } else {
            e.shutdown().err().expect("the engine stalled")
        }
    });
    for e in errs {
        assert!(
            matches!(&e, Error::Stalled { tensor, missing_ranks, .. } if tensor == "t0" && missing_ranks == &vec![1]),
            "{e}"
        );
    }
}

#[test]
fn dead_rank_is_named_not_a_hang() {
    let t0 = Instant::now();
    let errs = world(2, |t| {
        let rank = gradwire_transport::Transport::rank(&t);
        let kill = Arc::new(AtomicBool::new(false));
        let e = Engine::start(
            Killable::new(t, kill.clone()),
            EngineConfig::default(),
            &specs(&[8]),
        )
        .unwrap();
        if rank == 1 {
            kill.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = e.shutdown();
            None
        } else {
            let err = e.all_reduce("t0", vec![1.0; 8]).wait().unwrap_err();
            // Later submissions fail at once with the same error.
            let again = e.all_reduce("t0", vec![1.0; 8]).wait().unwrap_err();
            assert_eq!(again.peer(), Some(1));
            Some(err)
        }
    });
    let err = errs[0].clone().unwrap();
    assert_eq!(err.peer(), Some(1), "{err}");
    assert!(err.to_string().contains("rank 1"), "{err}");
    assert!(
        t0.elapsed() < Duration::from_secs(9),
        "took {:?}",
        t0.elapsed()
    );
}

#[test]
fn dead_rank_in_a_larger_world_fails_every_pending_handle() {
    let errs = world(3, |t| {
        let rank = gradwire_transport::Transport::rank(&t);
        let kill = Arc::new(AtomicBool::new(false));
        let e = Engine::start(
            Killable::new(t, kill.clone()),
            EngineConfig::default(),
            &specs(&[8, 8]),
        )
        .unwrap();
        if rank == 2 {
            kill.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = e.shutdown();
            return vec![];
        }
        let hs = [
            e.all_reduce("t0", vec![1.0; 8]),
            e.all_reduce("t1", vec![1.0; 8]),
        ];
        hs.into_iter().map(|h| h.wait().unwrap_err()).collect()
    });
    for e in errs.into_iter().flatten() {
        assert!(e.peer().is_some(), "{e}");
    }
}

/// The same with a flushed batch: the waiting thread runs the cycle itself (and, with the
/// registered dense tensors, the speculative round); the failure still reaches every handle,
/// later submissions fail at once, and shutdown reports the error.
#[test]
fn dead_rank_fails_handles_of_a_cycle_the_waiting_thread_runs() {
    let errs = world(3, |t| {
        let rank = gradwire_transport::Transport::rank(&t);
        let kill = Arc::new(AtomicBool::new(false));
        let e = Engine::start(
            Killable::new(t, kill.clone()),
            EngineConfig::default(),
            &specs(&[8, 8]),
        )
        .unwrap();
        let batch = || {
            vec![
                ("t0".to_string(), vec![1.0; 8]),
                ("t1".to_string(), vec![1.0; 8]),
            ]
        };
        // One good step first (steady state), then rank 2 dies.
        for h in e.all_reduce_batch(batch()) {
            assert_eq!(h.wait().unwrap(), vec![1.0; 8]);
        }
        if rank == 2 {
            kill.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = e.shutdown();
            return vec![];
        }
        let mut errs: Vec<Error> = e
            .all_reduce_batch(batch())
            .into_iter()
            .map(|h| h.wait().unwrap_err())
            .collect();
        errs.push(e.all_reduce("t0", vec![1.0; 8]).wait().unwrap_err());
        errs.push(e.shutdown().err().expect("shutdown reports the failure"));
        errs
    });
    for (r, es) in errs.iter().enumerate().take(2) {
        assert_eq!(es.len(), 4, "rank {r}");
        for e in es {
            assert!(e.peer().is_some(), "rank {r}: {e}");
        }
    }
}

#[test]
fn shutdown_fails_what_others_never_submitted_and_drop_does_not_hang() {
    let errs = world(2, |t| {
        let rank = gradwire_transport::Transport::rank(&t);
        let e = Engine::start(t, EngineConfig::default(), &specs(&[3])).unwrap();
        let h = (rank == 0).then(|| e.all_reduce("t0", vec![1.0; 3]));
        let done = e.all_reduce("x", vec![1.0]).wait().unwrap();
        assert_eq!(done, vec![1.0]);
        let t = e.shutdown().unwrap();
        // The transport comes back usable: a fresh engine on it, dropped without shutdown.
        let e2 = Engine::start(t, EngineConfig::default(), &[]).unwrap();
        assert_eq!(e2.all_reduce("y", vec![2.0]).wait().unwrap(), vec![2.0]);
        drop(e2);
        h.map(|h| h.wait().unwrap_err())
    });
    assert!(
        matches!(&errs[0], Some(Error::NotSubmittedEverywhere { tensor, missing_ranks }) if tensor == "t0" && missing_ranks == &vec![1]),
        "{:?}",
        errs[0]
    );
}

#[test]
fn all_gather_and_broadcast() {
    let out = world(3, |t| {
        let rank = gradwire_transport::Transport::rank(&t);
        let e = Engine::start(t, EngineConfig::default(), &specs(&[2])).unwrap();
        let g = e.all_gather("g", vec![rank as f32; rank + 1]);
        let b = e.broadcast("p", vec![rank as f32 + 0.5; 4], 2);
        let b2 = e.broadcast("q", vec![rank as f32; 2], 2);
        let bad = e.broadcast("t0", vec![0.0; 2], 0).wait().unwrap_err();
        assert!(matches!(bad, Error::InvalidSetting { field: "op", .. }));
        let r = (g.wait().unwrap(), b.wait().unwrap(), b2.wait().unwrap());
        e.shutdown().unwrap();
        r
    });
    for (g, b, b2) in out {
        assert_eq!(g, vec![0.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
        assert_eq!(b, vec![2.5; 4]);
        assert_eq!(b2, vec![2.0; 2]);
    }
}

#[test]
fn local_errors_at_submission() {
    world(2, |t| {
        let e = Engine::start(t, EngineConfig::default(), &specs(&[3])).unwrap();
        let bad = e.all_reduce("t0", vec![1.0; 4]);
        assert!(bad.test());
        assert!(matches!(
            bad.wait(),
            Err(Error::LengthMismatch {
                expected: 3,
                got: 4,
                ..
            })
        ));
        let ok = e.all_reduce("t0", vec![1.0; 3]);
        assert_eq!(ok.wait().unwrap(), vec![1.0; 3]);
        e.shutdown().unwrap();
    });
    let err = Engine::start(
        gradwire_transport::local::Local::world(1).remove(0),
        EngineConfig {
            codec: "qsgd".parse().unwrap(),
            strategy: crate::Strategy::Sparse,
            ..Default::default()
        },
        &specs(&[3]),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Incompatible { .. }), "{err}");
}

/// A barrier completes on no rank before the last rank has called it, moves no data, and
/// counts no training step; the same name as another operation on another rank is a
/// mismatch, named.
#[test]
fn barrier_waits_for_the_last_rank() {
    let tensors = specs(&[10]);
    let n = 4;
    let got = world(n, |t| {
        let rank = gradwire_transport::Transport::rank(&t);
        let e = Engine::start(t, EngineConfig::default(), &tensors).unwrap();
        let mut times = Vec::new();
        for round in 0..3 {
            if rank == (round + 1) % n {
                std::thread::sleep(Duration::from_millis(40));
            }
            let called = Instant::now();
            let out = e.barrier("sync").wait().unwrap();
            times.push((called, Instant::now()));
            assert!(out.is_empty());
        }
        let mismatch = if rank == 0 {
            e.all_gather("odd", vec![1.0])
        } else {
            e.barrier("odd")
        }
        .wait();
        let st = e.stats();
        e.shutdown().unwrap();
        (times, mismatch, st)
    });
    for round in 0..3 {
        let last_called = got.iter().map(|g| g.0[round].0).max().unwrap();
        for (r, g) in got.iter().enumerate() {
            assert!(
                g.0[round].1 >= last_called,
                "round {round}: rank {r} left the barrier before the last rank called it"
            );
        }
    }
    for (r, (_, mismatch, st)) in got.iter().enumerate() {
        assert!(
            matches!(mismatch, Err(Error::Mismatch { tensor, .. }) if tensor == "odd"),
            "rank {r}: {mismatch:?}"
        );
        assert!(st.steps.is_empty(), "rank {r}: a barrier counted as a step");
        assert_eq!(st.bytes.other_bytes, 0, "rank {r}: a barrier moved data");
    }
}

/// Registered tensors' handle slots are reused between steps: a completed handle kept past
/// the next step's submission keeps its own result, and a handle dropped unwaited leaves its
/// slot to the next step without leaking its result into it.
#[test]
fn kept_and_dropped_handles_do_not_share_results_across_steps() {
    let tensors = specs(&[4; 3]);
    world(2, |t| {
        let e = Engine::start(t, EngineConfig::default(), &tensors).unwrap();
        let step = |k: f32| {
            e.all_reduce_batch_unflushed((0..3).map(|i| (format!("t{i}"), vec![k + i as f32; 4])))
        };
        let mut first = step(1.0);
        let kept = first.remove(1);
        for h in first {
            h.wait().unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !kept.test() {
            assert!(Instant::now() < deadline, "the kept handle never completed");
            std::thread::yield_now();
        }
        let second: Vec<Vec<f32>> = step(10.0).into_iter().map(|h| h.wait().unwrap()).collect();
        assert_eq!(second, vec![vec![10.0; 4], vec![11.0; 4], vec![12.0; 4]]);
        assert_eq!(
            kept.wait().unwrap(),
            vec![2.0; 4],
            "step 1's t1, not step 2's"
        );

        let mut third = step(20.0);
        drop(third.remove(0));
        for h in third {
            h.wait().unwrap();
        }
        let fourth: Vec<Vec<f32>> = step(30.0).into_iter().map(|h| h.wait().unwrap()).collect();
        assert_eq!(fourth, vec![vec![30.0; 4], vec![31.0; 4], vec![32.0; 4]]);
        e.shutdown().unwrap();
    });
}
