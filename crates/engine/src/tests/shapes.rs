//! Shapes and roles reach the codecs; the stripe and PowerSGD strategies against
//! `StripeAllReduce` / `PowerSgdAllReduce` run directly; what `Auto` picks; refused pairs.

use gradwire_codec::{BuildContext, CodecConfig, Progress, TensorRole};
use gradwire_collective::compressed::{PowerSgdAllReduce, Reduce, StripeAllReduce};
use gradwire_transport::Transport;

use super::{bits, grad, naive_mean, world};
use crate::{tensor_seed, Engine, EngineConfig, Error, Strategy, TensorSpec};

const SEED: u64 = 0x5eed;
const STEPS: usize = 3;

/// A LeNet-like list with every role (burn's layouts).
fn model() -> Vec<TensorSpec> {
    use TensorRole::*;
    vec![
        TensorSpec::new("conv.weight", [6, 2, 3, 3]).with_role(ConvWeight),
        TensorSpec::new("conv.bias", [6]),
        TensorSpec::new("fc.weight", [24, 16]).with_role(LinearWeight),
        TensorSpec::new("fc.bias", [16]),
        TensorSpec::new("out.weight", [16, 10]).with_role(Output),
        TensorSpec::new("out.bias", [10]).with_role(Output),
    ]
}

fn engine_run(n: usize, cfg: &EngineConfig, tensors: &[TensorSpec]) -> Vec<Vec<Vec<Vec<f32>>>> {
    world(n, |t| {
        let rank = t.rank();
        let e = Engine::start(t, cfg.clone(), tensors).unwrap();
        let out = (0..STEPS)
            .map(|step| {
                e.set_progress(step as u64, step as f32);
                let hs = e.all_reduce_batch(
                    tensors
                        .iter()
                        .enumerate()
                        .map(|(i, s)| (s.name.clone(), grad(rank, step, i, s.len()))),
                );
                hs.into_iter().map(|h| h.wait().unwrap()).collect()
            })
            .collect();
        e.shutdown().unwrap();
        out
    })
}

fn shaped_ctx(rank: usize, world: usize, i: usize, s: &TensorSpec) -> BuildContext {
    BuildContext::new(tensor_seed(SEED, i), rank, world, vec![s.len()]).with_tensors(vec![s.info()])
}

fn compare(label: &str, got: &[Vec<Vec<Vec<f32>>>], want: &[Vec<Vec<Vec<f32>>>]) {
    assert_eq!(got.len(), want.len());
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        for step in 0..STEPS {
            for i in 0..g[step].len() {
                assert_eq!(
                    bits(&g[step][i]),
                    bits(&w[step][i]),
                    "{label}: rank {r} step {step} tensor {i}"
                );
            }
        }
    }
}

#[test]
fn stripe_through_the_engine_equals_stripe_all_reduce_on_worlds_1_to_5() {
    let tensors = model();
    for spec in [
        "onebit",
        "adaptive",
        "qsgd",
        "fp16",
        "bf16",
        "terngrad@stripe",
        "signsgd@stripe",
        "onebit:column=0,ef=false",
        "dgc:ratio=0.01@gather",
    ] {
        let (codec, strategy) = match spec.split_once('@') {
            Some((c, s)) => (c, s.parse().unwrap()),
            None => (spec, Strategy::Auto),
        };
        let codec: CodecConfig = codec.parse().unwrap();
        let cfg = EngineConfig {
            codec: codec.clone(),
            strategy,
            seed: SEED,
            ..Default::default()
        };
        let resolved = cfg.plan(&tensors).unwrap()[0].strategy;
        if resolved != Strategy::Stripe {
            continue; // dgc: not a stripe codec (see the refusal test)
        }
        for n in 1..=5 {
            let got = engine_run(n, &cfg, &tensors);
            let want = world(n, |mut t| {
                let (rank, p) = (t.rank(), t.world_size());
                let mut ex: Vec<StripeAllReduce> = tensors
                    .iter()
                    .enumerate()
                    .map(|(i, s)| StripeAllReduce::new(&codec, &shaped_ctx(rank, p, i, s), s.len()))
                    .collect();
                (0..STEPS)
                    .map(|step| {
                        ex.iter_mut()
                            .enumerate()
                            .map(|(i, x)| {
                                x.set_progress(Progress {
                                    step: step as u64,
                                    epoch: step as f32,
                                });
                                let mut g = grad(rank, step, i, tensors[i].len());
                                x.all_reduce(&mut t, &mut g, Reduce::Mean).unwrap();
                                g
                            })
                            .collect()
                    })
                    .collect()
            });
            compare(&format!("{spec} P={n}"), &got, &want);
        }
    }
}

#[test]
fn powersgd_through_the_engine_equals_powersgd_all_reduce_on_worlds_1_to_5() {
    let tensors = model();
    for spec in [
        "powersgd",
        "powersgd:rank=2,warm=false",
        "powersgd:rank=1,ef=false",
    ] {
        let codec: CodecConfig = spec.parse().unwrap();
        let CodecConfig::PowerSgd(pc) = &codec else {
            unreachable!()
        };
        let cfg = EngineConfig {
            codec: codec.clone(),
            seed: SEED,
            ..Default::default()
        };
        assert!(cfg
            .plan(&tensors)
            .unwrap()
            .iter()
            .all(|p| p.strategy == Strategy::PowerSgd));
        for n in 1..=5 {
            let got = engine_run(n, &cfg, &tensors);
            let want = world(n, |mut t| {
                let (rank, p) = (t.rank(), t.world_size());
                let mut ex: Vec<PowerSgdAllReduce> = tensors
                    .iter()
                    .enumerate()
                    .map(|(i, s)| PowerSgdAllReduce::new(pc, &shaped_ctx(rank, p, i, s), s.len()))
                    .collect();
                (0..STEPS)
                    .map(|step| {
                        ex.iter_mut()
                            .enumerate()
                            .map(|(i, x)| {
                                let mut g = grad(rank, step, i, tensors[i].len());
                                x.all_reduce(&mut t, &mut g, Reduce::Mean).unwrap();
                                g
                            })
                            .collect()
                    })
                    .collect()
            });
            compare(&format!("{spec} P={n}"), &got, &want);
        }
    }
}

#[test]
fn auto_routes_quantizers_to_stripe_and_powersgd_to_its_all_reduce() {
    let table = [
        ("none", Strategy::Dense),
        ("none:ef=true", Strategy::Gather),
        ("onebit", Strategy::Stripe),
        ("adaptive", Strategy::Stripe),
        ("qsgd", Strategy::Stripe),
        ("fp16", Strategy::Stripe),
        ("bf16", Strategy::Stripe),
        ("terngrad", Strategy::Gather),
        ("signsgd", Strategy::Gather),
        ("powersgd", Strategy::PowerSgd),
        ("powersgd:variant=local", Strategy::Gather),
        ("topk:ratio=0.1", Strategy::Sparse),
        ("dgc", Strategy::Sparse),
    ];
    for (spec, want) in table {
        let codec: CodecConfig = spec.parse().unwrap();
        assert_eq!(Strategy::Auto.resolve(&codec), want, "{spec}");
    }
    for s in ["stripe", "powersgd", "quantized"] {
        assert_eq!(s.parse::<Strategy>().unwrap().to_string(), s);
    }
    // Quantized stays selectable explicitly.
    let cfg = EngineConfig {
        codec: "onebit".parse().unwrap(),
        rules: vec!["dims=1=>fp16@quantized".parse().unwrap()],
        ..Default::default()
    };
    let p = cfg.plan(&model()).unwrap();
    assert_eq!(p[0].strategy, Strategy::Stripe);
    assert_eq!(p[1].strategy, Strategy::Quantized);
}

#[test]
fn invalid_stripe_and_powersgd_pairs_are_refused() {
    for (codec, strategy) in [
        ("none", Strategy::Stripe),
        ("topk:ratio=0.1", Strategy::Stripe),
        ("dgc", Strategy::Stripe),
        ("powersgd", Strategy::Stripe),
        ("onebit", Strategy::PowerSgd),
        ("powersgd:variant=local", Strategy::PowerSgd),
        ("none", Strategy::PowerSgd),
    ] {
        let cfg = EngineConfig {
            codec: codec.parse().unwrap(),
            strategy,
            ..Default::default()
        };
        assert!(
            matches!(cfg.plan(&model()), Err(Error::Incompatible { .. })),
            "{codec}@{strategy}"
        );
    }
}

#[test]
fn stripe_sends_fewer_bytes_than_gather_for_onebit() {
    let tensors = model();
    let bytes = |strategy| {
        let cfg = EngineConfig {
            codec: "onebit".parse().unwrap(),
            strategy,
            ..Default::default()
        };
        let per_rank = world(4, |t| {
            let rank = t.rank();
            let e = Engine::start(t, cfg.clone(), &tensors).unwrap();
            let hs = e.all_reduce_batch(
                tensors
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (s.name.clone(), grad(rank, 0, i, s.len()))),
            );
            hs.into_iter().for_each(|h| drop(h.wait().unwrap()));
            let b = e.stats().bytes.wire_bytes;
            e.shutdown().unwrap();
            b
        });
        per_rank.iter().sum::<u64>()
    };
    let (stripe, gather) = (bytes(Strategy::Stripe), bytes(Strategy::Gather));
    assert!(stripe < gather, "stripe {stripe} vs gather {gather}");
}

/// Multiples of 0.25: sums exact in any order.
fn exact(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + rank * 13) % 41) as f32 * 0.25 - 5.0)
        .collect()
}

#[test]
fn dgc_sends_a_1d_tensor_dense_and_sparsifies_a_matrix() {
    let tensors = vec![TensorSpec::new("b", [300]), TensorSpec::new("w", [20, 15])];
    let cfg = EngineConfig {
        codec: "dgc:ratio=0.01,warmup_epochs=0".parse().unwrap(),
        ..Default::default()
    };
    for n in [1, 2, 3] {
        let out = world(n, |t| {
            let rank = t.rank();
            let e = Engine::start(t, cfg.clone(), &tensors).unwrap();
            let b = e.all_reduce("b", exact(rank, 300));
            let w = e.all_reduce("w", exact(rank, 300));
            let r = (b.wait().unwrap(), w.wait().unwrap());
            e.shutdown().unwrap();
            r
        });
        let inputs: Vec<_> = (0..n).map(|r| exact(r, 300)).collect();
        let mean = naive_mean(&inputs);
        for (b, w) in out {
            assert_eq!(bits(&b), bits(&mean), "1-D tensor dense, P={n}");
            let nonzero = w.iter().filter(|x| **x != 0.0).count();
            assert!(nonzero <= 3 * n, "matrix sparsified, P={n}: {nonzero}");
        }
    }
}

#[test]
fn terngrad_keeps_an_output_tensor_exact() {
    let tensors = vec![
        TensorSpec::new("out.weight", [20, 10]).with_role(TensorRole::Output),
        TensorSpec::new("fc.weight", [20, 10]).with_role(TensorRole::LinearWeight),
    ];
    for strategy in [Strategy::Auto, Strategy::Stripe] {
        let cfg = EngineConfig {
            codec: "terngrad".parse().unwrap(),
            strategy,
            ..Default::default()
        };
        for n in [1, 2, 3] {
            let out = world(n, |t| {
                let rank = t.rank();
                let e = Engine::start(t, cfg.clone(), &tensors).unwrap();
                let hs = e.all_reduce_batch(vec![
                    ("out.weight", grad(rank, 0, 0, 200)),
                    ("fc.weight", grad(rank, 0, 1, 200)),
                ]);
                let r: Vec<_> = hs.into_iter().map(|h| h.wait().unwrap()).collect();
                e.shutdown().unwrap();
                r
            });
            let inputs: Vec<_> = (0..n).map(|r| grad(r, 0, 0, 200)).collect();
            let mean = naive_mean(&inputs);
            let others: Vec<_> = (0..n).map(|r| grad(r, 0, 1, 200)).collect();
            let other_mean = naive_mean(&others);
            for r in out {
                assert_eq!(bits(&r[0]), bits(&mean), "{strategy} P={n}: output exact");
                assert_ne!(
                    bits(&r[1]),
                    bits(&other_mean),
                    "{strategy} P={n}: ternarized"
                );
            }
        }
    }
}
