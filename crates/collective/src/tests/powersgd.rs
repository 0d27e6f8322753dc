//! PowerSGD's two all-reduces against a naive reference of the paper's Algorithms 1 and 2
//! written here in f64: `P = sum_i M_i Q`, Gram-Schmidt, `Q = mean_i M_i^T P^`, out `P^ Q^T`,
//! `e_i = M_i - out`, `Q` kept. Matrix shapes come from the tensors' shapes, as PyTorch views
//! them: a conv weight `[c_out, c_in, kh, kw]` is the `c_out x c_in*kh*kw` matrix, a Linear
//! weight (burn's `[in, out]`, row-major) the `out x in` matrix.

use gradwire_codec::{BuildContext, PowerSgdConfig, TensorInfo, TensorRole};
use rand::{Rng, SeedableRng};

use super::{for_each_transport, run_world, WorldFactory};
use crate::compressed::{initial_q, PowerSgdAllReduce, PowerSgdTensor, Reduce};

fn model() -> Vec<TensorInfo> {
    use TensorRole::*;
    vec![
        TensorInfo::new([8, 3, 3, 3], ConvWeight),
        TensorInfo::new([8], Bias),
        TensorInfo::new([40, 30], LinearWeight),
        TensorInfo::new([30], Bias),
        TensorInfo::new([2, 2], Output), // (2 + 2) r >= 4: not worth compressing
    ]
}

fn grad(rank: usize, step: usize, len: usize) -> Vec<f32> {
    let mut g = rand::rngs::StdRng::seed_from_u64((rank * 31 + step) as u64);
    (0..len).map(|_| g.gen_range(-1.0f32..1.0)).collect()
}

/// The naive reference: per step, every rank's gradient, returns the mean's approximation.
/// (Index loops on purpose: it reads like the paper's sums.)
#[allow(clippy::needless_range_loop)]
fn reference(world: usize, steps: usize, r: usize, seed: u64) -> Vec<Vec<f64>> {
    let ts = model();
    let len: usize = ts.iter().map(TensorInfo::numel).sum();
    // (start, rows, cols, compressed, stored as [cols, rows])
    let mut mats = Vec::new();
    let mut at = 0;
    for t in &ts {
        let linear =
            t.shape.len() == 2 && matches!(t.role, TensorRole::LinearWeight | TensorRole::Output);
        let (rows, cols) = if linear {
            (t.shape[1], t.shape[0])
        } else {
            (t.shape[0], t.numel() / t.shape[0])
        };
        let low = t.shape.len() > 1 && (rows + cols) * r < rows * cols;
        mats.push((at, rows, cols, low, linear));
        at += t.numel();
    }
    let mut qs: Vec<Vec<f64>> = mats
        .iter()
        .enumerate()
        .map(|(i, &(_, _, cols, _, _))| {
            initial_q(seed, i, 0, cols, r)
                .iter()
                .map(|&v| v as f64)
                .collect()
        })
        .collect();
    let mut err = vec![vec![0f64; len]; world];
    let mut outs = Vec::new();
    for step in 0..steps {
        let ms: Vec<Vec<f64>> = (0..world)
            .map(|i| {
                grad(i, step, len)
                    .iter()
                    .zip(&err[i])
                    .map(|(&g, e)| g as f64 + e)
                    .collect()
            })
            .collect();
        let mut out = vec![0f64; len];
        for (ti, &(s, rows, cols, low, linear)) in mats.iter().enumerate() {
            // Where element (a, b) of the matrix is stored.
            let at = |a: usize, b: usize| {
                if linear {
                    s + b * rows + a
                } else {
                    s + a * cols + b
                }
            };
            let el = |m: &Vec<f64>, a: usize, b: usize| m[at(a, b)];
            if !low {
                for k in 0..rows * cols {
                    out[s + k] = ms.iter().map(|m| m[s + k]).sum::<f64>() / world as f64;
                }
                continue;
            }
            let q = &qs[ti];
            // P = sum_i M_i Q  (rows x r)
            let mut p = vec![vec![0f64; r]; rows];
            for m in &ms {
                for a in 0..rows {
                    for c in 0..r {
                        for b in 0..cols {
                            p[a][c] += el(m, a, b) * q[b * r + c];
                        }
                    }
                }
            }
            // Gram-Schmidt on the columns.
            for c in 0..r {
                let norm = (0..rows).map(|a| p[a][c] * p[a][c]).sum::<f64>().sqrt();
                for row in p.iter_mut() {
                    row[c] /= norm + 1e-8;
                }
                for l in c + 1..r {
                    let d: f64 = (0..rows).map(|a| p[a][c] * p[a][l]).sum();
                    for row in p.iter_mut() {
                        row[l] -= d * row[c];
                    }
                }
            }
            // Q = mean_i M_i^T P  (cols x r)
            let mut qn = vec![0f64; cols * r];
            for m in &ms {
                for b in 0..cols {
                    for c in 0..r {
                        for a in 0..rows {
                            qn[b * r + c] += el(m, a, b) * p[a][c] / world as f64;
                        }
                    }
                }
            }
            for a in 0..rows {
                for b in 0..cols {
                    out[at(a, b)] = (0..r).map(|c| p[a][c] * qn[b * r + c]).sum();
                }
            }
            qs[ti] = qn;
            for (i, m) in ms.iter().enumerate() {
                for k in 0..rows * cols {
                    err[i][s + k] = m[s + k] - out[s + k];
                }
            }
        }
        outs.push(out);
    }
    outs
}

fn matches_reference(factory: &WorldFactory) {
    let ts = model();
    let len: usize = ts.iter().map(TensorInfo::numel).sum();
    let (steps, seed) = (4, 77);
    for world in 1..=5 {
        for r in [1, 2] {
            let want = reference(world, steps, r, seed);
            let cfg: PowerSgdConfig = PowerSgdConfig {
                rank: r,
                ..PowerSgdConfig::default()
            };
            let got = run_world(factory(world), |t| {
                let ctx =
                    BuildContext::new(seed, t.rank(), world, Vec::new()).with_tensors(model());
                let mut a = PowerSgdAllReduce::new(&cfg, &ctx, len);
                let kinds: Vec<bool> = a
                    .tensors()
                    .iter()
                    .map(|k| matches!(k, PowerSgdTensor::LowRank { .. }))
                    .collect();
                let outs: Vec<Vec<f32>> = (0..steps)
                    .map(|s| {
                        let mut g = grad(t.rank(), s, len);
                        a.all_reduce(t, &mut g, Reduce::Mean).unwrap();
                        g
                    })
                    .collect();
                (kinds, outs)
            });
            for (rank, (kinds, outs)) in got.into_iter().enumerate() {
                assert_eq!(kinds, vec![true, false, true, false, false]);
                for (s, (o, w)) in outs.iter().zip(&want).enumerate() {
                    for (k, (x, y)) in o.iter().zip(w).enumerate() {
                        assert!(
                            (*x as f64 - y).abs() <= 2e-3 * (1.0 + y.abs()),
                            "P={world} r={r} rank {rank} step {s} elem {k}: {x} vs {y}"
                        );
                    }
                }
            }
        }
    }
}
for_each_transport!(powersgd_reference, matches_reference);

/// A gradient that is exactly rank 1 and the same on every rank is recovered exactly after a
/// warm-started step, and the sum is P times the mean.
#[test]
fn low_rank_gradients_pass_and_sum_scales() {
    let world = 3;
    let (rows, cols) = (12, 9);
    let g: Vec<f32> = (0..rows * cols)
        .map(|k| ((k / cols) as f32 - 5.0) * 0.25 * ((k % cols) as f32 + 1.0))
        .collect();
    let got =
        run_world(super::local_world(world), |t| {
            let ctx = BuildContext::new(1, t.rank(), world, Vec::new()).with_tensors(vec![
                TensorInfo::new([rows, cols], TensorRole::LinearWeight),
            ]);
            let cfg = PowerSgdConfig {
                rank: 1,
                ef: false,
                ..PowerSgdConfig::default()
            };
            let mut a = PowerSgdAllReduce::new(&cfg, &ctx, rows * cols);
            let mut b = g.clone();
            a.all_reduce(t, &mut b, Reduce::Mean).unwrap();
            let mut s = g.clone();
            a.all_reduce(t, &mut s, Reduce::Sum).unwrap();
            (b, s, a.bytes_sent())
        });
    for (mean, sum, bytes) in got {
        for ((m, s), x) in mean.iter().zip(&sum).zip(&g) {
            assert!((m - x).abs() < 1e-4, "{m} vs {x}");
            assert!((s - 3.0 * x).abs() < 3e-4, "{s} vs {}", 3.0 * x);
        }
        // Two ring all-reduces of (12 + 9) floats per step, not 108.
        assert!(bytes < 2 * 2 * 2 * 21 * 4 + 64, "{bytes}");
    }
}
