//! Aji & Heafield's global top-k through the engine: `topk:scope=global` selects one set of
//! `k = ceil(ratio * n)` entries over all tensors of its policy (`n` = their total length),
//! against a naive reference written here (concatenate, sort by magnitude, error feedback,
//! exact sums across ranks), on `Local` and TCP worlds of 1..=4 ranks.

use std::time::Duration;

use gradwire_transport::Transport;

use super::{assert_steps_bitwise, tcp_world, world};
use crate::{Engine, EngineConfig, Error, MomentumConfig, Strategy, TensorSpec};

/// A bias, a matrix, a vector and a small matrix: 521 elements.
const SHAPES: [&[usize]; 4] = [&[37], &[20, 15], &[120], &[8, 8]];
const STEPS: usize = 4;

fn tensors() -> Vec<TensorSpec> {
    super::named_specs(&SHAPES)
}

fn lens() -> Vec<usize> {
    SHAPES.iter().map(|s| s.iter().product()).collect()
}

/// Multiples of 2^-10 in [-32, 32): 65536 distinct values (no ties at the cut in practice,
/// and the reference checks), and every sum the test forms is exact in f32, so the order
/// in which the engine adds the ranks' entries does not matter.
fn grad(rank: usize, step: usize, tensor: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let mut h = (i as u64 + 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(((rank * 1009 + step * 97 + tensor * 13) as u64) << 32);
            h ^= h >> 29;
            h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            h ^= h >> 32;
            ((h >> 20) & 0xFFFF) as f32 / 1024.0 - 32.0
        })
        .collect()
}

/// The engine's result: per rank, per step, per tensor.
fn through_engine<T: Transport + 'static>(
    t: T,
    cfg: &EngineConfig,
    grads: &dyn Fn(usize, usize, usize, usize) -> Vec<f32>,
) -> Vec<Vec<Vec<f32>>> {
    let rank = t.rank();
    let e = Engine::start(t, cfg.clone(), &tensors()).unwrap();
    let out = (0..STEPS)
        .map(|step| {
            e.set_progress(step as u64, 0.0);
            let hs = e.all_reduce_batch(
                lens()
                    .iter()
                    .enumerate()
                    .map(|(i, &len)| (format!("t{i}"), grads(rank, step, i, len))),
            );
            hs.into_iter().map(|h| h.wait().unwrap()).collect()
        })
        .collect();
    e.shutdown().unwrap();
    out
}

/// The naive reference: per rank, `u = beta u + g` (with momentum), `x = u + residual` over
/// the concatenation, the `k` entries of largest `|x|` sent, the rest kept as residual,
/// `u = 0` where sent (masking); the sent values summed over ranks (exact here) and divided
/// by the world; each tensor its slice.
fn reference(
    n: usize,
    ratio: f64,
    beta: Option<f32>,
    grads: &dyn Fn(usize, usize, usize, usize) -> Vec<f32>,
) -> Vec<Vec<Vec<f32>>> {
    let lens = lens();
    let total: usize = lens.iter().sum();
    let k = (ratio * total as f64).ceil() as usize;
    let mut residual = vec![vec![0f32; total]; n];
    let mut velocity = vec![vec![0f32; total]; n];
    (0..STEPS)
        .map(|step| {
            let mut sum = vec![0f32; total];
            for r in 0..n {
                let g: Vec<f32> = lens
                    .iter()
                    .enumerate()
                    .flat_map(|(i, &len)| grads(r, step, i, len))
                    .collect();
                let u = &mut velocity[r];
                let x: Vec<f32> = (0..total)
                    .map(|i| {
                        let v = match beta {
                            Some(b) => {
                                u[i] = b * u[i] + g[i];
                                u[i]
                            }
                            None => g[i],
                        };
                        v + residual[r][i]
                    })
                    .collect();
                let mut order: Vec<usize> = (0..total).collect();
                order.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()));
                assert!(
                    x[order[k - 1]].abs() > x[order[k]].abs(),
                    "the test data has a tie at the cut (rank {r} step {step})"
                );
                residual[r] = x.clone();
                for &i in &order[..k] {
                    sum[i] += x[i];
                    residual[r][i] = 0.0;
                    if beta.is_some() {
                        u[i] = 0.0;
                    }
                }
            }
            for s in &mut sum {
                *s /= n as f32;
            }
            let mut off = 0;
            lens.iter()
                .map(|&len| {
                    off += len;
                    sum[off - len..off].to_vec()
                })
                .collect()
        })
        .collect()
}

fn compare(label: &str, got: &[Vec<Vec<Vec<f32>>>], want: &[Vec<Vec<f32>>]) {
    assert_steps_bitwise(label, got, |_| want);
}

#[test]
fn global_topk_equals_one_selection_over_the_concatenation() {
    let masked = MomentumConfig {
        beta: 0.5,
        nesterov: false,
        masking: true,
    };
    for (spec, ratio) in [
        ("topk:ratio=0.05,select=exact", 0.05),
        ("topk:ratio=0.05", 0.05),
        ("topk:ratio=0.01", 0.01),
        // Dense enough that the sparse all-reduce's sum goes dense after a merge, and from
        // the start.
        ("topk:ratio=0.25,select=exact", 0.25),
        ("topk:ratio=0.37,select=exact", 0.37),
    ] {
        for strategy in [Strategy::Sparse, Strategy::Gather] {
            for momentum in [None, Some(masked)] {
                let cfg = EngineConfig {
                    codec: spec.parse().unwrap(),
                    strategy,
                    momentum,
                    // Small fusion groups: the unit must still travel as one.
                    fusion_bytes: 256,
                    ..Default::default()
                };
                for n in 1..=4 {
                    let want = reference(n, ratio, momentum.map(|m| m.beta), &grad);
                    let label = format!("{spec}@{strategy} momentum={} P={n}", momentum.is_some());
                    let got = world(n, |t| through_engine(t, &cfg, &grad));
                    compare(&label, &got, &want);
                    if spec.contains("exact") && momentum.is_none() {
                        let got = tcp_world(n, |t| through_engine(t, &cfg, &grad));
                        compare(&format!("{label} tcp"), &got, &want);
                    }
                }
            }
        }
    }
}

/// One tensor holds all the large values: the global threshold gives it every one of the
/// `k` entries (per-tensor selection would give the others their `ceil(ratio * n_t)`).
#[test]
fn the_tensor_with_the_large_values_gets_all_k_entries() {
    let big = |rank: usize, step: usize, tensor: usize, len: usize| -> Vec<f32> {
        let g = grad(0, step, tensor, len);
        let _ = rank; // the same gradient on every rank: the mean is the selection itself
        if tensor == 1 {
            g.iter().map(|x| x * 1024.0).collect()
        } else {
            g.iter().map(|x| x / 1024.0).collect()
        }
    };
    for strategy in [Strategy::Sparse, Strategy::Gather] {
        let cfg = EngineConfig {
            codec: "topk:ratio=0.05".parse().unwrap(),
            strategy,
            ..Default::default()
        };
        let k = (0.05f64 * lens().iter().sum::<usize>() as f64).ceil() as usize;
        for n in [1, 3] {
            let got = world(n, |t| through_engine(t, &cfg, &big));
            // Step 0 (no residual yet): all k entries in tensor 1, none elsewhere.
            let nonzero = |v: &[f32]| v.iter().filter(|x| **x != 0.0).count();
            for (r, steps) in got.iter().enumerate() {
                let per_tensor: Vec<usize> = steps[0].iter().map(|t| nonzero(t)).collect();
                assert_eq!(
                    per_tensor,
                    vec![0, k, 0, 0],
                    "{strategy} P={n} rank {r}: entries per tensor"
                );
            }
            compare(
                &format!("{strategy} P={n} large values"),
                &got,
                &reference(n, 0.05, None, &big),
            );
        }
    }
}

/// `scope=tensor` keeps one selection per tensor: `ceil(ratio * n_t)` entries each, on the
/// same data.
#[test]
fn tensor_scope_still_selects_per_tensor() {
    let cfg = EngineConfig {
        codec: "topk:ratio=0.05,scope=tensor".parse().unwrap(),
        ..Default::default()
    };
    let got = world(1, |t| through_engine(t, &cfg, &grad));
    let per_tensor: Vec<usize> = got[0][0]
        .iter()
        .map(|t| t.iter().filter(|x| **x != 0.0).count())
        .collect();
    let want: Vec<usize> = lens()
        .iter()
        .map(|&n| (0.05 * n as f64).ceil() as usize)
        .collect();
    assert_eq!(per_tensor, want);
}

/// A unit runs once all of its tensors are submitted: one that no rank submits holds the
/// others back, and the stall inspector names it, missing on every rank.
#[test]
fn a_unit_waits_for_all_its_tensors_and_names_the_missing_one() {
    let cfg = EngineConfig {
        codec: "topk:ratio=0.05".parse().unwrap(),
        stall_warning: Some(Duration::from_millis(100)),
        stall_abort: Some(Duration::from_millis(300)),
        ..Default::default()
    };
    let errs = world(2, |t| {
        let rank = t.rank();
        let e = Engine::start(t, cfg.clone(), &tensors()).unwrap();
        let hs = e.all_reduce_batch(
            lens()
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != 2)
                .map(|(i, &len)| (format!("t{i}"), grad(rank, 0, i, len))),
        );
        let errs: Vec<Error> = hs.into_iter().map(|h| h.wait().unwrap_err()).collect();
        let _ = e.shutdown();
        errs
    });
    for e in errs.iter().flatten() {
        assert!(
            matches!(e, Error::Stalled { tensor, missing_ranks, .. }
                if tensor == "t2" && *missing_ranks == vec![0, 1]),
            "{e:?}"
        );
    }
}
