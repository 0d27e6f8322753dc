//! Properties every codec in `CodecConfig::examples()` must have: decoding keeps the length
//! and refuses other lengths, decoders are total (no panic on any truncation or bit flip of a
//! real payload, nor on random bytes), the spec string round-trips, and saved state resumes
//! exactly. A codec joins these tests by adding an example.

use gradwire_codec::{
    BuildContext, Codec, CodecConfig, DecodeError, Progress, TensorInfo, TensorRole, HEADER_LEN,
};
use proptest::prelude::*;

fn ctx(layout: Vec<usize>) -> BuildContext {
    BuildContext {
        seed: 7,
        rank: 1,
        world_size: 4,
        layout,
        ..Default::default()
    }
}

/// A deterministic gradient with a spread of magnitudes and some exact zeros.
fn grad(n: usize, salt: u64) -> Vec<f32> {
    let mut s = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if i % 11 == 3 {
                0.0
            } else {
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * (1.0 + (i % 7) as f32)
            }
        })
        .collect()
}

fn encode_steps(c: &mut Box<dyn Codec>, g: &[f32], steps: u64, out: &mut Vec<u8>) {
    for step in 0..steps {
        c.set_progress(Progress {
            step,
            epoch: step as f32 * 0.1,
        });
        c.encode(g, out);
    }
}

#[test]
fn spec_strings_round_trip() {
    for cfg in CodecConfig::examples() {
        let s = cfg.to_string();
        let back: CodecConfig = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(back, cfg, "{s}");
        assert_eq!(back.to_string(), s);
        assert!(s.starts_with(cfg.name()));
    }
}

#[test]
fn decode_keeps_length_and_refuses_other_lengths() {
    for cfg in CodecConfig::examples() {
        for n in [0usize, 1, 2, 17, 100, 1000, 4099] {
            let g = grad(n, n as u64);
            let mut c = cfg.build(&ctx(Vec::new()));
            let mut out = Vec::new();
            encode_steps(&mut c, &g, 2, &mut out);
            assert!(out.len() >= HEADER_LEN, "{cfg}");
            let mut acc = vec![0f32; n];
            c.decode_add(&out, &mut acc)
                .unwrap_or_else(|e| panic!("{cfg} n={n}: {e}"));
            assert_eq!(acc.len(), n);
            assert!(acc.iter().all(|v| v.is_finite()), "{cfg} n={n}");
            let mut longer = vec![0f32; n + 1];
            assert!(
                matches!(
                    c.decode_add(&out, &mut longer),
                    Err(DecodeError::LengthMismatch { .. })
                ),
                "{cfg} n={n}"
            );
        }
    }
}

#[test]
fn decoders_refuse_other_codecs_payloads() {
    let g = grad(300, 1);
    let examples = CodecConfig::examples();
    for a in &examples {
        let mut ca = a.build(&ctx(Vec::new()));
        let mut out = Vec::new();
        ca.encode(&g, &mut out);
        for b in &examples {
            if a.id() != b.id() {
                let cb = b.build(&ctx(Vec::new()));
                let mut acc = vec![0f32; 300];
                assert!(
                    matches!(
                        cb.decode_add(&out, &mut acc),
                        Err(DecodeError::WrongCodec { .. })
                    ),
                    "{b} accepted a {a} payload"
                );
            }
        }
    }
}

#[test]
fn no_panic_on_truncation_or_bit_flips_and_truncation_is_refused() {
    let layout = vec![300, 7, 213];
    let n: usize = layout.iter().sum();
    let g = grad(n, 3);
    for cfg in CodecConfig::examples() {
        // Shapes unknown, layout only, then shapes and roles (columns, 1-D rule, output layer).
        let shaped = ctx(Vec::new()).with_tensors(vec![
            TensorInfo::new([30, 10], TensorRole::LinearWeight),
            TensorInfo::new([7], TensorRole::Bias),
            TensorInfo::new([3, 71], TensorRole::Output),
        ]);
        for cx in [ctx(Vec::new()), ctx(layout.clone()), shaped] {
            let mut c = cfg.build(&cx);
            let mut out = Vec::new();
            encode_steps(&mut c, &g, 3, &mut out);
            let mut acc = vec![0f32; n];
            for cut in 0..out.len() {
                acc.fill(0.0);
                assert!(
                    c.decode_add(&out[..cut], &mut acc).is_err(),
                    "{cfg}: truncated to {cut} of {} accepted",
                    out.len()
                );
            }
            let mut extended = out.clone();
            extended.push(0);
            assert!(c.decode_add(&extended, &mut acc).is_err(), "{cfg}");
            // Every bit flip of the first 512 bytes, then a stride through the rest.
            let positions: Vec<usize> = (0..out.len().min(512))
                .chain((512..out.len()).step_by(7))
                .collect();
            let mut bad = out.clone();
            for &byte in &positions {
                for bit in 0..8 {
                    bad[byte] ^= 1 << bit;
                    let _ = c.decode_add(&bad, &mut acc);
                    bad[byte] ^= 1 << bit;
                }
            }
        }
    }
}

#[test]
fn saved_state_resumes_exactly() {
    let layout = vec![256, 1000, 44];
    let n: usize = layout.iter().sum();
    for cfg in CodecConfig::examples() {
        let mut a = cfg.build(&ctx(layout.clone()));
        let mut out = Vec::new();
        encode_steps(&mut a, &grad(n, 1), 3, &mut out);
        let state = a.save_state();
        let mut b = cfg.build(&ctx(layout.clone()));
        b.load_state(&state)
            .unwrap_or_else(|e| panic!("{cfg}: {e}"));
        for step in 3..6 {
            let p = Progress {
                step,
                epoch: step as f32 * 0.1,
            };
            a.set_progress(p);
            b.set_progress(p);
            let g = grad(n, step + 10);
            let (mut oa, mut ob) = (Vec::new(), Vec::new());
            a.encode(&g, &mut oa);
            b.encode(&g, &mut ob);
            assert_eq!(oa, ob, "{cfg}: step {step} differs after load_state");
        }
        // Truncated state is refused, never panics.
        for cut in 0..state.len().min(64) {
            let mut c = cfg.build(&ctx(layout.clone()));
            let _ = c.load_state(&state[..cut]);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_gradients_round_trip(
        values in prop::collection::vec(-1e3f32..1e3, 0..600),
        seed in any::<u64>(),
    ) {
        for cfg in CodecConfig::examples() {
            let mut c = cfg.build(&BuildContext::single(seed));
            let mut out = Vec::new();
            c.encode(&values, &mut out);
            let mut acc = vec![0f32; values.len()];
            prop_assert!(c.decode_add(&out, &mut acc).is_ok(), "{}", cfg);
            prop_assert!(acc.iter().all(|v| v.is_finite()), "{}", cfg);
        }
    }

    #[test]
    fn random_bytes_never_panic(
        body in prop::collection::vec(any::<u8>(), 0..400),
        n in 0usize..300,
        which in any::<prop::sample::Index>(),
    ) {
        let examples = CodecConfig::examples();
        let cfg = &examples[which.index(examples.len())];
        let c = cfg.build(&BuildContext::single(1));
        let mut payload = Vec::new();
        gradwire_codec::Header::write(&mut payload, cfg.id(), n);
        payload.extend_from_slice(&body);
        let mut acc = vec![0f32; n];
        let _ = c.decode_add(&payload, &mut acc);
    }
}
