//! Saving and restoring a rank's synchronization state: engines stopped after `STOP` steps,
//! their states saved (as bytes), shut down, and fresh engines loaded with them give the
//! uninterrupted run's bits for every later step; fresh engines without the state give other
//! bits for the stateful codecs (so the comparison can fail); damaged, truncated and
//! mismatched states are refused with typed errors and change nothing.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use gradwire_codec::CodecConfig;
use gradwire_transport::local::Local;
use gradwire_transport::Transport;

use super::{assert_steps_bitwise, bits, grad, world, Killable};
use crate::{
    Engine, EngineConfig, EngineState, Error, MomentumConfig, StateFormatError, Strategy,
    TensorSpec,
};

/// A 1-D tensor (a bias) and a matrix (columns, PowerSGD's low rank).
const SHAPES: [&[usize]; 2] = [&[37], &[20, 15]];
const STEPS: usize = 6;
const STOP: usize = 3;
const SEED: u64 = 0x57a7e;

/// Per rank, per step, per tensor.
type Outputs = Vec<Vec<Vec<Vec<f32>>>>;

fn tensors() -> Vec<TensorSpec> {
    super::named_specs(&SHAPES)
}

fn config(codec: &CodecConfig, strategy: Strategy, momentum: bool) -> EngineConfig {
    EngineConfig {
        codec: codec.clone(),
        strategy,
        seed: SEED,
        momentum: momentum.then_some(MomentumConfig {
            beta: 0.5,
            nesterov: false,
            masking: true,
        }),
        ..Default::default()
    }
}

/// One step on every tensor: progress set, gradients submitted as a batch, every handle
/// waited on.
fn step(e: &Engine, rank: usize, s: usize) -> Vec<Vec<f32>> {
    e.set_progress(s as u64, s as f32 * 0.5);
    let batch = SHAPES.iter().enumerate().map(|(i, shape)| {
        let len = shape.iter().product();
        (format!("t{i}"), grad(rank, s, i, len))
    });
    e.all_reduce_batch(batch)
        .into_iter()
        .map(|h| h.wait().unwrap())
        .collect()
}

fn start(t: Local, cfg: &EngineConfig) -> Engine {
    Engine::start(t, cfg.clone(), &tensors()).unwrap()
}

/// Steps `steps` on fresh engines, after loading `states[rank]` when given.
fn run(cfg: &EngineConfig, steps: std::ops::Range<usize>, states: Option<&[Vec<u8>]>) -> Outputs {
    world(2, |t| {
        let rank = t.rank();
        let e = start(t, cfg);
        if let Some(states) = states {
            let s = EngineState::from_bytes(&states[rank]).unwrap();
            e.load_state(&s).unwrap();
        }
        let out = steps.clone().map(|s| step(&e, rank, s)).collect();
        e.shutdown().unwrap();
        out
    })
}

/// Steps `0..STOP`, then every rank's saved state as bytes.
fn first_part(cfg: &EngineConfig) -> Vec<Vec<u8>> {
    world(2, |t| {
        let rank = t.rank();
        let e = start(t, cfg);
        for s in 0..STOP {
            step(&e, rank, s);
        }
        let state = e.save_state().unwrap();
        assert_eq!((state.rank, state.step), (rank, STOP as u64 - 1));
        e.shutdown().unwrap();
        state.to_bytes()
    })
}

/// The uninterrupted run's steps `STOP..STEPS`, and the resumed run's.
fn whole_and_resumed(cfg: &EngineConfig) -> (Outputs, Outputs) {
    let mut whole = run(cfg, 0..STEPS, None);
    for r in &mut whole {
        r.drain(..STOP);
    }
    let states = first_part(cfg);
    (whole, run(cfg, STOP..STEPS, Some(&states)))
}

/// The cases: every example codec under its automatic strategy (global-scope top-k forms a
/// selection unit of both tensors), one with momentum correction, and the strategies `Auto`
/// does not pick: the quantized ring, and gather for a sparsifier.
fn cases() -> Vec<(String, EngineConfig)> {
    let mut out: Vec<(String, EngineConfig)> = CodecConfig::examples()
        .into_iter()
        .map(|c| (c.to_string(), config(&c, Strategy::Auto, false)))
        .collect();
    let parse = |s: &str| s.parse::<CodecConfig>().unwrap();
    out.push((
        "topk with momentum".into(),
        config(&parse("topk"), Strategy::Auto, true),
    ));
    out.push((
        "dgc with momentum under gather".into(),
        config(&parse("dgc:momentum=0.5"), Strategy::Gather, true),
    ));
    out.push((
        "onebit quantized".into(),
        config(&parse("onebit"), Strategy::Quantized, false),
    ));
    out.push((
        "adaptive quantized".into(),
        config(&parse("adaptive"), Strategy::Quantized, false),
    ));
    out.push((
        "topk gather".into(),
        config(&parse("topk"), Strategy::Gather, false),
    ));
    out
}

/// For every case, the steps after resuming from the saved states are bit-identical to
/// the uninterrupted run's.
#[test]
fn resumed_engines_match_the_uninterrupted_run() {
    for (label, cfg) in cases() {
        let (whole, resumed) = whole_and_resumed(&cfg);
        assert_steps_bitwise(&label, &resumed, |r| &whole[r]);
    }
}

/// Without the state, fresh engines give other bits for the stateful codecs (top-k's and
/// DGC's residuals, 1-bit SGD's error feedback, PowerSGD's warm start, momentum correction's
/// velocity): what makes the comparison above able to fail.
#[test]
fn resuming_without_the_state_differs() {
    let parse = |s: &str| s.parse::<CodecConfig>().unwrap();
    for (label, cfg) in [
        ("topk", config(&parse("topk"), Strategy::Auto, false)),
        (
            "dgc",
            config(
                &parse("dgc:ratio=0.01,momentum=0.5,warmup_epochs=0"),
                Strategy::Auto,
                false,
            ),
        ),
        ("onebit", config(&parse("onebit"), Strategy::Auto, false)),
        (
            "powersgd",
            config(&parse("powersgd:rank=2"), Strategy::Auto, false),
        ),
        (
            "onebit quantized",
            config(&parse("onebit"), Strategy::Quantized, false),
        ),
        ("momentum", config(&parse("none"), Strategy::Dense, true)),
    ] {
        let (whole, _) = whole_and_resumed(&cfg);
        let cold = run(&cfg, STOP..STEPS, None);
        let same = whole.iter().zip(&cold).all(|(w, c)| {
            w.iter()
                .zip(c)
                .all(|(ws, cs)| ws.iter().zip(cs).all(|(a, b)| bits(a) == bits(b)))
        });
        assert!(!same, "{label}: a fresh engine gave the resumed bits");
    }
}

/// Elastic training: a state loaded elsewhere (`Engine::load_state_elsewhere`) on the rank
/// and world that saved it is the exact load (nothing reset, the uninterrupted run's bits);
/// moved to another rank of a smaller world (rank 1's state on a world of one, as after a
/// loss) it loads for every case, and where a state carries something and none was reset
/// for a codec that keeps residuals or a warm start (or under momentum correction), the
/// next output differs from a fresh engine's.
#[test]
fn states_load_elsewhere_keeping_what_fits() {
    for (label, cfg) in cases() {
        let states = first_part(&cfg);
        let mut whole = run(&cfg, 0..STEPS, None);
        for r in &mut whole {
            r.drain(..STOP);
        }
        let here = world(2, |t| {
            let rank = t.rank();
            let e = start(t, &cfg);
            let s = EngineState::from_bytes(&states[rank]).unwrap();
            assert_eq!(e.load_state_elsewhere(&s).unwrap(), Vec::<String>::new());
            let out: Vec<_> = (STOP..STEPS).map(|s| step(&e, rank, s)).collect();
            e.shutdown().unwrap();
            out
        });
        assert_steps_bitwise(&label, &here, |r| &whole[r]);
        let moved = world(1, |t| {
            let e = start(t, &cfg);
            let s = EngineState::from_bytes(&states[1]).unwrap();
            let reset = e.load_state_elsewhere(&s).unwrap();
            let out = step(&e, 0, STOP);
            e.shutdown().unwrap();
            (reset, out)
        })
        .pop()
        .unwrap();
        let fresh = world(1, |t| {
            let e = start(t, &cfg);
            let out = step(&e, 0, STOP);
            e.shutdown().unwrap();
            out
        })
        .pop()
        .unwrap();
        let (reset, out) = moved;
        // Residuals (error feedback), warm starts and velocity: what a moved state carries.
        let saved = EngineState::from_bytes(&states[1]).unwrap();
        let stateful = saved.tensors.iter().any(|t| t.velocity.is_some())
            || (["topk", "dgc", "onebit", "powersgd"]
                .iter()
                .any(|c| label.starts_with(c))
                && !label.contains("ef=false"));
        if stateful && reset.is_empty() {
            let same = out.iter().zip(&fresh).all(|(a, b)| bits(a) == bits(b));
            assert!(!same, "{label}: the moved state changed nothing");
        }
        assert!(
            reset.iter().all(|n| n == "t0" || n == "t1"),
            "{label}: {reset:?}"
        );
    }
}

/// Every prefix of a real saved state is refused as truncated, every flipped byte is
/// refused (the header's fields, or the checksum), and the errors are typed.
#[test]
fn damaged_state_bytes_are_refused() {
    let cfg = config(&"topk".parse().unwrap(), Strategy::Auto, true);
    let bytes = first_part(&cfg).swap_remove(0);
    let s = EngineState::from_bytes(&bytes).unwrap();
    assert_eq!(s.tensors.len(), 2);
    // The selection unit's codec is saved with its first tensor; the other carries none.
    assert!(!s.tensors[0].state.is_empty());
    assert!(s.tensors[1].state.is_empty());
    assert_eq!(s.tensors[1].velocity.as_ref().map(Vec::len), Some(300));
    for cut in 0..bytes.len() {
        let e = EngineState::from_bytes(&bytes[..cut]).unwrap_err();
        assert!(
            matches!(e, StateFormatError::Truncated { .. })
                || (cut < 4 && matches!(e, StateFormatError::BadMagic { .. })),
            "cut at {cut}: {e}"
        );
    }
    for at in (0..bytes.len()).step_by(7).chain(0..24) {
        let mut bad = bytes.clone();
        bad[at] ^= 0x10;
        assert!(EngineState::from_bytes(&bad).is_err(), "byte {at} flipped");
    }
    let mut bad = bytes.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(
        EngineState::from_bytes(&bad),
        Err(StateFormatError::BadChecksum { .. })
    ));
    // Through the engine's error type too.
    let e: Error = EngineState::from_bytes(&bytes[..10]).unwrap_err().into();
    assert!(matches!(e, Error::StateFormat(_)), "{e}");
}

/// States that do not fit are refused with typed errors naming the tensor (or the engine's
/// field), and change nothing: after every refusal, the engine continues exactly as the
/// uninterrupted run.
#[test]
fn mismatched_states_are_refused_and_change_nothing() {
    let dgc: CodecConfig = "dgc:ratio=0.01,momentum=0.5,warmup_epochs=0"
        .parse()
        .unwrap();
    let cfg = config(&dgc, Strategy::Auto, true);
    let other_codec = first_part(&config(&"topk".parse().unwrap(), Strategy::Auto, true));
    let saved = first_part(&cfg);
    let mut whole = run(&cfg, 0..STEPS, None);
    for r in &mut whole {
        r.drain(..STOP);
    }
    let got = world(2, |t| {
        let rank = t.rank();
        let e = start(t, &cfg);
        let mine = EngineState::from_bytes(&saved[rank]).unwrap();
        let refuse = |s: &EngineState, want: &dyn Fn(&Error) -> bool| {
            let err = e.load_state(s).unwrap_err();
            assert!(want(&err), "rank {rank}: unexpected {err}");
        };
        fn field(f: &'static str, t: Option<&'static str>) -> impl Fn(&Error) -> bool {
            move |e: &Error| {
                matches!(e, Error::StateMismatch { field, tensor, .. }
                    if *field == f && tensor.as_deref() == t)
            }
        }
        // Another rank's state.
        let theirs = EngineState::from_bytes(&saved[1 - rank]).unwrap();
        refuse(&theirs, &field("rank", None));
        // Another seed, another world size.
        let mut s = mine.clone();
        s.seed ^= 1;
        refuse(&s, &field("seed", None));
        let mut s = mine.clone();
        s.world_size = 3;
        refuse(&s, &field("world size", None));
        // Another codec's state: the first tensor's policy differs.
        let topk = EngineState::from_bytes(&other_codec[rank]).unwrap();
        refuse(&topk, &field("policy", Some("t0")));
        // Another shape, another name, a tensor missing, a tensor extra.
        let mut s = mine.clone();
        s.tensors[1].shape = vec![15, 20];
        refuse(&s, &field("shape", Some("t1")));
        let mut s = mine.clone();
        s.tensors[0].name = "w".into();
        refuse(&s, &field("tensor", Some("t0")));
        let mut s = mine.clone();
        s.tensors.pop();
        refuse(&s, &field("tensor", Some("t1")));
        let mut s = mine.clone();
        let mut extra = s.tensors[1].clone();
        extra.name = "t2".into();
        s.tensors.push(extra);
        refuse(&s, &field("tensor", Some("t2")));
        // A velocity of the wrong length.
        let mut s = mine.clone();
        s.tensors[1].velocity.as_mut().unwrap().pop();
        refuse(&s, &field("velocity", Some("t1")));
        // The first tensor's state valid (a fresh engine's), the second's damaged: refused
        // by the second tensor's codec, and the first is not loaded either.
        let fresh = e.save_state().unwrap();
        let mut s = mine.clone();
        s.tensors[0].state = fresh.tensors[0].state.clone();
        let half = s.tensors[1].state.len() / 2;
        s.tensors[1].state.truncate(half);
        refuse(
            &s,
            &|e| matches!(e, Error::StateRefused { tensor, .. } if tensor == "t1"),
        );
        // Nothing above changed the fresh engine: it still saves what it saved.
        assert_eq!(e.save_state().unwrap(), fresh);
        // The real state loads; the engine continues as the uninterrupted run.
        e.load_state(&mine).unwrap();
        assert_eq!(e.save_state().unwrap(), mine);
        let out: Vec<_> = (STOP..STEPS).map(|s| step(&e, rank, s)).collect();
        e.shutdown().unwrap();
        out
    });
    assert_steps_bitwise("dgc after refusals", &got, |r| &whole[r]);
}

/// Loading into an engine that has already run steps replaces its state: it then continues
/// exactly as one that loaded the state fresh.
#[test]
fn loading_into_a_running_engine_replaces_its_state() {
    let cfg = config(&"onebit".parse().unwrap(), Strategy::Auto, true);
    let saved = first_part(&cfg);
    let mut whole = run(&cfg, 0..STEPS, None);
    for r in &mut whole {
        r.drain(..STOP);
    }
    let got = world(2, |t| {
        let rank = t.rank();
        let e = start(t, &cfg);
        for s in 0..5 {
            step(&e, rank, 100 + s);
        }
        e.load_state(&EngineState::from_bytes(&saved[rank]).unwrap())
            .unwrap();
        let out: Vec<_> = (STOP..STEPS).map(|s| step(&e, rank, s)).collect();
        e.shutdown().unwrap();
        out
    });
    assert_steps_bitwise("onebit loaded mid-run", &got, |r| &whole[r]);
}

/// With a submission not yet run (one rank submitted, the other not yet), saving and
/// loading are refused with `StatePending` naming the tensor; once it has run, both work.
#[test]
fn pending_submissions_refuse_save_and_load() {
    let cfg = config(&"none".parse().unwrap(), Strategy::Dense, false);
    let barrier = std::sync::Barrier::new(2);
    world(2, |t| {
        let rank = t.rank();
        let e = start(t, &cfg);
        let len = 37;
        let h = (rank == 0).then(|| e.all_reduce("t0", grad(0, 0, 0, len)));
        if rank == 0 {
            let state = e.save_state();
            assert!(
                matches!(&state, Err(Error::StatePending { tensors }) if tensors == &["t0"]),
                "{state:?}"
            );
            let fresh = EngineState {
                rank: 0,
                world_size: 2,
                seed: SEED,
                step: 0,
                epoch: 0.0,
                tensors: vec![],
            };
            assert!(matches!(
                e.load_state(&fresh),
                Err(Error::StatePending { .. })
            ));
        }
        barrier.wait();
        if rank == 1 {
            e.all_reduce("t0", grad(1, 0, 0, len)).wait().unwrap();
        }
        if let Some(h) = h {
            h.wait().unwrap();
        }
        let s = e.save_state().unwrap();
        e.load_state(&s).unwrap();
        e.shutdown().unwrap();
    });
}

/// An engine whose progress thread stopped on a failure returns that failure.
#[test]
fn a_failed_engine_returns_its_error() {
    let cfg = config(&"none".parse().unwrap(), Strategy::Dense, false);
    world(2, |t| {
        let rank = t.rank();
        let kill = Arc::new(AtomicBool::new(false));
        let e = Engine::start(Killable::new(t, kill.clone()), cfg.clone(), &tensors()).unwrap();
        if rank == 1 {
            kill.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = e.shutdown();
            return;
        }
        let err = e.all_reduce("t0", vec![1.0; 37]).wait().unwrap_err();
        let saved = e.save_state().unwrap_err();
        assert_eq!(saved.to_string(), err.to_string());
        assert_eq!(saved.peer(), Some(1), "{saved}");
    });
}
