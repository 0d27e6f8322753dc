//! Pre-encoded submissions ([`Engine::all_reduce_encoded`]): a rank that encodes with its own
//! codec, built from [`Engine::codec_context`], gets bit for bit what it gets when every
//! rank submits dense data (the engine's own encode, itself checked against the collective
//! layer's compressed all-reduces in `codecs.rs`), alone and fused, in worlds of 2 and 3;
//! and every refusal is a failed handle with its typed reason, the engine usable after.

use std::time::Duration;

use gradwire_codec::{Codec, CodecConfig, DecodeError, Progress, HEADER_LEN};
use gradwire_transport::Transport;

use super::{assert_steps_bitwise, grad, naive_mean, world};
use crate::{
    EncodedRefusal, Engine, EngineConfig, Error, MomentumConfig, Rule, Selector, Strategy,
    TensorSpec,
};

/// A bias, a matrix and a wider matrix.
const SHAPES: [&[usize]; 3] = [&[37], &[20, 15], &[64, 8]];
const STEPS: usize = 4;
/// From this step on, every tensor is submitted at once (fused).
const FUSED_FROM: usize = 2;

fn tensors() -> Vec<TensorSpec> {
    super::named_specs(&SHAPES)
}

fn lens() -> Vec<usize> {
    SHAPES.iter().map(|s| s.iter().product()).collect()
}

/// The test gradients, with exact zeros in them (a kept value may be 0.0).
fn data(rank: usize, step: usize, tensor: usize, len: usize) -> Vec<f32> {
    let mut g = grad(rank, step, tensor, len);
    for x in g.iter_mut().skip((step + tensor) % 5).step_by(5) {
        *x = 0.0;
    }
    g
}

/// Per rank, per step, per tensor: the engine's results when the ranks in `encoders`
/// encode every tensor themselves (a codec per tensor from `codec_context`, given the
/// engine's progress before each encode) and the others submit dense data. Steps before
/// [`FUSED_FROM`] submit and wait one tensor at a time; later ones submit all, then wait.
fn run(n: usize, cfg: &EngineConfig, encoders: &[usize]) -> Vec<Vec<Vec<Vec<f32>>>> {
    let tensors = tensors();
    world(n, |t| {
        let rank = t.rank();
        let e = Engine::start(t, cfg.clone(), &tensors).unwrap();
        let encodes = encoders.contains(&rank);
        let mut codecs: Vec<Box<dyn Codec>> = if encodes {
            tensors
                .iter()
                .map(|s| {
                    let (c, ctx) = e.codec_context(&s.name).expect("takes payloads");
                    c.build(&ctx)
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut submit = |step: usize, i: usize| {
            let g = data(rank, step, i, lens()[i]);
            let name = format!("t{i}");
            if encodes {
                let c = &mut codecs[i];
                c.set_progress(progress(step));
                let mut payload = Vec::new();
                c.encode(&g, &mut payload);
                e.all_reduce_encoded(&name, payload)
            } else {
                e.all_reduce(&name, g)
            }
        };
        let out = (0..STEPS)
            .map(|step| {
                e.set_progress(progress(step).step, progress(step).epoch);
                if step < FUSED_FROM {
                    (0..SHAPES.len())
                        .map(|i| submit(step, i).wait().unwrap())
                        .collect()
                } else {
                    let hs: Vec<_> = (0..SHAPES.len()).map(|i| submit(step, i)).collect();
                    e.flush();
                    hs.into_iter().map(|h| h.wait().unwrap()).collect()
                }
            })
            .collect();
        let (_, collectives, _) = e.rounds();
        assert!(
            collectives < (STEPS * SHAPES.len()) as u64,
            "rank {rank}: {collectives} collectives, so no step fused its tensors"
        );
        e.shutdown().unwrap();
        out
    })
}

fn progress(step: usize) -> Progress {
    Progress {
        step: step as u64,
        epoch: step as f32 * 0.5,
    }
}

fn config(spec: &str, strategy: Strategy) -> EngineConfig {
    EngineConfig {
        codec: spec.parse().unwrap(),
        strategy,
        seed: 0x5eed,
        // Long cycles: a burst starts when its ranks flush or wait, so it is fused.
        cycle_time: Duration::from_millis(20),
        ..Default::default()
    }
}

/// Dense data everywhere against payloads from rank 1 (and rank 2 in a world of 3), for
/// every sparse codec under `sparse` and dense and sparse codecs under `gather`.
#[test]
fn payloads_give_the_engines_own_results_bitwise() {
    let cases = [
        ("dgc:ratio=0.01", Strategy::Auto),
        ("topk:ratio=0.05,scope=tensor", Strategy::Auto),
        ("topk:ratio=0.05,scope=tensor,values=fp16", Strategy::Auto),
        ("threshold:tau=0.5", Strategy::Auto),
        ("randomk:ratio=0.1", Strategy::Auto),
        ("randomk:ratio=0.1,scale=false", Strategy::Auto),
        ("qsgd:bits=4", Strategy::Gather),
        ("onebit", Strategy::Gather),
        ("topk:ratio=0.05,scope=tensor", Strategy::Gather),
        ("signsgd", Strategy::Auto),
    ];
    for (spec, strategy) in cases {
        let cfg = config(spec, strategy);
        let want_strategy = cfg.plan(&tensors()).unwrap()[0].strategy;
        assert!(
            matches!(want_strategy, Strategy::Sparse | Strategy::Gather),
            "{spec}"
        );
        for n in [2, 3] {
            let dense = run(n, &cfg, &[]);
            assert!(
                dense
                    .iter()
                    .flatten()
                    .flatten()
                    .flatten()
                    .any(|&x| x != 0.0),
                "{spec}: the results are not all zero"
            );
            let encoders: &[&[usize]] = if n == 3 { &[&[1], &[1, 2]] } else { &[&[1]] };
            for &enc in encoders {
                let got = run(n, &cfg, enc);
                let label = format!("{spec} @{want_strategy}, world {n}, encoders {enc:?}");
                assert_steps_bitwise(&label, &got, |r| &dense[r]);
            }
        }
    }
}

/// A payload of other data than the dense run's changes the result: the comparison above
/// sees what the payload carries.
#[test]
fn a_payload_of_other_data_changes_the_result() {
    let cfg = config("topk:ratio=0.05,scope=tensor", Strategy::Auto);
    let tensors = tensors();
    let results = |scale: f32| {
        world(2, |t| {
            let rank = t.rank();
            let e = Engine::start(t, cfg.clone(), &tensors).unwrap();
            let g = data(rank, 0, 1, 300);
            let h = if rank == 1 {
                let (c, ctx) = e.codec_context("t1").unwrap();
                let mut p = Vec::new();
                let scaled: Vec<f32> = g.iter().map(|x| x * scale).collect();
                c.build(&ctx).encode(&scaled, &mut p);
                e.all_reduce_encoded("t1", p)
            } else {
                e.all_reduce("t1", g)
            };
            let r = h.wait().unwrap();
            e.shutdown().unwrap();
            r
        })
    };
    assert_eq!(results(1.0), results(1.0));
    assert_ne!(results(1.0), results(2.0));
}

fn rule(name: &str, spec: &str, strategy: Strategy) -> Rule {
    Rule {
        select: Selector::Name(name.into()),
        codec: spec.parse().unwrap(),
        strategy,
    }
}

/// `t0` dense, `t1` top-k (sparse), `t2` TernGrad (gather), `t3` QSGD (gather), `t4` and
/// `t5` one global top-k selection unit (sparse).
fn mixed() -> (EngineConfig, Vec<TensorSpec>) {
    let cfg = EngineConfig {
        rules: vec![
            rule("t0", "none", Strategy::Auto),
            rule("t1", "topk:ratio=0.05,scope=tensor", Strategy::Auto),
            rule("t2", "terngrad", Strategy::Gather),
            rule("t3", "qsgd:bits=4", Strategy::Gather),
            rule("t4", "topk:ratio=0.05", Strategy::Sparse),
            rule("t5", "topk:ratio=0.05", Strategy::Sparse),
        ],
        seed: 7,
        ..Default::default()
    };
    let specs = super::named_specs(&[&[37], &[20, 15], &[64], &[30], &[40], &[50]]);
    (cfg, specs)
}

/// The refusal in `h`'s result, which must fail at once naming `tensor`.
fn refusal(h: crate::Handle, tensor: &str) -> EncodedRefusal {
    assert!(h.test(), "{tensor}: a refusal completes the handle at once");
    match h.wait() {
        Err(Error::EncodedRefused { tensor: t, reason }) => {
            assert_eq!(t, tensor);
            reason
        }
        other => panic!("{tensor}: expected a refusal, got {other:?}"),
    }
}

fn payload_of(spec: &str, len: usize) -> Vec<u8> {
    let cfg: CodecConfig = spec.parse().unwrap();
    let mut p = Vec::new();
    cfg.build(&gradwire_codec::BuildContext::single(1))
        .encode(&grad(0, 0, 0, len), &mut p);
    p
}

/// Every refusal: an unregistered name, a dense tensor, TernGrad, a selection unit, a
/// payload of another codec, of another length, truncated, and with a bad body (sparse and
/// gather); each fails its handle at once with its reason, and both ranks then reduce
/// normally, with and without a payload.
#[test]
fn refusals_fail_the_handle_and_leave_the_engine_usable() {
    let (cfg, specs) = mixed();
    let out = world(2, |t| {
        let rank = t.rank();
        let e = Engine::start(t, cfg.clone(), &specs).unwrap();
        for name in ["t0", "t2", "t4", "t5", "nope"] {
            assert!(e.codec_context(name).is_none(), "{name}");
        }
        let (c1, ctx1) = e.codec_context("t1").unwrap();
        let want: CodecConfig = "topk:ratio=0.05,scope=tensor".parse().unwrap();
        assert_eq!(c1, want);
        let seed = crate::tensor_seed(7, 1);
        assert_eq!((ctx1.seed, ctx1.rank, ctx1.world_size), (seed, rank, 2));
        assert_eq!(ctx1.layout, vec![300]);
        assert!(e.codec_context("t3").is_some());
        if rank == 1 {
            let topk = payload_of("topk:ratio=0.05,scope=tensor", 300);
            let r = |name: &str, p: Vec<u8>| refusal(e.all_reduce_encoded(name, p), name);
            assert_eq!(r("nope", topk.clone()), EncodedRefusal::NotRegistered);
            assert_eq!(
                r("t0", payload_of("none", 37)),
                EncodedRefusal::Strategy(Strategy::Dense)
            );
            assert!(matches!(
                r("t2", payload_of("terngrad", 64)),
                EncodedRefusal::SharedScalars(s) if s.starts_with("terngrad")
            ));
            assert_eq!(
                r("t4", payload_of("topk:ratio=0.05", 40)),
                EncodedRefusal::SelectionUnit
            );
            assert!(matches!(
                r("t1", payload_of("qsgd:bits=4", 300)),
                EncodedRefusal::Payload(DecodeError::WrongCodec { found: 7, .. })
            ));
            assert!(matches!(
                r("t1", payload_of("topk:ratio=0.05,scope=tensor", 299)),
                EncodedRefusal::Payload(DecodeError::LengthMismatch {
                    expected: 300,
                    found: 299
                })
            ));
            for cut in [0, HEADER_LEN - 1, HEADER_LEN + 5, topk.len() - 1] {
                assert!(matches!(
                    r("t1", topk[..cut].to_vec()),
                    EncodedRefusal::Payload(DecodeError::Truncated { .. })
                ));
            }
            // The last index, plain u32 or a delta varint, pointed past the tensor.
            let mut bad = topk.clone();
            let last = bad.len() - 1;
            bad[last] = 0x7f;
            assert!(matches!(
                r("t1", bad),
                EncodedRefusal::Payload(
                    DecodeError::IndexOutOfRange { .. } | DecodeError::InvalidField { .. }
                )
            ));
            let qsgd = payload_of("qsgd:bits=4", 30);
            assert!(matches!(
                r("t3", qsgd[..qsgd.len() - 1].to_vec()),
                EncodedRefusal::Payload(_)
            ));
        }
        // Usable after: dense everywhere, then a payload from rank 1.
        let g0 = grad(rank, 1, 0, 37);
        let dense = e.all_reduce("t0", g0).wait().unwrap();
        let g1 = grad(rank, 1, 1, 300);
        let sparse = if rank == 1 {
            let (c, ctx) = e.codec_context("t1").unwrap();
            let mut p = Vec::new();
            c.build(&ctx).encode(&g1, &mut p);
            e.all_reduce_encoded("t1", p).wait().unwrap()
        } else {
            e.all_reduce("t1", g1).wait().unwrap()
        };
        e.shutdown().unwrap();
        (dense, sparse)
    });
    let inputs: Vec<_> = (0..2).map(|r| grad(r, 1, 0, 37)).collect();
    for (dense, sparse) in &out {
        assert_eq!(*dense, naive_mean(&inputs));
        assert_eq!(sparse.len(), 300);
        assert!(sparse.iter().any(|&x| x != 0.0));
    }
    assert_eq!(out[0].1, out[1].1, "every rank holds the same mean");
}

/// With momentum correction on, no tensor takes payloads; the engine reduces normally.
#[test]
fn momentum_correction_refuses_payloads() {
    let cfg = EngineConfig {
        codec: "topk:ratio=0.05,scope=tensor".parse().unwrap(),
        momentum: Some(MomentumConfig {
            beta: 0.9,
            nesterov: false,
            masking: true,
        }),
        ..Default::default()
    };
    let specs = tensors();
    let out = world(2, |t| {
        let rank = t.rank();
        let e = Engine::start(t, cfg.clone(), &specs).unwrap();
        assert!(e.codec_context("t1").is_none());
        let p = payload_of("topk:ratio=0.05,scope=tensor", 300);
        assert_eq!(
            refusal(e.all_reduce_encoded("t1", p), "t1"),
            EncodedRefusal::Momentum
        );
        let r = e.all_reduce("t1", grad(rank, 0, 1, 300)).wait().unwrap();
        e.shutdown().unwrap();
        r
    });
    assert_eq!(out[0], out[1]);
    assert!(out[0].iter().any(|&x| x != 0.0));
}

/// Dense tensors riding the speculative round beside pre-encoded sparse and gather tensors
/// in the same bursts: every result equals the all-dense-data run's, bit for bit, and the
/// speculative round still runs.
#[test]
fn payloads_beside_the_speculative_round() {
    let cfg = EngineConfig {
        rules: vec![
            rule("t0", "none", Strategy::Auto),
            rule("t1", "topk:ratio=0.05,scope=tensor", Strategy::Auto),
            rule("t2", "qsgd:bits=4", Strategy::Gather),
        ],
        seed: 3,
        ..Default::default()
    };
    let specs = tensors();
    let run = |encoder: Option<usize>| {
        world(2, |t| {
            let rank = t.rank();
            let e = Engine::start(t, cfg.clone(), &specs).unwrap();
            let mut codecs: Vec<Box<dyn Codec>> = ["t1", "t2"]
                .iter()
                .map(|n| {
                    let (c, ctx) = e.codec_context(n).unwrap();
                    c.build(&ctx)
                })
                .collect();
            let out: Vec<Vec<Vec<f32>>> = (0..STEPS)
                .map(|step| {
                    e.set_progress(step as u64, 0.0);
                    let mut hs = vec![e.all_reduce("t0", data(rank, step, 0, 37))];
                    for (i, c) in codecs.iter_mut().enumerate() {
                        let (name, len) = (format!("t{}", i + 1), lens()[i + 1]);
                        let g = data(rank, step, i + 1, len);
                        hs.push(if encoder == Some(rank) {
                            c.set_progress(Progress {
                                step: step as u64,
                                epoch: 0.0,
                            });
                            let mut p = Vec::new();
                            c.encode(&g, &mut p);
                            e.all_reduce_encoded(&name, p)
                        } else {
                            e.all_reduce(&name, g)
                        });
                    }
                    e.flush();
                    hs.into_iter().map(|h| h.wait().unwrap()).collect()
                })
                .collect();
            let spec = e.stats().speculative_rounds;
            e.shutdown().unwrap();
            (out, spec)
        })
    };
    let dense = run(None);
    let got = run(Some(1));
    for (r, ((d, _), (g, spec))) in dense.iter().zip(&got).enumerate() {
        assert!(
            *spec > 0,
            "rank {r}: the dense tensor rode the negotiation round"
        );
        let label = format!("beside the speculative round, rank {r}");
        assert_steps_bitwise(&label, std::slice::from_ref(g), |_| d.as_slice());
    }
}
