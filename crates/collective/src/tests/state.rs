//! Saving and restoring the compressed all-reduces' state (`save_state` / `load_state`): a
//! run stopped after a few steps and resumed on freshly built all-reduces from the saved
//! bytes gives the uninterrupted run's bits, step for step; resuming without the state gives
//! other bits (so the comparison can fail); bad states are refused and change nothing.

use gradwire_codec::{BuildContext, CodecConfig, DecodeError, TensorInfo};
use gradwire_transport::Transport;
use rand::{Rng, SeedableRng};

use super::{local_world, run_world, small_model};
use crate::compressed::{Leg, PowerSgdAllReduce, QuantizedAllReduce, Reduce, StripeAllReduce};

const STEPS: usize = 6;
const STOP: usize = 3;
const SEED: u64 = 0x5ea7;

/// Values with fractional parts, so that rounding (and therefore any lost state) shows.
fn grad(rank: usize, step: usize, len: usize) -> Vec<f32> {
    let mut g = rand::rngs::StdRng::seed_from_u64((rank * 7919 + step * 31 + len) as u64);
    (0..len).map(|_| g.gen_range(-1.0f32..1.0)).collect()
}

fn len() -> usize {
    small_model([30, 12], [12, 10])
        .iter()
        .map(TensorInfo::numel)
        .sum()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Quantized,
    Stripe,
    PowerSgd,
}

/// One of the stateful all-reduces, built the same way on every call.
enum AllReduce {
    Quantized(QuantizedAllReduce),
    Stripe(StripeAllReduce),
    PowerSgd(PowerSgdAllReduce),
}

impl AllReduce {
    fn new(kind: Kind, cfg: &CodecConfig, rank: usize, world: usize) -> AllReduce {
        let n = len();
        let ctx = BuildContext::new(SEED, rank, world, Vec::new())
            .with_tensors(small_model([30, 12], [12, 10]));
        match kind {
            Kind::Quantized => {
                AllReduce::Quantized(QuantizedAllReduce::new(n, rank, world, |leg, chunk| {
                    let m = crate::chunks::range(n, world, chunk).len();
                    let salt = u64::from(leg == Leg::AllGather) << 40 | (chunk as u64) << 20;
                    cfg.build(&BuildContext::new(SEED ^ salt, rank, world, vec![m]))
                }))
            }
            Kind::Stripe => AllReduce::Stripe(StripeAllReduce::new(cfg, &ctx, n)),
            Kind::PowerSgd => {
                let CodecConfig::PowerSgd(c) = cfg else {
                    panic!("{cfg} is not powersgd")
                };
                AllReduce::PowerSgd(PowerSgdAllReduce::new(c, &ctx, n))
            }
        }
    }

    fn all_reduce(&mut self, t: &mut dyn Transport, g: &mut [f32]) {
        match self {
            AllReduce::Quantized(a) => a.all_reduce(t, g, Reduce::Mean),
            AllReduce::Stripe(a) => a.all_reduce(t, g, Reduce::Mean),
            AllReduce::PowerSgd(a) => a.all_reduce(t, g, Reduce::Mean),
        }
        .unwrap()
    }

    fn set_step(&mut self, step: usize, world: usize) {
        let p = gradwire_codec::Progress {
            step: step as u64,
            epoch: step as f32 * 0.25,
        };
        match self {
            AllReduce::Quantized(a) => {
                for c in 0..world {
                    a.rs_codec_mut(c).set_progress(p);
                }
                a.ag_codec_mut().set_progress(p);
            }
            AllReduce::Stripe(a) => a.set_progress(p),
            AllReduce::PowerSgd(_) => {}
        }
    }

    fn save(&self) -> Vec<u8> {
        match self {
            AllReduce::Quantized(a) => a.save_state(),
            AllReduce::Stripe(a) => a.save_state(),
            AllReduce::PowerSgd(a) => a.save_state(),
        }
    }

    fn load(&mut self, s: &[u8]) -> Result<(), DecodeError> {
        match self {
            AllReduce::Quantized(a) => a.load_state(s),
            AllReduce::Stripe(a) => a.load_state(s),
            AllReduce::PowerSgd(a) => a.load_state(s),
        }
    }
}

/// The cases: every dense quantizer of the examples under the stripes, those without a
/// shared scalar under the quantized ring, and PowerSGD as published.
fn cases() -> Vec<(Kind, CodecConfig)> {
    let mut out = Vec::new();
    for cfg in CodecConfig::examples() {
        if cfg.name() == "powersgd" {
            if let CodecConfig::PowerSgd(c) = &cfg {
                if !c.local {
                    out.push((Kind::PowerSgd, cfg.clone()));
                }
            }
            continue;
        }
        if cfg.sparsifies() || cfg.name() == "randomk" {
            continue;
        }
        out.push((Kind::Stripe, cfg.clone()));
        if !cfg.needs_shared_scalars() {
            out.push((Kind::Quantized, cfg));
        }
    }
    out.push((
        Kind::PowerSgd,
        "powersgd:rank=1,warm=false".parse().expect("spec parses"),
    ));
    out
}

/// Per rank, the outputs of steps `STOP..STEPS`: uninterrupted, resumed from the saved state
/// (the bytes crossing from the first all-reduce to a fresh one), and resumed fresh.
type Runs = (Vec<Vec<f32>>, Vec<Vec<f32>>, Vec<Vec<f32>>);

fn run(kind: Kind, cfg: &CodecConfig, world: usize) -> Vec<Runs> {
    run_world(local_world(world), |t| {
        let (rank, n) = (t.rank(), len());
        let mut steps = |a: &mut AllReduce, range: std::ops::Range<usize>| -> Vec<Vec<f32>> {
            range
                .map(|s| {
                    a.set_step(s, world);
                    let mut g = grad(rank, s, n);
                    a.all_reduce(t, &mut g);
                    g
                })
                .collect()
        };
        let mut whole = AllReduce::new(kind, cfg, rank, world);
        let want = steps(&mut whole, 0..STEPS).split_off(STOP);
        let mut first = AllReduce::new(kind, cfg, rank, world);
        steps(&mut first, 0..STOP);
        let saved = first.save();
        drop(first);
        let mut resumed = AllReduce::new(kind, cfg, rank, world);
        resumed.load(&saved).unwrap();
        assert_eq!(
            resumed.save(),
            saved,
            "{cfg}: saved state reloads as it was"
        );
        let got = steps(&mut resumed, STOP..STEPS);
        let mut fresh = AllReduce::new(kind, cfg, rank, world);
        let cold = steps(&mut fresh, STOP..STEPS);
        (want, got, cold)
    })
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|s| s.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// Resumed from the saved bytes, every later step is the uninterrupted run's, bit for bit,
/// for every case on 2 and 3 ranks; and for the cases that keep residuals, `Q`s or a step
/// count that matters, resuming without the state gives other bits.
#[test]
fn resumed_runs_are_bit_identical() {
    let mut differed = std::collections::BTreeSet::new();
    for world in [2, 3] {
        for (kind, cfg) in cases() {
            let out = run(kind, &cfg, world);
            for (rank, (want, got, cold)) in out.iter().enumerate() {
                assert_eq!(
                    bits(got),
                    bits(want),
                    "{kind:?} {cfg} P={world} rank {rank}"
                );
                if bits(cold) != bits(want) {
                    differed.insert(format!("{kind:?} {cfg}"));
                }
            }
        }
    }
    // Stateful cases, whose lost state must show: 1-bit SGD's and adaptive quantization's
    // residuals under both exchanges, PowerSGD's warm start and error. (QSGD's streams are
    // keyed by the step, so a fresh one already continues them.)
    for must in [
        "Stripe onebit",
        "Quantized onebit",
        "Stripe adaptive",
        "PowerSgd powersgd:rank=2",
    ] {
        assert!(
            differed.iter().any(|d| d.starts_with(must)),
            "{must}: a fresh all-reduce gave the resumed bits, so the test shows nothing \
             ({differed:?})"
        );
    }
}

/// A truncated state, a state with a byte changed in its framing, another all-reduce's state
/// and a state of another world size are refused with a `DecodeError`, and the all-reduce
/// keeps what it held.
#[test]
fn bad_states_are_refused_and_change_nothing() {
    let quantized = "onebit".parse::<CodecConfig>().unwrap();
    let powersgd = "powersgd:rank=2".parse::<CodecConfig>().unwrap();
    let cases = [
        (Kind::Quantized, quantized.clone()),
        (Kind::Stripe, quantized),
        (Kind::PowerSgd, powersgd),
    ];
    let saved: Vec<Vec<Vec<u8>>> = run_world(local_world(2), |t| {
        let rank = t.rank();
        cases
            .iter()
            .map(|(kind, cfg)| {
                let mut a = AllReduce::new(*kind, cfg, rank, 2);
                for s in 0..2 {
                    a.set_step(s, 2);
                    let mut g = grad(rank, s, len());
                    a.all_reduce(t, &mut g);
                }
                a.save()
            })
            .collect()
    });
    for (i, (kind, cfg)) in cases.iter().enumerate() {
        let good = &saved[0][i];
        let mut a = AllReduce::new(*kind, cfg, 0, 2);
        let before = a.save();
        let refuse = |a: &mut AllReduce, s: &[u8], what: &str| {
            assert!(a.load(s).is_err(), "{kind:?}: {what} accepted");
            assert_eq!(a.save(), before, "{kind:?}: {what} changed the state");
        };
        for cut in 0..good.len() {
            refuse(&mut a, &good[..cut], &format!("cut at {cut}"));
        }
        let mut long = good.clone();
        long.push(0);
        refuse(&mut a, &long, "a trailing byte");
        for at in 0..4 {
            let mut bad = good.clone();
            bad[at] ^= 0x20;
            refuse(&mut a, &bad, &format!("tag byte {at} changed"));
        }
        let other = &saved[0][(i + 1) % cases.len()];
        refuse(&mut a, other, "another all-reduce's state");
        // A state saved on 2 ranks, loaded on rank 0 of 3.
        let mut three = AllReduce::new(*kind, cfg, 0, 3);
        let before3 = three.save();
        if *kind != Kind::PowerSgd {
            assert!(three.load(good).is_err(), "{kind:?}: world of 3 accepted");
            assert_eq!(three.save(), before3);
        }
        a.load(good).unwrap();
        assert_eq!(&a.save(), good);
    }
    // A codec that refuses its part of a valid frame: the codecs loaded before it get their
    // own state back.
    let (kind, cfg) = &cases[1];
    let mut a = AllReduce::new(*kind, cfg, 0, 2);
    let before = a.save();
    let good = &saved[0][1];
    let mut bad = good.clone();
    // The owner codec's state is last: drop its final byte and fix its announced length.
    bad.pop();
    let owner_len_at = bad.len() - (owner_state_len(good) - 1) - 8;
    let announced = (owner_state_len(good) - 1) as u64;
    bad[owner_len_at..owner_len_at + 8].copy_from_slice(&announced.to_le_bytes());
    assert!(a.load(&bad).is_err());
    assert_eq!(a.save(), before, "a half-loaded state was kept");
}

/// The length of the last codec state in a quantized or stripe state (the owner's).
fn owner_state_len(state: &[u8]) -> usize {
    // tag, world, then (length, bytes) per codec: walk them.
    let world = u64::from_le_bytes(state[4..12].try_into().unwrap()) as usize;
    let mut at = 12;
    let mut last = 0;
    for _ in 0..=world {
        last = u64::from_le_bytes(state[at..at + 8].try_into().unwrap()) as usize;
        at += 8 + last;
    }
    assert_eq!(at, state.len());
    last
}
