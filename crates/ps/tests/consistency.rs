//! Exact sums under every consistency mode, the SSP bound on every pull, sync SGD against a
//! naive reference, dead workers (strict / shrink), row-sparse pulls, compressed pushes.

mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{addrs, client, client_cfg, shards};
use gradwire_codec::{BuildContext, CodecConfig};
use gradwire_ps::{Consistency, DeadPolicy, Error, Key, KvStore, PushMode, TableSpec, UpdaterSpec};

const W: usize = 4;
const SEG: usize = 150; // per-worker segment: 4 × 150 = 600 elements = 3 chunks of 256

/// Each worker adds 1 to every element of its own segment per step, so segment `w` of any
/// pulled vector counts exactly the pushes of worker `w` that the read includes.
fn segment_pushes(w: usize) -> Vec<f32> {
    let mut v = vec![0.0; W * SEG];
    v[w * SEG..(w + 1) * SEG].iter_mut().for_each(|x| *x = 1.0);
    v
}

/// Per worker segment, the (min, max) count over its elements (chunks of one table advance
/// independently outside sync mode, so a segment spanning two chunks may differ).
fn counts(v: &[f32]) -> Vec<(f32, f32)> {
    (0..W)
        .map(|w| {
            let s = &v[w * SEG..(w + 1) * SEG];
            let min = s.iter().copied().fold(f32::INFINITY, f32::min);
            let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            (min, max)
        })
        .collect()
}

fn run_workload(consistency: Consistency, steps: usize, slow_worker_ms: u64) {
    let servers = shards(2, W as u32, |_| {});
    let a = addrs(&servers);
    let start = Arc::new(Barrier::new(W));
    let handles: Vec<_> = (0..W)
        .map(|w| {
            let a = a.clone();
            let start = start.clone();
            std::thread::spawn(move || {
                let mut kv = client(w as u32, a);
                kv.init(Key(7), TableSpec::new(consistency, UpdaterSpec::Sum), &vec![0.0; W * SEG])
                    .unwrap();
                start.wait();
                let push = segment_pushes(w);
                let mut out = vec![0.0; W * SEG];
                for t in 1..=steps {
                    if w == W - 1 && slow_worker_ms > 0 {
                        std::thread::sleep(Duration::from_millis(slow_worker_ms));
                    }
                    let info = kv.push_pull_with(Key(7), &push, PushMode::Add, &mut out).unwrap();
                    let c = counts(&out);
                    assert_eq!(info.clock, t as u64);
                    match consistency {
                        Consistency::Sync => {
                            assert_eq!(c, vec![(t as f32, t as f32); W], "sync round {t} on worker {w}")
                        }
                        Consistency::Ssp { staleness } => {
                            let s = staleness as u64;
                            // Read-my-writes, and every worker's pushes up to clock c - s.
                            assert_eq!(c[w], (t as f32, t as f32));
                            for (v, &(cv, _)) in c.iter().enumerate() {
                                assert!(
                                    cv as u64 + s >= t as u64,
                                    "SSP bound broken: worker {w} at clock {t} sees {cv} pushes of worker {v}"
                                );
                            }
                            assert!(t as u64 - info.min_clock.min(t as u64) <= s, "{info:?}");
                        }
                        Consistency::Async => assert_eq!(c[w], (t as f32, t as f32)),
                    }
                }
                kv.leave().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread");
    }
    let mut kv = client(0, a);
    kv.init(
        Key(7),
        TableSpec::new(consistency, UpdaterSpec::Sum),
        &vec![0.0; W * SEG],
    )
    .unwrap();
    let mut out = vec![0.0; W * SEG];
    kv.pull(Key(7), &mut out).unwrap();
    let n = steps as f32;
    assert_eq!(
        counts(&out),
        vec![(n, n); W],
        "{consistency}: exact final sum"
    );
}

#[test]
fn exact_sums_sync() {
    run_workload(Consistency::Sync, 15, 0);
}

#[test]
fn exact_sums_async() {
    run_workload(Consistency::Async, 15, 0);
}

#[test]
fn exact_sums_and_bound_ssp_with_a_slow_worker() {
    run_workload(Consistency::Ssp { staleness: 2 }, 15, 3);
}

/// Least squares on synthetic data: worker w holds rows w, w+W, ...; gradient of
/// 0.5·|A x - b|² / rows.
fn grad(x: &[f32], w: usize) -> Vec<f32> {
    let d = x.len();
    let mut g = vec![0.0f32; d];
    let rows: Vec<usize> = (0..20).filter(|r| r % W == w).collect();
    for &r in &rows {
        let scale = 1.0 / (6.0 * (d as f32).sqrt());
        let a: Vec<f32> = (0..d)
            .map(|j| (((r * 31 + j * 17) % 13) as f32 - 6.0) * scale)
            .collect();
        let b = (r % 5) as f32 - 2.0;
        let e: f32 = a.iter().zip(x).map(|(a, x)| a * x).sum::<f32>() - b;
        for j in 0..d {
            g[j] += e * a[j] / rows.len() as f32;
        }
    }
    g
}

fn reference_run(updater: &UpdaterSpec, x0: &[f32], steps: usize) -> Vec<f32> {
    let mut x = x0.to_vec();
    let mut st = gradwire_ps::OptState::default();
    for _ in 0..steps {
        let mut avg = vec![0.0f32; x.len()];
        for w in 0..W {
            for (a, g) in avg.iter_mut().zip(grad(&x, w)) {
                *a += g / W as f32;
            }
        }
        gradwire_ps::apply_update(updater, &mut st, &mut x, &avg);
    }
    x
}

#[test]
fn sync_sgd_and_adam_equal_a_naive_reference_on_the_averaged_gradient() {
    // Tolerance: 1e-5 absolute. The server sums the workers' gradients in arrival order,
    // the reference in rank order, so results differ by float rounding only.
    for spec in [
        "sgd:lr=0.5",
        "momentum:lr=0.2,mu=0.9",
        "adagrad:lr=0.1",
        "adam:lr=0.05",
    ] {
        let updater: UpdaterSpec = spec.parse().unwrap();
        let d = 300; // two chunks of 256 on two shards
        let x0: Vec<f32> = (0..d).map(|i| (i % 7) as f32 * 0.1).collect();
        let servers = shards(2, W as u32, |_| {});
        let a = addrs(&servers);
        let steps = 12;
        let handles: Vec<_> = (0..W)
            .map(|w| {
                let (a, x0) = (a.clone(), x0.clone());
                std::thread::spawn(move || {
                    let mut kv = client(w as u32, a);
                    kv.init(Key(1), TableSpec::new(Consistency::Sync, updater), &x0)
                        .unwrap();
                    let mut x = x0.clone();
                    for _ in 0..steps {
                        let g = grad(&x, w);
                        kv.push_pull(Key(1), &g, &mut x).unwrap();
                    }
                    x
                })
            })
            .collect();
        let results: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let want = reference_run(&updater, &x0, steps);
        for x in &results {
            assert_eq!(x, &results[0], "every worker sees the same parameters");
            let err = x
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err <= 1e-5, "{spec}: max |ps - reference| = {err}");
        }
    }
}

fn dead_worker_case(policy: DeadPolicy) -> Vec<Result<Vec<f32>, Error>> {
    let servers = shards(1, 3, |c| {
        c.heartbeat_timeout = Duration::from_millis(300);
        c.max_wait = Duration::from_secs(5);
    });
    let a = addrs(&servers);
    let spec = TableSpec::new(Consistency::Sync, UpdaterSpec::Sum).with_dead_policy(policy);
    let mut kvs: Vec<KvStore> = (0..3).map(|w| client(w, a.clone())).collect();
    for kv in kvs.iter_mut() {
        kv.init(Key(3), spec.clone(), &[0.0; 4]).unwrap();
    }
    let dead = kvs.pop().unwrap();
    dead.abandon(); // worker 2 crashes: no more heartbeats, no Leave
    let t0 = Instant::now();
    let handles: Vec<_> = kvs
        .into_iter()
        .enumerate()
        .map(|(w, mut kv)| {
            std::thread::spawn(move || {
                let mut out = vec![0.0; 4];
                kv.push_pull_with(Key(3), &[(w + 1) as f32; 4], PushMode::Add, &mut out)
                    .map(|_| out)
            })
        })
        .collect();
    let r = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "answered within the heartbeat timeout, not max_wait"
    );
    r
}

#[test]
fn dead_worker_in_sync_mode_strict_names_it() {
    for r in dead_worker_case(DeadPolicy::Strict) {
        match r {
            Err(Error::WorkerLost { worker, .. }) => assert_eq!(worker, 2),
            other => panic!("expected WorkerLost(2), got {other:?}"),
        }
    }
}

#[test]
fn dead_worker_in_sync_mode_shrink_closes_the_round() {
    for r in dead_worker_case(DeadPolicy::Shrink) {
        assert_eq!(r.unwrap(), vec![3.0; 4]);
    }
}

#[test]
fn row_sparse_pull_equals_the_dense_rows() {
    let servers = shards(2, 1, |_| {});
    let mut kv = client(0, addrs(&servers));
    let rows = 100usize;
    let init: Vec<f32> = (0..rows * 4).map(|i| i as f32).collect();
    let spec = TableSpec::new(Consistency::Async, UpdaterSpec::Sum).with_row_len(4);
    kv.init(Key(9), spec, &init).unwrap();
    assert!(kv.chunks(Key(9)).unwrap().len() >= 2);
    assert!(kv.chunks(Key(9)).unwrap().iter().all(|c| c.len % 4 == 0));
    let want = [97u32, 3, 50, 3, 0, 99];
    let mut out = vec![0.0; want.len() * 4];
    kv.pull_rows(Key(9), &want, &mut out).unwrap();
    for (i, r) in want.iter().enumerate() {
        assert_eq!(
            &out[i * 4..i * 4 + 4],
            &init[*r as usize * 4..*r as usize * 4 + 4]
        );
    }
    assert!(kv.pull_rows(Key(9), &[100], &mut [0.0; 4]).is_err());
}

#[test]
fn compressed_pushes_are_decoded_at_the_server() {
    let servers = shards(2, 1, |_| {});
    let a = addrs(&servers);
    let mut kv = client(0, a.clone());
    let n = 300;
    let g: Vec<f32> = (0..n)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let cfg = client_cfg(0, a);
    for (k, spec) in CodecConfig::examples()
        .into_iter()
        .filter(|c| c.name() != "powersgd")
        .enumerate()
    {
        let key = Key(100 + k as u64);
        let table = TableSpec::new(Consistency::Async, UpdaterSpec::Sum)
            .with_codec(spec.to_string().parse().unwrap());
        kv.init(key, table, &vec![0.0; n]).unwrap();
        kv.push(key, &g).unwrap();
        let mut got = vec![0.0; n];
        kv.pull(key, &mut got).unwrap();
        // Reference: the same codec, built as the client builds it, decoded locally.
        let mut want = vec![0.0f32; n];
        for p in kv.chunks(key).unwrap() {
            let mut c = spec.build(&BuildContext {
                seed: cfg.seed ^ key.0.rotate_left(17) ^ p.index as u64,
                rank: 0,
                world_size: 2,
                layout: Vec::new(),
                ..Default::default()
            });
            let mut buf = Vec::new();
            c.encode(&g[p.start..p.start + p.len], &mut buf);
            c.decode_add(&buf, &mut want[p.start..p.start + p.len])
                .unwrap();
        }
        assert_eq!(got, want, "{spec}");
    }
}

#[test]
fn two_bit_pushes_match_mxnet_with_the_residual_over_three_steps() {
    let servers = shards(1, 1, |_| {});
    let mut kv = client(0, addrs(&servers));
    let table = TableSpec::new(Consistency::Async, UpdaterSpec::Sum)
        .with_codec("2bit:threshold=0.5".parse().unwrap());
    kv.init(Key(5), table, &[0.0; 10]).unwrap();
    let grads: Vec<Vec<f32>> = (0..3)
        .map(|s| {
            (0..10)
                .map(|i| ((i * 3 + s * 7) % 9) as f32 * 0.2 - 0.8)
                .collect()
        })
        .collect();
    // Independent reference (MXNet's quantize_2bit, residual on the worker).
    let mut r = [0.0f32; 10];
    let mut want = [0.0f32; 10];
    for g in &grads {
        for i in 0..10 {
            r[i] += g[i];
            if r[i] >= 0.5 {
                want[i] += 0.5;
                r[i] -= 0.5;
            } else if r[i] <= -0.5 {
                want[i] -= 0.5;
                r[i] += 0.5;
            }
        }
        kv.push(Key(5), g).unwrap();
    }
    let mut got = [0.0f32; 10];
    kv.pull(Key(5), &mut got).unwrap();
    assert_eq!(got, want);
}

#[test]
fn a_newer_incarnation_fences_the_old_one() {
    let servers = shards(1, 1, |_| {});
    let a = addrs(&servers);
    let mut c1 = client_cfg(0, a.clone());
    c1.incarnation = 5;
    let mut old = KvStore::connect(c1.clone()).unwrap();
    let spec = TableSpec::new(Consistency::Async, UpdaterSpec::Sum);
    old.init(Key(1), spec.clone(), &[0.0]).unwrap();
    old.push_with(Key(1), &[1.0], PushMode::Add).unwrap();
    c1.incarnation = 6;
    let mut new = KvStore::connect(c1).unwrap();
    new.init(Key(1), spec, &[0.0]).unwrap();
    match old.push_with(Key(1), &[1.0], PushMode::Add) {
        Err(Error::Fenced {
            worker: 0,
            current: 6,
        }) => {}
        other => panic!("expected Fenced, got {other:?}"),
    }
    new.push_with(Key(1), &[1.0], PushMode::Add).unwrap();
    let mut out = [0.0];
    new.pull(Key(1), &mut out).unwrap();
    assert_eq!(out, [2.0]);
}

#[test]
fn placement_spreads_a_big_table_over_both_shards() {
    let servers = shards(2, 1, |_| {});
    let mut kv = client(0, addrs(&servers));
    kv.init(Key(1), TableSpec::default(), &vec![0.0; 256 * 8])
        .unwrap();
    let on: Vec<usize> = kv.chunks(Key(1)).unwrap().iter().map(|c| c.shard).collect();
    let zeros = on.iter().filter(|s| **s == 0).count();
    assert!((2..=6).contains(&zeros), "{on:?}");
}

#[test]
fn downpour_workers_train_a_quadratic_and_every_push_lands_once() {
    // Minimize 0.5·|x - c|² with Downpour: 2 workers, n_fetch = 2, n_push = 3, server SGD.
    let servers = shards(1, 2, |_| {});
    let a = addrs(&servers);
    let c: Vec<f32> = (0..8).map(|i| i as f32 - 3.0).collect();
    let handles: Vec<_> = (0..2)
        .map(|w| {
            let (a, c) = (a.clone(), c.clone());
            std::thread::spawn(move || {
                let mut kv = client(w, a);
                kv.init(
                    Key(1),
                    TableSpec::new(Consistency::Async, "sgd:lr=0.1".parse().unwrap()),
                    &[0.0; 8],
                )
                .unwrap();
                let mut dp = gradwire_ps::Downpour::new(Key(1), 8, 2, 3, 0.1);
                let mut x = vec![0.0; 8];
                for _ in 0..30 {
                    dp.step(&mut kv, &mut x, |x, g| {
                        g.extend(x.iter().zip(&c).map(|(x, c)| x - c))
                    })
                    .unwrap();
                }
                dp.flush(&mut kv).unwrap();
                kv.leave().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut kv = client(0, a);
    kv.init(
        Key(1),
        TableSpec::new(Consistency::Async, "sgd:lr=0.1".parse().unwrap()),
        &[0.0; 8],
    )
    .unwrap();
    let mut x = vec![0.0; 8];
    kv.pull(Key(1), &mut x).unwrap();
    let err = x
        .iter()
        .zip(&c)
        .map(|(x, c)| (x - c).abs())
        .fold(0.0, f32::max);
    assert!(err < 0.05, "{x:?}");
    assert_eq!(
        kv.stats(0).unwrap().applied,
        2 * 10,
        "30 steps / n_push 3 = 10 pushes per worker"
    );
}

#[test]
fn assign_and_add_pushes_bypass_the_updater() {
    let servers = shards(1, 1, |_| {});
    let mut kv = client(0, addrs(&servers));
    let adam: UpdaterSpec = "adam:lr=0.1".parse().unwrap();
    kv.init(
        Key(1),
        TableSpec::new(Consistency::Async, adam),
        &[1.0, 2.0],
    )
    .unwrap();
    kv.push_with(Key(1), &[5.0, 6.0], PushMode::Assign).unwrap();
    kv.push_with(Key(1), &[1.0, -1.0], PushMode::Add).unwrap();
    let mut out = [0.0; 2];
    kv.pull(Key(1), &mut out).unwrap();
    assert_eq!(out, [6.0, 5.0]);
    kv.init(Key(2), TableSpec::new(Consistency::Sync, adam), &[1.0])
        .unwrap();
    match kv.push_with(Key(2), &[5.0], PushMode::Assign) {
        Err(Error::Remote {
            code: gradwire_ps::ErrorCode::InvalidArgument,
            ..
        }) => {}
        other => panic!("assign on a sync table must be refused, got {other:?}"),
    }
}
