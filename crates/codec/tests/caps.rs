//! Every codec of `CodecConfig::examples()` says what it does ([`Codec::caps`] and the
//! capability accessors [`Codec::sparse_encode`], [`Codec::shared_scalars`],
//! [`Codec::feedback_encode`]) and does what it says: what it declares is checked against a
//! table written from the papers (below) and against behaviour (the sparse form agrees with
//! the payload, shared scalars change the payload, a residual brings left-out signal back on
//! a zero gradient). A capability a codec lacks has no method to call.

use gradwire_codec::{
    BuildContext, Caps, Codec, CodecConfig, Feedback, Progress, SparseGrad, TensorInfo,
};

/// Everything a codec declares: its [`Caps`] and which capability accessors answer `Some`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Declared {
    sparse: bool,
    shared_scalars: bool,
    fused_feedback: bool,
    unbiased: bool,
    feedback: Feedback,
}

fn declared(c: &mut dyn Codec) -> Declared {
    let Caps { unbiased, feedback } = c.caps();
    Declared {
        sparse: c.sparse_encode().is_some(),
        shared_scalars: c.shared_scalars().is_some(),
        fused_feedback: c.feedback_encode().is_some(),
        unbiased,
        feedback,
    }
}

fn declared_by(cfg: &CodecConfig) -> Declared {
    declared(&mut *cfg.build(&BuildContext::single(0)))
}

const LAYOUT: [usize; 3] = [1500, 500, 37];

fn ctx() -> BuildContext {
    BuildContext::new(5, 1, 4, LAYOUT.to_vec())
}

/// A deterministic gradient in (-0.95, 0.95) with a few exact zeros (a multiplicative hash
/// of the index).
fn grad(n: usize, salt: u64) -> Vec<f32> {
    let mix = |i: usize| (i as u64 ^ salt.rotate_left(29)).wrapping_mul(0x2545_F491_4F6C_DD1D);
    (0..n)
        .map(|i| match i % 13 {
            5 => 0.0,
            _ => ((mix(i) >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 1.9,
        })
        .collect()
}

/// What each example must report, from its paper and its spec (`ef=` defaults: on for the
/// biased quantizers and the sparsifiers, off for the unbiased codecs and the casts).
fn expected(spec: &str) -> Declared {
    let c = Declared::default();
    let name = spec.split(':').next().unwrap();
    let has = |p: &str| spec.contains(p);
    match name {
        // Any codec under the generic wrapper: biased (it sends `g + r`), no fused kernel.
        "none" | "fp16" | "bf16" | "qsgd" if has("ef=true") => Declared {
            feedback: Feedback::Generic,
            ..c
        },
        // Lossless (unbiased), fused kernel for `none:ef=true`.
        "none" => Declared {
            unbiased: true,
            fused_feedback: true,
            ..c
        },
        "fp16" | "bf16" => c,
        // Seide 2014: the residual is the paper's; kept by the generic wrapper.
        "onebit" | "signsgd" if !has("ef=false") => Declared {
            feedback: Feedback::Generic,
            ..c
        },
        "onebit" | "signsgd" => Declared {
            fused_feedback: true,
            ..c
        },
        "powersgd" => Declared {
            feedback: Feedback::Generic,
            ..c
        },
        "qsgd" => Declared {
            unbiased: true,
            ..c
        },
        // Wen 2017: shared max scale; unbiased unless error feedback is asked for.
        "terngrad" if has("ef=true") => Declared {
            shared_scalars: true,
            feedback: Feedback::Generic,
            ..c
        },
        "terngrad" => Declared {
            shared_scalars: true,
            unbiased: true,
            ..c
        },
        "topk" => Declared {
            sparse: true,
            feedback: if has("ef=false") {
                Feedback::None
            } else {
                Feedback::Owned
            },
            ..c
        },
        "threshold" | "dgc" => Declared {
            sparse: true,
            feedback: Feedback::Owned,
            ..c
        },
        // Scaled (default): unbiased, no residual; `scale=false`: biased, own residual.
        "randomk" if has("scale=false") || has("ef=true") => Declared {
            sparse: true,
            feedback: Feedback::Owned,
            ..c
        },
        "randomk" => Declared {
            sparse: true,
            unbiased: true,
            ..c
        },
        "adaptive" => Declared {
            feedback: Feedback::Owned,
            ..c
        },
        other => panic!("no expectation for codec {other}: add one"),
    }
}

fn build(cfg: &CodecConfig) -> Box<dyn Codec> {
    let mut c = cfg.build(&ctx());
    c.set_progress(Progress {
        step: 3,
        epoch: 0.0,
    });
    c
}

/// Agrees on scalars (one rank: its own) when the codec needs them, then encodes.
fn encode(c: &mut Box<dyn Codec>, g: &[f32], out: &mut Vec<u8>) {
    if let Some(sh) = c.shared_scalars() {
        let s = sh.local_scalars(g);
        sh.set_shared_scalars(&s);
    }
    c.encode(g, out);
}

fn decoded(c: &dyn Codec, payload: &[u8], n: usize) -> Vec<f32> {
    let mut acc = vec![0.0f32; n];
    c.decode_add(payload, &mut acc).unwrap();
    acc
}

#[test]
fn caps_match_the_papers() {
    for cfg in CodecConfig::examples() {
        let spec = cfg.to_string();
        let caps = declared_by(&cfg);
        assert_eq!(caps, expected(&spec), "{spec}");
        assert_eq!(
            declared(&mut *build(&cfg)),
            caps,
            "{spec}: caps depend on the context"
        );
        assert_eq!(cfg.caps(), build(&cfg).caps(), "{spec}");
        assert_eq!(cfg.sparsifies(), caps.sparse, "{spec}");
        assert_eq!(cfg.needs_shared_scalars(), caps.shared_scalars, "{spec}");
        // The rule of the crate doc: an unbiased codec keeps no residual.
        assert!(!caps.unbiased || caps.feedback == Feedback::None, "{spec}");
    }
    // Named options off the examples' defaults.
    for spec in [
        "none:ef=true",
        "fp16:ef=true",
        "qsgd:ef=true",
        "randomk:ef=true",
        "topk:ef=false",
        "signsgd:ef=false",
    ] {
        let cfg: CodecConfig = spec.parse().unwrap();
        let caps = declared_by(&cfg);
        assert_eq!(caps, expected(&cfg.to_string()), "{spec}");
        assert!(!caps.unbiased || caps.feedback == Feedback::None, "{spec}");
    }
}

/// A sparse form ([`Codec::sparse_encode`]) selects exactly what `encode` sends and advances
/// the state the same way.
#[test]
fn sparse_form_agrees_with_the_payload() {
    let n: usize = LAYOUT.iter().sum();
    let mut sparse = 0;
    for cfg in CodecConfig::examples() {
        let spec = cfg.to_string();
        let (mut a, mut b) = (build(&cfg), build(&cfg));
        if b.sparse_encode().is_none() {
            continue;
        }
        sparse += 1;
        let mut out = Vec::new();
        let mut s = SparseGrad::default();
        for step in 0..3 {
            let g = grad(n, step);
            encode(&mut a, &g, &mut out);
            let want = decoded(&*a, &out, n);
            b.sparse_encode().unwrap().encode_sparse(&g, &mut s);
            assert!(s.indices.windows(2).all(|w| w[0] < w[1]), "{spec}");
            let mut got = vec![0.0f32; n];
            for (&i, &v) in s.indices.iter().zip(&s.values) {
                got[i as usize] += v;
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{spec} step {step}");
        }
        let (mut pa, mut pb) = (Vec::new(), Vec::new());
        a.encode(&grad(n, 9), &mut pa);
        b.encode(&grad(n, 9), &mut pb);
        assert_eq!(
            pa, pb,
            "{spec}: encode_sparse advanced the state differently"
        );
    }
    assert_eq!(
        sparse, 9,
        "the sparse examples (topk 2, threshold 2, randomk 2, dgc 3)"
    );
}

/// Shared scalars ([`Codec::shared_scalars`]) change the payload; `local_scalars` gives one
/// per tensor.
#[test]
fn shared_scalars_shape_the_payload() {
    let n: usize = LAYOUT.iter().sum();
    let g = grad(n, 4);
    for cfg in CodecConfig::examples() {
        let spec = cfg.to_string();
        let (mut a, mut b) = (build(&cfg), build(&cfg));
        let (mut pa, mut pb) = (Vec::new(), Vec::new());
        let Some(sa) = a.shared_scalars() else {
            assert!(b.shared_scalars().is_none(), "{spec}");
            continue;
        };
        let s = sa.local_scalars(&g);
        assert_eq!(s.len(), LAYOUT.len(), "{spec}: one scalar per tensor");
        assert!(s.iter().all(|&x| x > 0.0), "{spec}: {s:?}");
        sa.set_shared_scalars(&s);
        b.shared_scalars()
            .unwrap()
            .set_shared_scalars(&s.iter().map(|x| 4.0 * x).collect::<Vec<_>>());
        a.encode(&g, &mut pa);
        b.encode(&g, &mut pb);
        assert_ne!(pa, pb, "{spec}: the shared scalars are ignored");
    }
}

/// A residual (owned or generic) brings back on a zero gradient what the previous payload
/// left out; without one a zero gradient sends nothing.
#[test]
fn feedback_kind_matches_behaviour() {
    let n: usize = LAYOUT.iter().sum();
    let zeros = vec![0.0f32; n];
    for cfg in CodecConfig::examples() {
        let spec = cfg.to_string();
        let mut c = build(&cfg);
        let mut out = Vec::new();
        encode(&mut c, &grad(n, 2), &mut out);
        encode(&mut c, &zeros, &mut out);
        let back = decoded(&*c, &out, n).iter().any(|&x| x != 0.0);
        let caps = declared_by(&cfg);
        assert_eq!(
            back,
            caps.feedback != Feedback::None,
            "{spec}: feedback {:?}",
            caps.feedback
        );
        assert_eq!(c.feedback_encode().is_some(), caps.fused_feedback, "{spec}");
        if let Some(fused) = c.feedback_encode() {
            // The fused kernel keeps `sent + residual == grad + residual_before`.
            let mut r: Vec<f32> = grad(n, 3).iter().map(|x| x * 0.1).collect();
            let before = r.clone();
            let g = grad(n, 5);
            fused.encode_feedback(&g, &mut r, &mut out);
            let sent = decoded(&*c, &out, n);
            for i in 0..n {
                let want = g[i] + before[i];
                assert!(
                    (sent[i] + r[i] - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{spec} [{i}]"
                );
            }
        }
    }
}

/// The capabilities do not depend on the tensors' shapes.
#[test]
fn caps_ignore_shapes() {
    use gradwire_codec::TensorRole;
    let shaped = BuildContext::new(5, 0, 2, Vec::new()).with_tensors(vec![
        TensorInfo::new([30, 50], TensorRole::LinearWeight),
        TensorInfo::new([500], TensorRole::Bias),
    ]);
    for cfg in CodecConfig::examples() {
        assert_eq!(
            declared(&mut *cfg.build(&shaped)),
            declared_by(&cfg),
            "{cfg}"
        );
    }
}
