//! The stripe-quantized all-reduce against a two-stage oracle written naively here: every
//! rank's slice quantized once, summed in rank order, the sum quantized once. For every dense
//! codec of `CodecConfig::examples()`, worlds 1..=8, over `Local` and TCP.

use gradwire_codec::{BuildContext, Codec, CodecConfig, TensorInfo, TensorRole};
use rand::{Rng, SeedableRng};

use super::{
    for_each_transport, local_world, quarters as grad, run_world, small_model, WorldFactory,
};
use crate::compressed::{
    GatherDecode, Leg, OwnContribution, QuantizedAllReduce, Reduce, StripeAllReduce, StripePlan,
};
use crate::{chunks, Collectives, Error, ReduceOp};

const STEPS: usize = 2;

/// The gradients the tests run: shaped (the small model) or not (plain lengths).
fn shapes() -> Vec<(usize, Vec<TensorInfo>)> {
    let m = small_model([30, 12], [12, 10]);
    let n = m.iter().map(TensorInfo::numel).sum();
    vec![
        (0, vec![]),
        (1, vec![]),
        (37, vec![]),
        (1000, vec![]),
        (n, m),
    ]
}

fn ctx(rank: usize, world: usize, tensors: &[TensorInfo]) -> BuildContext {
    BuildContext::new(0x5eed, rank, world, Vec::new()).with_tensors(tensors.to_vec())
}

/// Dense quantizers: not sparsifying, and not PowerSGD (low rank; its own all-reduce).
fn dense(cfg: &CodecConfig) -> bool {
    !cfg.sparsifies() && cfg.name() != "powersgd" && cfg.name() != "randomk"
}

/// The oracle: for each stripe `j`, each rank `q` quantizes its slice once with its own codec
/// for `j` (state kept across steps), the payloads are decoded and summed in rank order
/// (`own = Exact`: the owner's slice added as is), the owner quantizes the sum once.
fn oracle(
    cfg: &CodecConfig,
    world: usize,
    len: usize,
    tensors: &[TensorInfo],
    own: OwnContribution,
) -> Vec<Vec<f32>> {
    let plans: Vec<StripePlan> = (0..world)
        .map(|q| StripePlan::new(cfg, &ctx(q, world, tensors), len, world))
        .collect();
    let mut local: Vec<Vec<Box<dyn Codec>>> = (0..world)
        .map(|q| {
            (0..world)
                .map(|j| cfg.build(&plans[q].context(j, Leg::ReduceScatter)))
                .collect()
        })
        .collect();
    let mut owner: Vec<Box<dyn Codec>> = (0..world)
        .map(|j| cfg.build(&plans[j].context(j, Leg::AllGather)))
        .collect();
    let ranges = plans[0].ranges.clone();
    let mut want = Vec::new();
    for step in 0..STEPS {
        let grads: Vec<Vec<f32>> = (0..world).map(|q| grad(q, step, len)).collect();
        let mut out = vec![0.0f32; len];
        for (j, r) in ranges.iter().enumerate() {
            // TernGrad: the ranks agree on the max of their scales, per piece.
            let shared = (0..world)
                .filter_map(|q| {
                    let s = local[q][j].shared_scalars()?;
                    Some(s.local_scalars(&grads[q][r.clone()]))
                })
                .reduce(|a, b| a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect());
            let mut sum = vec![0.0f32; r.len()];
            for q in 0..world {
                if q == j && own == OwnContribution::Exact {
                    for (s, g) in sum.iter_mut().zip(&grads[q][r.clone()]) {
                        *s += g;
                    }
                    continue;
                }
                if let (Some(s), Some(c)) = (&shared, local[q][j].shared_scalars()) {
                    c.set_shared_scalars(s);
                }
                let mut p = Vec::new();
                local[q][j].encode(&grads[q][r.clone()], &mut p);
                local[j][j].decode_add(&p, &mut sum).unwrap();
            }
            let mut p = Vec::new();
            owner[j].encode(&sum, &mut p);
            local[0][j].decode_add(&p, &mut out[r.clone()]).unwrap();
        }
        want.push(out);
    }
    want
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|x| x.iter().map(|y| y.to_bits()).collect())
        .collect()
}

fn run_stripe(
    factory: &WorldFactory,
    cfg: &CodecConfig,
    world: usize,
    len: usize,
    tensors: &[TensorInfo],
    own: OwnContribution,
) -> Vec<std::result::Result<Vec<Vec<f32>>, String>> {
    run_world(factory(world), |t| {
        let mut s = StripeAllReduce::new(cfg, &ctx(t.rank(), world, tensors), len).with_own(own);
        (0..STEPS)
            .map(|step| {
                let mut b = grad(t.rank(), step, len);
                s.all_reduce(t, &mut b, Reduce::Sum).map(|()| b)
            })
            .collect::<std::result::Result<Vec<_>, Error>>()
            .map_err(|e| e.to_string())
    })
}

/// Equals the oracle bit for bit, every dense codec, worlds 1..=8, shaped and flat gradients.
fn stripe_matches_oracle(factory: &WorldFactory) {
    let mut tested = 0;
    for cfg in CodecConfig::examples().into_iter().filter(dense) {
        tested += 1;
        for world in 1..=8 {
            for (len, tensors) in shapes() {
                let want = oracle(&cfg, world, len, &tensors, OwnContribution::Quantized);
                for (r, got) in run_stripe(
                    factory,
                    &cfg,
                    world,
                    len,
                    &tensors,
                    OwnContribution::Quantized,
                )
                .into_iter()
                .enumerate()
                {
                    let got = got.unwrap_or_else(|e| panic!("{cfg} P={world} len {len}: {e}"));
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{cfg} P={world} len {len} rank {r}"
                    );
                }
            }
        }
    }
    assert!(tested >= 10, "only {tested} dense codecs");
}
for_each_transport!(stripe_oracle, stripe_matches_oracle);

/// The owner's exact contribution (Dryden's variant) against the oracle too.
#[test]
fn stripe_exact_own_matches_oracle() {
    for spec in ["onebit", "adaptive", "qsgd:bits=4"] {
        let cfg: CodecConfig = spec.parse().unwrap();
        for world in [1, 2, 3, 5] {
            for (len, tensors) in shapes() {
                let want = oracle(&cfg, world, len, &tensors, OwnContribution::Exact);
                for got in run_stripe(
                    &local_world,
                    &cfg,
                    world,
                    len,
                    &tensors,
                    OwnContribution::Exact,
                ) {
                    assert_eq!(bits(&got.unwrap()), bits(&want), "{spec} P={world} {len}");
                }
            }
        }
    }
}

/// The lossless codec through the stripes equals the dense all-reduce bit for bit. The inputs
/// are exactly representable sums (multiples of 0.25, see `grad`), so the two paths' different
/// summation orders give the same bits; with arbitrary floats they could differ in the last
/// bits (the stripes sum in rank order, the dense algorithms in their own order).
fn lossless_equals_dense(factory: &WorldFactory) {
    let cfg: CodecConfig = "none".parse().unwrap();
    for world in 1..=8 {
        for (len, tensors) in shapes() {
            let got = run_world(factory(world), |t| {
                let mut s = StripeAllReduce::new(&cfg, &ctx(t.rank(), world, &tensors), len);
                let mut a = grad(t.rank(), 0, len);
                s.all_reduce(t, &mut a, Reduce::Sum).unwrap();
                let mut d = grad(t.rank(), 0, len);
                t.all_reduce(&mut d, ReduceOp::Sum).unwrap();
                (a, d)
            });
            for (a, d) in got {
                assert_eq!(bits(&[a]), bits(&[d]), "P={world} len {len}");
            }
        }
    }
}
for_each_transport!(stripe_lossless, lossless_equals_dense);

/// Bytes each rank puts on the wire at P=4 for 1-bit SGD and adaptive quantization: gather-
/// decode (every payload to every rank), the forwarding ring, and the stripes, all with the
/// shapes unknown (columns of 2048: the ring's chunks know no shapes), then the stripes with
/// the shapes (the paper's columns: two floats per column of 120 or 25 elements on LeNet cost
/// more header than runs of 2048). Printed for the report (`--nocapture`); asserts the stripes
/// cost no more than the ring plus 5% and well under gather-decode, at equal columns.
#[test]
fn stripe_bytes_vs_gather_and_ring() {
    let world = 4;
    let lenet = super::lenet(256);
    let mlp = vec![
        TensorInfo::new([1024, 1024], TensorRole::LinearWeight),
        TensorInfo::new([1024], TensorRole::Bias),
    ];
    println!("bytes sent per rank, P={world} (mean over ranks, one step, payload bytes)");
    println!("model  codec     gather-decode  ring(rs+ag)  stripes(rs+ag)  stripes-shaped  dense");
    for (name, tensors) in [("lenet", lenet), ("mlp1M", mlp)] {
        let len: usize = tensors.iter().map(TensorInfo::numel).sum();
        for spec in ["onebit", "adaptive"] {
            let cfg: CodecConfig = spec.parse().unwrap();
            let tensors = &tensors;
            let cfg = &cfg;
            let res = run_world(local_world(world), |t| {
                let shaped = ctx(t.rank(), world, tensors);
                let c = BuildContext::new(0x5eed, t.rank(), world, shaped.layout.clone());
                let rank = t.rank();
                let g = |s| grad(rank, s, len);
                let b0 = t.bytes_sent();
                let mut codec = cfg.build(&c);
                GatherDecode::new()
                    .all_reduce(t, &mut *codec, &mut g(0), Reduce::Mean)
                    .unwrap();
                let b1 = t.bytes_sent();
                let mut q = QuantizedAllReduce::new(len, rank, world, |leg, ch| {
                    let n = chunks::range(len, world, ch).len();
                    let salt = (ch as u64 + 1) << 8 | u64::from(leg == Leg::AllGather);
                    cfg.build(&BuildContext::new(salt, rank, world, vec![n]))
                });
                q.all_reduce(t, &mut g(0), Reduce::Mean).unwrap();
                let b2 = t.bytes_sent();
                let mut s = StripeAllReduce::new(cfg, &c, len);
                s.all_reduce(t, &mut g(0), Reduce::Mean).unwrap();
                let b3 = t.bytes_sent();
                let mut s = StripeAllReduce::new(cfg, &shaped, len);
                s.all_reduce(t, &mut g(0), Reduce::Mean).unwrap();
                let b4 = t.bytes_sent();
                let mut d = g(0);
                t.all_reduce(&mut d, ReduceOp::Sum).unwrap();
                let b5 = t.bytes_sent();
                [b1 - b0, b2 - b1, b3 - b2, b4 - b3, b5 - b4]
            });
            let mean = |i: usize| res.iter().map(|r| r[i]).sum::<u64>() as f64 / world as f64;
            let (gd, ring, st, sh, dense) = (mean(0), mean(1), mean(2), mean(3), mean(4));
            println!(
                "{name:6} {spec:9} {gd:>13.0}  {ring:>11.0}  {st:>14.0}  {sh:>14.0}  {dense:>6.0}"
            );
            assert!(
                st <= ring * 1.05 + 1024.0,
                "{name} {spec}: {st} vs ring {ring}"
            );
            assert!(st < gd, "{name} {spec}: {st} vs gather {gd}");
        }
    }
}

/// Dryden's adaptive quantization written out naively (no sampling: every column here is
/// shorter than the codec's sample, so its thresholds are exact): per column, `x = g + r`; the
/// `ceil(pi * n+)`-th largest positive and `ceil(pi * n-)`-th largest negative magnitude are the
/// thresholds; at most `max(ceil(max_excess * pi * len), 2)` entries are sent (largest `|x|`
/// first, lower index on ties), as the mean of the sent entries of their sign; the residual keeps
/// `x - sent`. Returns what the receiver decodes.
fn naive_adaptive(
    g: &[f32],
    r: &mut Vec<f32>,
    cols: &[std::ops::Range<usize>],
    pi: f64,
    max_excess: f64,
) -> Vec<f32> {
    let k = |ratio: f64, n: usize| -> usize {
        if n == 0 {
            0
        } else {
            ((ratio * n as f64 - 1e-9).ceil() as usize).clamp(1, n)
        }
    };
    r.resize(g.len(), 0.0);
    for (x, y) in r.iter_mut().zip(g) {
        *x += y;
    }
    let mut out = vec![0.0f32; g.len()];
    for col in cols {
        let x: Vec<f32> = r[col.clone()].to_vec();
        let mut pos: Vec<f32> = x.iter().copied().filter(|v| *v > 0.0).collect();
        let mut neg: Vec<f32> = x.iter().filter(|v| **v < 0.0).map(|v| -v).collect();
        pos.sort_by(|a, b| b.total_cmp(a));
        neg.sort_by(|a, b| b.total_cmp(a));
        let tp = pos.get(k(pi, pos.len()).wrapping_sub(1)).copied();
        let tn = neg.get(k(pi, neg.len()).wrapping_sub(1)).copied();
        let mut cand: Vec<usize> = (0..x.len())
            .filter(|&i| {
                (x[i] > 0.0 && tp.is_some_and(|t| x[i] >= t))
                    || (x[i] < 0.0 && tn.is_some_and(|t| -x[i] >= t))
            })
            .collect();
        let cap = k(max_excess * pi, x.len()).max(2).min(x.len());
        if cand.len() > cap {
            cand.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()).then(a.cmp(&b)));
            cand.truncate(cap);
            cand.sort_unstable();
        }
        let mean = |sign: f32| {
            let v: Vec<f64> = cand
                .iter()
                .filter(|&&i| x[i] * sign > 0.0)
                .map(|&i| f64::from(x[i] * sign))
                .collect();
            if v.is_empty() {
                0.0
            } else {
                (v.iter().sum::<f64>() / v.len() as f64) as f32
            }
        };
        let (mp, mn) = (mean(1.0), mean(-1.0));
        for &i in &cand {
            let s = if x[i] > 0.0 { mp } else { -mn };
            r[col.start + i] -= s;
            out[col.start + i] = s;
        }
    }
    out
}

/// The columns of a stripe's pieces, from their shapes (leading-axis rows; 1-D: whole).
fn piece_columns(pieces: &[TensorInfo]) -> Vec<std::ops::Range<usize>> {
    let mut at = 0;
    let mut cols = Vec::new();
    for t in pieces {
        let n: usize = t.shape.iter().product();
        let c = if t.shape.len() > 1 {
            t.shape[1..].iter().product()
        } else {
            n
        };
        for s in (0..n).step_by(c.max(1)) {
            cols.push(at + s..at + (s + c).min(n));
        }
        at += n;
    }
    cols
}

/// The layers of the two-stage oracle tests: columns of 6 to 200 elements, biases and an
/// output layer.
fn two_stage_tensors() -> Vec<TensorInfo> {
    small_model([40, 200], [30, 10])
}

/// Every rank's results of `steps` stripe all-reduces (sums) of `grad(rank, step)`, one
/// `StripeAllReduce` per rank kept across the steps.
fn stripe_steps(
    cfg: &CodecConfig,
    tensors: &[TensorInfo],
    world: usize,
    steps: usize,
    grad: &(dyn Fn(usize, usize) -> Vec<f32> + Sync),
) -> Vec<Vec<Vec<f32>>> {
    let len: usize = tensors.iter().map(TensorInfo::numel).sum();
    run_world(local_world(world), |t| {
        let mut st = StripeAllReduce::new(cfg, &ctx(t.rank(), world, tensors), len);
        (0..steps)
            .map(|s| {
                let mut b = grad(t.rank(), s);
                st.all_reduce(t, &mut b, Reduce::Sum).unwrap();
                b
            })
            .collect()
    })
}

/// A naive quantizer of one slice: `(slice, its residual, its columns) -> decoded values`.
type NaiveQuantizer = dyn Fn(&[f32], &mut Vec<f32>, &[std::ops::Range<usize>]) -> Vec<f32>;

/// The two-stage exchange written out for `steps` steps of `grad(rank, step)`: per stripe,
/// each rank's slice quantized once with its own residual, the decoded slices summed in rank
/// order, the sum quantized once with the owner's residual (residuals kept across steps).
/// Returns the all-gathered result of each step.
fn two_stage_oracle(
    cfg: &CodecConfig,
    tensors: &[TensorInfo],
    world: usize,
    steps: usize,
    grad: &dyn Fn(usize, usize) -> Vec<f32>,
    quantize: &NaiveQuantizer,
) -> Vec<Vec<f32>> {
    let len: usize = tensors.iter().map(TensorInfo::numel).sum();
    let plan = StripePlan::new(cfg, &ctx(0, world, tensors), len, world);
    let cols: Vec<_> = plan.tensors.iter().map(|p| piece_columns(p)).collect();
    let mut local = vec![vec![Vec::new(); world]; world];
    let mut owner = vec![Vec::new(); world];
    let mut want = Vec::new();
    for s in 0..steps {
        let grads: Vec<Vec<f32>> = (0..world).map(|q| grad(q, s)).collect();
        let mut out = vec![0.0f32; len];
        for (j, r) in plan.ranges.iter().enumerate() {
            let mut sum = vec![0.0f32; r.len()];
            for q in 0..world {
                let d = quantize(&grads[q][r.clone()], &mut local[q][j], &cols[j]);
                for (a, b) in sum.iter_mut().zip(&d) {
                    *a += b;
                }
            }
            let d = quantize(&sum, &mut owner[j], &cols[j]);
            out[r.clone()].copy_from_slice(&d);
        }
        want.push(out);
    }
    want
}

/// Adaptive quantization through the stripes equals the two-stage pipeline written out here
/// with the naive quantizer above: each rank's slice quantized once with its own residual,
/// the decoded slices summed in rank order, the sum quantized once with the owner's residual,
/// all-gathered. Several steps (the residuals carry over), worlds 1..=5, the paper's `pi` and
/// a larger one, on a model whose columns range from 6 to 200 elements.
#[test]
fn stripe_adaptive_matches_a_naive_two_stage_oracle() {
    let tensors = two_stage_tensors();
    let len: usize = tensors.iter().map(TensorInfo::numel).sum();
    let steps = 4;
    // Heavy-tailed floats, distinct per rank and step.
    let grad = |q: usize, s: usize| -> Vec<f32> {
        let mut g = rand::rngs::StdRng::seed_from_u64((q * 977 + s) as u64);
        (0..len)
            .map(|_| {
                let u: f32 = g.gen_range(-1.0..1.0);
                u * u * u
            })
            .collect()
    };
    for (spec, pi, max_excess) in [
        ("adaptive", 1.0 / 64.0, 2.0),
        ("adaptive:pi=0.1,max_excess=1.5", 0.1, 1.5),
    ] {
        let cfg: CodecConfig = spec.parse().unwrap();
        for world in 1..=5 {
            let want = two_stage_oracle(&cfg, &tensors, world, steps, &grad, &move |g, r, c| {
                naive_adaptive(g, r, c, pi, max_excess)
            });
            let got = stripe_steps(&cfg, &tensors, world, steps, &grad);
            for (rank, g) in got.iter().enumerate() {
                for s in 0..steps {
                    let sent = want[s].iter().filter(|v| **v != 0.0).count();
                    assert!(sent > 0, "{spec} P={world} step {s}: nothing sent");
                    for i in 0..len {
                        assert_eq!(
                            g[s][i].to_bits(),
                            want[s][i].to_bits(),
                            "{spec} P={world} rank {rank} step {s} element {i}: {} vs {}",
                            g[s][i],
                            want[s][i]
                        );
                    }
                }
            }
        }
    }
}

/// 1-bit SGD written out naively (Seide et al.): per column, `x = g + r`; entries `>= 0`
/// decode to the mean of the column's entries `>= 0`, the others to the mean of its entries
/// `< 0` (means in f64); the residual keeps `x - decoded`. Returns what the receiver decodes.
fn naive_onebit(g: &[f32], r: &mut Vec<f32>, cols: &[std::ops::Range<usize>]) -> Vec<f32> {
    r.resize(g.len(), 0.0);
    for (x, y) in r.iter_mut().zip(g) {
        *x += y;
    }
    let mut out = vec![0.0f32; g.len()];
    for col in cols {
        let x = &r[col.clone()];
        let mean = |pos: bool| {
            let v: Vec<f64> = x
                .iter()
                .filter(|v| (**v >= 0.0) == pos)
                .map(|v| f64::from(*v))
                .collect();
            if v.is_empty() {
                0.0
            } else {
                (v.iter().sum::<f64>() / v.len() as f64) as f32
            }
        };
        let (mp, mn) = (mean(true), mean(false));
        for i in col.clone() {
            out[i] = if r[i] >= 0.0 { mp } else { mn };
        }
    }
    for (x, o) in r.iter_mut().zip(&out) {
        *x -= o;
    }
    out
}

/// 1-bit SGD through the stripes (the `auto` route) equals the two-stage exchange written out
/// here with the naive quantizer above: each rank's slice quantized once with its own
/// residual (the owner's too), the decoded slices summed, the sum quantized once with the
/// owner's residual, all-gathered. Several steps (the residuals carry over), worlds 1..=5,
/// columns of 10 to 200 elements. Equal up to f32 rounding of the means (the codec sums in
/// 16 f32 lanes, the reference in f64): every sign agrees, so no entry changes side.
#[test]
fn stripe_onebit_matches_a_naive_two_stage_oracle() {
    let tensors = two_stage_tensors();
    let len: usize = tensors.iter().map(TensorInfo::numel).sum();
    let steps = 4;
    // Uniform floats with a scale per rank and step (none near 0 by more than chance).
    let grad = |q: usize, s: usize| -> Vec<f32> {
        let mut g = rand::rngs::StdRng::seed_from_u64((q * 389 + s) as u64);
        let scale = 1.0 + q as f32 * 0.5 + s as f32;
        (0..len)
            .map(|_| g.gen_range(-1.0f32..1.0) * scale)
            .collect()
    };
    let cfg: CodecConfig = "onebit".parse().unwrap();
    for world in 1..=5 {
        let want = two_stage_oracle(&cfg, &tensors, world, steps, &grad, &naive_onebit);
        let got = stripe_steps(&cfg, &tensors, world, steps, &grad);
        for (rank, g) in got.iter().enumerate() {
            for s in 0..steps {
                let distinct = {
                    let mut v: Vec<u32> = want[s].iter().map(|x| x.to_bits()).collect();
                    v.sort_unstable();
                    v.dedup();
                    v.len()
                };
                // Two values per column at most, and more than one column's worth overall.
                assert!(distinct > 2, "P={world} step {s}: {distinct} values");
                for i in 0..len {
                    let (a, b) = (g[s][i], want[s][i]);
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()) && (a >= 0.0) == (b >= 0.0),
                        "P={world} rank {rank} step {s} element {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
