//! A codec's cost on a model's real gradient: wire bytes, encode and decode seconds per
//! element, measured on this machine.
//!
//! This file owns running a codec the way the engine builds it (one codec per tensor, past
//! any warm-up) and counting what it would put on the wire for the engine's strategy: the
//! encoded payloads, or for a sparse strategy the (index, value) pairs the sparse all-reduce
//! sends, 8 bytes each.

use std::time::Instant;

use gradwire_engine::codec::{BuildContext, Codec, CodecConfig, Progress, SparseGrad, TensorInfo};
use gradwire_engine::Strategy;

use super::{median, median_within, Passes, WARMUP_PASSES};

/// A codec's measured cost per gradient element (what `gradwire_sim::CodecProfile` takes,
/// without the spec).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodecCost {
    /// The strategy the engine carries the codec with (resolved: never `auto`).
    pub strategy: Strategy,
    /// Encode seconds per gradient element (median).
    pub encode_s_per_elem: f64,
    /// Decode (`decode_add`) seconds per gradient element (median).
    pub decode_s_per_elem: f64,
    /// Bytes on the wire per gradient element for one rank's contribution.
    pub wire_bytes_per_elem: f64,
}

impl CodecCost {
    /// Plain fp32: no codec cost, 4 bytes per element.
    pub fn dense() -> CodecCost {
        CodecCost {
            strategy: Strategy::Dense,
            encode_s_per_elem: 0.0,
            decode_s_per_elem: 0.0,
            wire_bytes_per_elem: 4.0,
        }
    }
}

/// [`measure_codec`] as the cost model's profile of the codec `spec` (`config` parsed).
pub fn codec_profile(
    spec: &str,
    config: &CodecConfig,
    infos: &[TensorInfo],
    grad: &[f32],
    seed: u64,
) -> gradwire_sim::CodecProfile {
    let cost = measure_codec(config, infos, grad, seed);
    gradwire_sim::CodecProfile {
        spec: spec.to_string(),
        strategy: cost.strategy,
        encode_s_per_elem: cost.encode_s_per_elem,
        decode_s_per_elem: cost.decode_s_per_elem,
        wire_bytes_per_elem: cost.wire_bytes_per_elem,
    }
}

/// One codec of `config` per tensor of `infos` (as the engine builds them, seeded with
/// `seed`), run on `grad` (the tensors' gradients one after the other): wire bytes per
/// element, encode and decode seconds per element (medians of the same passes,
/// [`median_of_passes`](super::median_of_passes)). The codecs run past any warm-up (DGC's sparsity schedule): the
/// steady state. A dense strategy costs nothing and sends 4 bytes per element, unmeasured.
pub fn measure_codec(
    config: &CodecConfig,
    infos: &[TensorInfo],
    grad: &[f32],
    seed: u64,
) -> CodecCost {
    measure_codec_within(config, infos, grad, seed, Passes::STEADY)
}

/// [`measure_codec`] over the timed passes `passes` asks for ([`median_within`]).
pub fn measure_codec_within(
    config: &CodecConfig,
    infos: &[TensorInfo],
    grad: &[f32],
    seed: u64,
    passes: Passes,
) -> CodecCost {
    let strategy = Strategy::Auto.resolve(config);
    if strategy == Strategy::Dense {
        return CodecCost::dense();
    }
    let mut codecs: Vec<Box<dyn Codec>> = infos
        .iter()
        .map(|info| {
            let mut c = config.build(&BuildContext::single(seed).with_tensors(vec![info.clone()]));
            // Past any warm-up (DGC's sparsity schedule): the steady state.
            c.set_progress(Progress {
                step: 1_000_000,
                epoch: 1_000.0,
            });
            c
        })
        .collect();
    let mut payloads: Vec<Vec<u8>> = vec![Vec::new(); infos.len()];
    let mut sparse = SparseGrad::default();
    let mut dec = Vec::new();
    let mut wire = 0usize;
    let mut acc = vec![0f32; grad.len()];
    let Ok(encode) = median_within::<std::convert::Infallible>(passes, || {
        let mut off = 0;
        let t = Instant::now();
        for ((c, info), out) in codecs.iter_mut().zip(infos).zip(&mut payloads) {
            let n = info.numel();
            c.encode(&grad[off..off + n], out);
            off += n;
        }
        let encode = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut off = 0;
        for ((c, info), out) in codecs.iter().zip(infos).zip(&payloads) {
            let n = info.numel();
            // A payload this process just encoded decodes; an error would be a codec bug,
            // and then the timing is simply shorter.
            let _ = c.decode_add(out, &mut acc[off..off + n]);
            off += n;
        }
        dec.push(t.elapsed().as_secs_f64());
        Ok(encode)
    });
    // The decodes of the same timed passes.
    let decode = median(dec.split_off(WARMUP_PASSES));
    if strategy == Strategy::Sparse {
        let mut off = 0;
        for (c, info) in codecs.iter_mut().zip(infos) {
            let n = info.numel();
            wire += if let Some(s) = c.sparse_encode() {
                s.encode_sparse(&grad[off..off + n], &mut sparse);
                8 * sparse.indices.len()
            } else {
                payloads_len(c.as_mut(), &grad[off..off + n])
            };
            off += n;
        }
    } else {
        wire = payloads.iter().map(Vec::len).sum();
    }
    let n = grad.len().max(1) as f64;
    CodecCost {
        strategy,
        encode_s_per_elem: encode / n,
        decode_s_per_elem: decode / n,
        wire_bytes_per_elem: wire as f64 / n,
    }
}

/// The bytes of one payload `c` encodes from `grad` (which advances `c`'s error feedback
/// and any other state, as a real step does).
pub fn payloads_len(c: &mut dyn Codec, grad: &[f32]) -> usize {
    let mut out = Vec::new();
    c.encode(grad, &mut out);
    out.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_engine::codec::TensorRole;

    /// One 1000 x 100 linear weight and a 100-element bias, and a gradient for them.
    fn layer() -> (Vec<TensorInfo>, Vec<f32>) {
        let infos = vec![
            TensorInfo::new(vec![1000, 100], TensorRole::LinearWeight),
            TensorInfo::new(vec![100], TensorRole::Bias),
        ];
        let grad = (0..100_100)
            .map(|i| ((i * 7919) % 1000) as f32 - 500.0)
            .collect();
        (infos, grad)
    }

    #[test]
    fn codec_costs_count_bytes_from_real_output() {
        let (infos, grad) = layer();
        let dense = measure_codec(&"none".parse().unwrap(), &infos, &grad, 1);
        assert_eq!(dense, CodecCost::dense());
        // fp16: 2 bytes per element plus a small header per tensor.
        let fp16 = measure_codec(&"fp16".parse().unwrap(), &infos, &grad, 1);
        assert_eq!(fp16.strategy, Strategy::Stripe);
        assert!(
            (2.0..2.01).contains(&fp16.wire_bytes_per_elem),
            "{}",
            fp16.wire_bytes_per_elem
        );
        // top-k 1%: 8 bytes per pair the sparse all-reduce sends, about 1% of the elements.
        let topk = measure_codec(&"topk:ratio=0.01".parse().unwrap(), &infos, &grad, 1);
        assert_eq!(topk.strategy, Strategy::Sparse);
        assert!(
            (0.07..0.09).contains(&topk.wire_bytes_per_elem),
            "{}",
            topk.wire_bytes_per_elem
        );
        assert!(topk.encode_s_per_elem > 0.0);
    }

    #[test]
    fn payload_lengths_are_the_encoded_bytes() {
        let (infos, grad) = layer();
        let config: CodecConfig = "fp16".parse().unwrap();
        let bias = &grad[100_000..];
        let mut c = config.build(&BuildContext::single(1).with_tensors(vec![infos[1].clone()]));
        let mut out = Vec::new();
        c.encode(bias, &mut out);
        let len = payloads_len(c.as_mut(), bias);
        assert_eq!(len, out.len());
        // Two bytes per element and a header shorter than the payload.
        assert!((2 * bias.len()..4 * bias.len()).contains(&len), "{len}");
    }
}
