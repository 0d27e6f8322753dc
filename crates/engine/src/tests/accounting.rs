//! Byte accounting, stragglers, the timeline, momentum correction, the bench.

use std::time::Duration;

use gradwire_transport::Transport;

use super::{grad, world};
use crate::{Engine, EngineConfig, MomentumConfig, Phase, Strategy, TensorSpec};

#[test]
fn dense_wire_bytes_are_exact() {
    for n in [2usize, 4] {
        let stats = world(n, |t| {
            let e =
                Engine::start(t, EngineConfig::default(), &[TensorSpec::new("w", [1000])]).unwrap();
            e.set_progress(5, 0.0);
            e.all_reduce("w", vec![1.0; 1000]).wait().unwrap();
            let s = e.stats();
            e.shutdown().unwrap();
            s
        });
        for s in stats {
            // Reduce-scatter: P-1 chunks of 1000/P floats out; ring all-gather: the same.
            let want = 2 * (n as u64 - 1) * (1000 / n as u64) * 4;
            assert_eq!(s.steps.len(), 1);
            assert_eq!(s.steps[0].step, 5);
            assert_eq!(s.steps[0].raw_bytes, 4000);
            assert_eq!(s.steps[0].wire_bytes, want);
            assert_eq!(s.bytes.wire_bytes, want);
            let ratio = s.steps[0].compression_ratio().unwrap();
            assert!((ratio - 4000.0 / want as f64).abs() < 1e-12);
            assert!(s.bytes.negotiation_bytes > 0);
            assert!(s.cycles >= 1);
        }
    }
}

#[test]
fn straggler_is_the_rank_that_submitted_last() {
    let stats = world(2, |t| {
        let rank = t.rank();
        let e = Engine::start(t, EngineConfig::default(), &[TensorSpec::new("w", [4])]).unwrap();
        if rank == 1 {
            std::thread::sleep(Duration::from_millis(200));
        }
        e.all_reduce("w", vec![1.0; 4]).wait().unwrap();
        let s = e.stats();
        e.shutdown().unwrap();
        s.stragglers
    });
    for s in stats {
        assert_eq!(s.collectives, 1);
        assert_eq!(s.last_count, vec![0, 1]);
        assert!(s.max_lag_us >= 150_000, "{s:?}");
        assert_eq!(s.recent[0].tensor, "w");
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("last_count"));
    }
}

#[test]
fn timeline_has_every_phase_and_merges() {
    let dir = std::env::temp_dir().join(format!("gradwire-engine-tl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = EngineConfig {
        timeline: true,
        codec: "qsgd".parse().unwrap(),
        // Gather has separate encode / decode phases (stripe's are inside its all-reduce).
        strategy: crate::Strategy::Gather,
        ..Default::default()
    };
    let tensors = vec![TensorSpec::new("a", [50]), TensorSpec::new("b", [70])];
    let files = world(2, |t| {
        let rank = t.rank();
        let e = Engine::start(t, cfg.clone(), &tensors).unwrap();
        let h = [
            e.all_reduce("a", vec![1.0; 50]),
            e.all_reduce("b", vec![2.0; 70]),
        ];
        for h in h {
            h.wait().unwrap();
        }
        let t0 = crate::now_us();
        e.record_span("step", Phase::Update, t0, t0 + 5);
        let phases: Vec<Phase> = e.timeline().iter().map(|s| s.phase).collect();
        for p in [
            Phase::Negotiate,
            Phase::Queue,
            Phase::Fuse,
            Phase::Encode,
            Phase::Wire,
            Phase::Decode,
            Phase::Update,
        ] {
            assert!(phases.contains(&p), "{p:?} missing from {phases:?}");
        }
        let path = dir.join(format!("rank{rank}.json"));
        e.write_timeline(&path).unwrap();
        e.shutdown().unwrap();
        path
    });
    let out = dir.join("merged.json");
    let inputs: Vec<&std::path::Path> = files.iter().map(|p| p.as_path()).collect();
    crate::merge_traces(&inputs, &out).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    for pid in [0u64, 1] {
        assert!(ev.iter().any(|e| e["ph"] == "X"
            && e["pid"] == pid
            && e["name"] == "WIRE"
            && e["args"]["tensor"] == "b"));
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn momentum_correction_reduces_velocities() {
    let beta = 0.875f32;
    let len = 37;
    let cfg = EngineConfig {
        momentum: Some(MomentumConfig {
            beta,
            nesterov: false,
            masking: true,
        }),
        ..Default::default()
    };
    let got = world(3, |t| {
        let rank = t.rank();
        let e = Engine::start(t, cfg.clone(), &[TensorSpec::new("w", [len])]).unwrap();
        let out: Vec<Vec<f32>> = (0..4)
            .map(|step| e.all_reduce("w", grad(rank, step, 0, len)).wait().unwrap())
            .collect();
        e.shutdown().unwrap();
        out
    });
    // SGD momentum on the averaged gradient: buf = beta buf + mean(g).
    let mut buf = vec![0f32; len];
    for step in 0..4 {
        for (i, b) in buf.iter_mut().enumerate() {
            let mean = (0..3).map(|r| grad(r, step, 0, len)[i]).sum::<f32>() / 3.0;
            *b = beta * *b + mean;
        }
        for g in &got {
            for (v, w) in g[step].iter().zip(&buf) {
                assert!(
                    (v - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "step {step}: {v} vs {w}"
                );
            }
        }
    }
}

/// Momentum correction with momentum factor masking (DGC section 3.2) through the engine
/// equals a naive reimplementation over several steps, for top-k under the sparse strategy
/// and Strom's threshold under gather: per rank `u = beta u + g`, the codec's own error
/// feedback on `u`, then `u = 0` where this rank sent.
#[test]
fn momentum_masking_matches_a_naive_reimplementation() {
    let (beta, len, n, steps) = (0.75f32, 60usize, 3usize, 6usize);
    // Distinct magnitudes, so top-k has no ties at its cut.
    let g = |rank: usize, step: usize| -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + rank * 104_729 + step * 1_299_709) as f32) * 0.618_034).sin())
            .collect()
    };
    let tau = 0.9f32;
    for (spec, strategy) in [
        ("topk:ratio=0.1,select=exact", Strategy::Sparse),
        ("threshold:tau=0.9", Strategy::Gather),
    ] {
        let cfg = EngineConfig {
            codec: spec.parse().unwrap(),
            strategy,
            momentum: Some(MomentumConfig {
                beta,
                nesterov: false,
                masking: true,
            }),
            ..Default::default()
        };
        let got = world(n, |t| {
            let rank = t.rank();
            let e = Engine::start(t, cfg.clone(), &[TensorSpec::new("w", [len])]).unwrap();
            let out: Vec<Vec<f32>> = (0..steps)
                .map(|step| e.all_reduce("w", g(rank, step)).wait().unwrap())
                .collect();
            e.shutdown().unwrap();
            out
        });
        let k = (0.1 * len as f64).ceil() as usize;
        let mut u = vec![vec![0f32; len]; n];
        let mut res = vec![vec![0f32; len]; n];
        let mut masked = 0;
        for step in 0..steps {
            let mut want = vec![0f32; len];
            for r in 0..n {
                let gr = g(r, step);
                let mut sent = vec![0f32; len];
                let mut idx: Vec<usize> = Vec::new();
                if strategy == Strategy::Sparse {
                    let x: Vec<f32> = (0..len)
                        .map(|i| res[r][i] + beta * u[r][i] + gr[i])
                        .collect();
                    let mut order: Vec<usize> = (0..len).collect();
                    order.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()));
                    idx.extend(&order[..k]);
                    for i in 0..len {
                        u[r][i] = beta * u[r][i] + gr[i];
                        res[r][i] = x[i];
                    }
                    for &i in &idx {
                        sent[i] = x[i];
                        res[r][i] = 0.0;
                    }
                } else {
                    for i in 0..len {
                        u[r][i] = beta * u[r][i] + gr[i];
                        res[r][i] += u[r][i];
                        if res[r][i] > tau {
                            sent[i] = tau;
                            res[r][i] -= tau;
                            idx.push(i);
                        } else if res[r][i] < -tau {
                            sent[i] = -tau;
                            res[r][i] += tau;
                            idx.push(i);
                        }
                    }
                }
                for &i in &idx {
                    masked += usize::from(u[r][i] != 0.0);
                    u[r][i] = 0.0;
                }
                for i in 0..len {
                    want[i] += sent[i];
                }
            }
            want.iter_mut().for_each(|w| *w /= n as f32);
            for (rank, out) in got.iter().enumerate() {
                for (i, (a, b)) in out[step].iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                        "{spec} rank {rank} step {step} [{i}]: {a} vs {b}"
                    );
                }
            }
        }
        assert!(masked > 0, "{spec}: the masking changed nothing");
    }
}

#[test]
fn bench_runs_every_case() {
    for case in crate::bench::BenchCase::ALL {
        let res = world(2, |t| {
            // 7 repetitions: uneven blocks (2, 2, 1, 1, 1), the engine restarted in each.
            crate::bench::run(t, case, 7, EngineConfig::default())
                .unwrap()
                .0
        });
        for r in res {
            assert_eq!(r.case, case.name());
            assert_eq!(r.reps, 7);
            assert!(r.engine_ms > 0.0 && r.per_tensor_ms > 0.0 && r.flat_ms > 0.0);
            assert!(
                r.engine_rounds >= 1.0,
                "{}: {} rounds",
                r.case,
                r.engine_rounds
            );
        }
    }
}

/// The registered dense batch submitted at once is reduced in the negotiation round itself
/// (speculation), bit for bit as the normal path (naive rank-order mean), and ranks that
/// submit at different times fall back to the normal path with the same bits. Over the
/// in-process transport and over TCP (whose vectored sends carry the parts).
#[test]
fn speculative_batch_is_bit_identical_and_used() {
    for tcp in [false, true] {
        for n in [2usize, 3, 4, 5, 8] {
            for late in [false, true] {
                let run = |t: Box<dyn Transport>| speculative_steps(t, late);
                let out = if tcp {
                    super::tcp_world(n, run)
                } else {
                    world(n, |t| run(Box::new(t)))
                };
                for (res, st) in &out {
                    for (step, r) in res.iter().enumerate() {
                        for (i, s) in spec_tensors().iter().enumerate() {
                            let inputs: Vec<_> =
                                (0..n).map(|q| grad(q, step, i, s.len())).collect();
                            assert_eq!(
                                super::bits(&r[i]),
                                super::bits(&super::naive_mean(&inputs)),
                                "tcp={tcp} P={n} late={late} step {step} tensor {i}"
                            );
                        }
                    }
                    assert_eq!(st.steps.iter().map(|s| s.tensors).sum::<u64>(), 12);
                    if !late {
                        assert!(st.speculative_rounds >= 1, "tcp={tcp} P={n}: {st:?}");
                    }
                }
            }
        }
    }
}

fn spec_tensors() -> Vec<TensorSpec> {
    vec![
        TensorSpec::new("w", [13, 7]),
        TensorSpec::new("b", [13]),
        TensorSpec::new("v", [50]),
    ]
}

/// Four steps of the speculative test on one rank (the last rank late every other step
/// with `late`): each step's results and the engine's stats.
fn speculative_steps(
    t: Box<dyn Transport>,
    late: bool,
) -> (Vec<Vec<Vec<f32>>>, crate::EngineStats) {
    let tensors = spec_tensors();
    let (rank, n) = (t.rank(), t.world_size());
    let e = Engine::start(t, EngineConfig::default(), &tensors).unwrap();
    let mut res = Vec::new();
    for step in 0..4 {
        if late && rank == n - 1 && step % 2 == 1 {
            std::thread::sleep(Duration::from_millis(15));
        }
        let hs = e.all_reduce_batch(
            tensors
                .iter()
                .enumerate()
                .map(|(i, s)| (s.name.as_str(), grad(rank, step, i, s.len()))),
        );
        res.push(
            hs.into_iter()
                .map(|h| h.wait().unwrap())
                .collect::<Vec<_>>(),
        );
    }
    let st = e.stats();
    e.shutdown().unwrap();
    (res, st)
}
