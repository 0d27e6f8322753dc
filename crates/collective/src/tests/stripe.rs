//! The stripe-quantized all-reduce against a two-stage oracle written naively here: every
//! rank's slice quantized once, summed in rank order, the sum quantized once. For every dense
//! codec of `CodecConfig::examples()`, worlds 1..=8, over `Local` and TCP.

use gradwire_codec::{BuildContext, Codec, CodecConfig, SparseGrad, TensorInfo, TensorRole};
use rand::{Rng, SeedableRng};

use super::{for_each_transport, local_world, run_world, WorldFactory};
use crate::compressed::{
    GatherDecode, Leg, OwnContribution, QuantizedAllReduce, Reduce, StripeAllReduce, StripePlan,
};
use crate::{chunks, Collectives, Error, ReduceOp};

const STEPS: usize = 2;

/// Multiples of 0.25 in [-10, 10): every sum of up to 8 of them is exact in f32, in any order.
fn grad(rank: usize, step: usize, len: usize) -> Vec<f32> {
    let mut g = rand::rngs::StdRng::seed_from_u64(((rank * 131 + step) as u64) << 20 | len as u64);
    (0..len)
        .map(|_| g.gen_range(-40i32..40) as f32 * 0.25)
        .collect()
}

/// A small model with every role: conv, bias, linear, output.
fn small_model() -> Vec<TensorInfo> {
    use TensorRole::*;
    vec![
        TensorInfo::new([6, 1, 5, 5], ConvWeight),
        TensorInfo::new([6], Bias),
        TensorInfo::new([30, 12], LinearWeight),
        TensorInfo::new([12], Bias),
        TensorInfo::new([12, 10], Output),
        TensorInfo::new([10], Output),
    ]
}

/// The gradients the tests run: shaped (the small model) or not (plain lengths).
fn shapes() -> Vec<(usize, Vec<TensorInfo>)> {
    let m = small_model();
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
    let mut c = cfg.build(&BuildContext::single(0));
    !c.encode_sparse(&[1.0, -2.0, 0.5], &mut SparseGrad::default())
        && cfg.name() != "powersgd"
        && cfg.name() != "randomk"
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
                .filter_map(|q| local[q][j].local_scalars(&grads[q][r.clone()]))
                .reduce(|a, b| a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect());
            let mut sum = vec![0.0f32; r.len()];
            for q in 0..world {
                if q == j && own == OwnContribution::Exact {
                    for (s, g) in sum.iter_mut().zip(&grads[q][r.clone()]) {
                        *s += g;
                    }
                    continue;
                }
                if let Some(s) = &shared {
                    local[q][j].set_shared_scalars(s);
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
    let lenet = {
        use TensorRole::*;
        vec![
            TensorInfo::new([6, 1, 5, 5], ConvWeight),
            TensorInfo::new([6], Bias),
            TensorInfo::new([16, 6, 5, 5], ConvWeight),
            TensorInfo::new([16], Bias),
            TensorInfo::new([256, 120], LinearWeight),
            TensorInfo::new([120], Bias),
            TensorInfo::new([120, 84], LinearWeight),
            TensorInfo::new([84], Bias),
            TensorInfo::new([84, 10], Output),
            TensorInfo::new([10], Output),
        ]
    };
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
