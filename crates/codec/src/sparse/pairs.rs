//! The checks of the sparse codecs' [`crate::SparseEncode::decode_pairs`] against independent
//! references: the codec's own `decode_add` on any bytes ([`fuzz_decode_pairs`], run by the
//! tests here and by the fuzz targets) and its `encode_sparse`, step after step (the tests).

use crate::{BuildContext, CodecConfig, Header, SparseGrad};

/// The codecs [`fuzz_decode_pairs`] picks from: top-k in f32 and f16, DGC, threshold,
/// random-k.
const SPECS: [&str; 5] = [
    "topk:ratio=0.1",
    "topk:ratio=0.1,values=fp16",
    "dgc:ratio=0.1",
    "threshold:tau=0.5",
    "randomk:ratio=0.1",
];

/// Differential check of `decode_pairs` against `decode_add` on `buf`: the codec (one of
/// [`SPECS`]) from its first byte, the element count (1..=4096) from the next two, a valid
/// header put in front of the rest when the fourth byte is odd. Both must accept, or both
/// refuse with the same error (the pairs then left empty); what is accepted must be strictly
/// increasing indices below the count whose values, scattered into zeros, equal the
/// decoder's sum bit for bit (NaN for NaN). Never panics otherwise.
pub fn fuzz_decode_pairs(buf: &[u8]) {
    let Some((&pick, rest)) = buf.split_first() else {
        return;
    };
    let (n, rest) = match rest {
        [a, b, rest @ ..] => (1 + usize::from(u16::from_le_bytes([*a, *b])) % 4096, rest),
        _ => return,
    };
    let Some((&framed, body)) = rest.split_first() else {
        return;
    };
    let cfg: CodecConfig = SPECS[usize::from(pick) % SPECS.len()]
        .parse()
        .expect("a valid spec");
    let mut codec = cfg.build(&BuildContext::single(0));
    let mut payload = Vec::new();
    if framed % 2 == 1 {
        Header::write(&mut payload, codec.id(), n);
    }
    payload.extend_from_slice(body);
    let mut want = vec![0.0f32; n];
    let decoded = codec.decode_add(&payload, &mut want);
    let mut pairs = SparseGrad {
        indices: vec![7],
        values: vec![7.0],
    };
    let got = codec
        .sparse_encode()
        .expect("a sparse codec")
        .decode_pairs(&payload, n, &mut pairs);
    assert_eq!(got, decoded, "decode_pairs against decode_add");
    if got.is_err() {
        assert_eq!(pairs, SparseGrad::default(), "refused: no pairs");
        return;
    }
    assert_eq!(pairs.indices.len(), pairs.values.len());
    assert!(pairs.indices.windows(2).all(|w| w[0] < w[1]));
    let mut scattered = vec![0.0f32; n];
    for (&i, &v) in pairs.indices.iter().zip(&pairs.values) {
        scattered[i as usize] = 0.0 + v;
    }
    for (i, (a, b)) in scattered.iter().zip(&want).enumerate() {
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "element {i}: pairs give {a}, the decoder {b}"
        );
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::{
        Codec, DecodeError, ErrorFeedback, Progress, SparseEncode, TensorInfo, TensorRole,
        HEADER_LEN,
    };

    /// Every sparse codec's variants: both top-k scopes and value formats, DGC with a sparse
    /// and a dense tensor, threshold, random-k scaled and unscaled.
    const SPARSE: [&str; 7] = [
        "topk:ratio=0.05,scope=tensor",
        "topk:ratio=0.05,values=fp16",
        "dgc:ratio=0.01",
        "dgc:ratio=0.02,min_dense=10",
        "threshold:tau=0.3",
        "randomk:ratio=0.1",
        "randomk:ratio=0.1,scale=false",
    ];

    /// Values in [-1, 1) with every fourth one exactly zero.
    fn grad(n: usize, step: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(step);
        (0..n)
            .map(|i| {
                if i % 4 == (step as usize) % 4 {
                    0.0
                } else {
                    rng.gen_range(-1.0f32..1.0)
                }
            })
            .collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Two codecs in the same state, step after step: the pairs `decode_pairs` reads off one's
    /// payload equal the other's `encode_sparse`, bit for bit (values included, zeros kept),
    /// over 6 steps (the warm-ups, residuals and RNG positions moving).
    fn assert_pairs_equal_encode_sparse(mut a: Box<dyn Codec>, mut b: Box<dyn Codec>, what: &str) {
        let mut kept_zero = false;
        let mut payload = Vec::new();
        let (mut got, mut want) = (SparseGrad::default(), SparseGrad::default());
        for step in 0..6 {
            let p = Progress {
                step,
                epoch: step as f32 * 0.4,
            };
            a.set_progress(p);
            b.set_progress(p);
            let g = grad(500, step);
            a.encode(&g, &mut payload);
            let sparse = b.sparse_encode().expect("a sparse codec");
            sparse.encode_sparse(&g, &mut want);
            sparse.decode_pairs(&payload, 500, &mut got).unwrap();
            assert!(
                !want.indices.is_empty(),
                "{what} step {step}: pairs selected"
            );
            assert_eq!(got.indices, want.indices, "{what} step {step}");
            assert_eq!(bits(&got.values), bits(&want.values), "{what} step {step}");
            kept_zero |= got.values.contains(&0.0);
        }
        if what.starts_with("randomk") || what.starts_with("dgc:ratio=0.01") {
            assert!(kept_zero, "{what}: a kept 0.0 was read back");
        }
    }

    #[test]
    fn pairs_equal_encode_sparse() {
        for spec in SPARSE {
            let cfg: CodecConfig = spec.parse().unwrap();
            let infos = vec![
                TensorInfo::new([20, 15], TensorRole::LinearWeight),
                TensorInfo::new([200], TensorRole::Bias),
            ];
            let ctx = BuildContext::new(5, 1, 3, vec![300, 200]).with_tensors(infos);
            assert_pairs_equal_encode_sparse(cfg.build(&ctx), cfg.build(&ctx), spec);
        }
    }

    /// The generic error-feedback wrapper around a sparsifier without a residual of its own
    /// reads its payloads back through the inner codec's `decode_pairs`.
    #[test]
    fn the_feedback_wrapper_delegates() {
        for spec in [
            "topk:ratio=0.05,ef=false",
            "randomk:ratio=0.1",
            "topk:ratio=0.05,values=fp16,ef=false",
        ] {
            let cfg: CodecConfig = spec.parse().unwrap();
            let ctx = BuildContext::new(5, 1, 3, vec![500]);
            let wrap = |c: Box<dyn Codec>| -> Box<dyn Codec> { Box::new(ErrorFeedback::new(c)) };
            assert_pairs_equal_encode_sparse(
                wrap(cfg.build(&ctx)),
                wrap(cfg.build(&ctx)),
                &format!("ef({spec})"),
            );
        }
    }

    /// Valid payloads of every sparse codec, mutated, truncated and extended, and raw bytes
    /// behind a valid header: `decode_pairs` agrees with `decode_add` on every one.
    #[test]
    fn mutated_payloads_agree_with_decode_add() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let n = 300usize;
        for (pick, spec) in SPECS.iter().enumerate() {
            let mut c = spec
                .parse::<CodecConfig>()
                .unwrap()
                .build(&BuildContext::single(2));
            let mut payload = Vec::new();
            c.encode(&grad(n, pick as u64), &mut payload);
            let frame = |body: &[u8]| {
                let mut b = vec![pick as u8];
                b.extend_from_slice(&((n - 1) as u16).to_le_bytes());
                b.push(0);
                b.extend_from_slice(body);
                b
            };
            fuzz_decode_pairs(&frame(&payload));
            for t in 0..1500 {
                let mut q = payload.clone();
                match t % 4 {
                    0 => {
                        let i = rng.gen_range(HEADER_LEN..q.len());
                        q[i] ^= 1 << rng.gen_range(0..8);
                    }
                    1 => {
                        let i = rng.gen_range(0..q.len());
                        q[i] = rng.gen();
                    }
                    2 => q.truncate(rng.gen_range(0..q.len())),
                    _ => q.extend((0..rng.gen_range(1..9)).map(|_| rng.gen::<u8>())),
                }
                fuzz_decode_pairs(&frame(&q));
            }
        }
        for _ in 0..3000 {
            let len = rng.gen_range(0..64);
            let mut buf: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if buf.len() > 3 {
                buf[1] = rng.gen_range(0..8);
                buf[2] = 0;
                buf[3] |= 1;
            }
            fuzz_decode_pairs(&buf);
        }
    }

    /// A payload with a kept 0.0 and a NaN (f32 and f16) gives them back at their indices.
    #[test]
    fn zeros_and_nans_come_back() {
        for vf in [crate::ValueFormat::Fp32, crate::ValueFormat::Fp16] {
            let sel = SparseGrad {
                indices: vec![0, 3, 9],
                values: vec![0.0, f32::NAN, -0.0],
            };
            let mut p = Vec::new();
            crate::sparse::write_selection(&mut p, crate::CodecId::TopK, 10, &sel, vf);
            let spec = format!("topk:values={}", vf.name());
            let mut c = spec
                .parse::<CodecConfig>()
                .unwrap()
                .build(&BuildContext::single(0));
            let mut got = SparseGrad::default();
            c.sparse_encode()
                .unwrap()
                .decode_pairs(&p, 10, &mut got)
                .unwrap();
            assert_eq!(got.indices, sel.indices, "{spec}");
            assert_eq!(got.values[0].to_bits(), 0, "{spec}");
            assert!(got.values[1].is_nan(), "{spec}");
            assert_eq!(got.values[2].to_bits(), (-0.0f32).to_bits(), "{spec}");
        }
    }

    /// A gradient too long for u32 indices is refused before anything is read or allocated,
    /// by every sparse codec.
    #[test]
    fn more_elements_than_u32_indices_are_refused() {
        for spec in SPECS {
            let mut c = spec
                .parse::<CodecConfig>()
                .unwrap()
                .build(&BuildContext::single(0));
            let mut out = SparseGrad::default();
            let e = c
                .sparse_encode()
                .unwrap()
                .decode_pairs(&[], u32::MAX as usize + 1, &mut out);
            assert!(
                matches!(e, Err(DecodeError::InvalidField { field: "n", .. })),
                "{spec}: {e:?}"
            );
        }
    }

    /// A sparse form that does not implement `decode_pairs` refuses with a typed error.
    #[test]
    fn the_default_refuses() {
        struct Nothing;
        impl SparseEncode for Nothing {
            fn encode_sparse(&mut self, _grad: &[f32], out: &mut SparseGrad) {
                out.clear();
            }
        }
        let mut out = SparseGrad {
            indices: vec![1],
            values: vec![1.0],
        };
        assert_eq!(
            Nothing.decode_pairs(&[0; 40], 4, &mut out),
            Err(DecodeError::InvalidField {
                field: "codec",
                reason: "its payloads do not give its sparse pairs back",
            })
        );
        assert_eq!(out, SparseGrad::default());
    }
}
