//! Shared machinery of the sparsifying codecs (top-k, DGC, random-k, threshold, adaptive),
//! one concept a file:
//! - [`select`]: magnitude keys, fused scans, sampled thresholds, exact top-k cuts;
//! - [`wire`]: the (index, value) payload of top-k and DGC, its value formats, its writer
//!   and its one reader (added into a gradient or read back as pairs);
//! - [`words`]: the signed index words of threshold and adaptive quantization;
//! - [`residual`]: the residual each of them owns (sized, saved, restored);
//! - [`bytes`]: bounds-checked little-endian readers for their decoders;
//! - `pairs` (tests and fuzzing): the checks of their `decode_pairs` against their own
//!   `decode_add` and `encode_sparse`.
//!
//! The items are re-exported here, so codecs name them `crate::sparse::...`.

mod bytes;
#[cfg(any(test, fuzzing))]
mod pairs;
mod residual;
mod select;
mod wire;
mod words;

pub(crate) use bytes::{check_len, read_count, read_f32, read_positive_f32, read_u32, read_u64};
#[cfg(fuzzing)]
pub use pairs::fuzz_decode_pairs;
pub(crate) use residual::{fit, load_rng_residual, save_rng_residual};
pub use select::ThresholdEstimate;
pub(crate) use select::{
    cut_to_k, exact_topk, finish_sampled, k_for, key, scan_above, scan_add_into, step_key,
};
pub use wire::ValueFormat;
pub(crate) use wire::{decode_sparse_add, decode_sparse_pairs, write_selection};
#[cfg(test)]
pub(crate) use wire::{index_bytes, SPARSE_PREFIX};
pub(crate) use words::{check_next, index_of, is_negative, put_words, word_at, word_bytes};

/// Test data: `n` values in [-1, 1) from a 64-bit LCG.
#[cfg(test)]
pub(crate) fn lcg(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

/// Test reference: the `k` largest keys by a full sort (ties to the lowest index), sorted.
#[cfg(test)]
pub(crate) fn reference_topk(x: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..x.len() as u32).collect();
    idx.sort_by(|&a, &b| key(x[b as usize]).cmp(&key(x[a as usize])).then(a.cmp(&b)));
    idx.truncate(k);
    idx.sort_unstable();
    idx
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::lcg;
    use crate::HEADER_LEN;

    /// Every sparse codec's decoder survives mutated, truncated and extended payloads
    /// (a light, deterministic stand-in for the fuzz targets).
    #[test]
    fn decoders_survive_mutations() {
        use crate::{BuildContext, CodecConfig};
        use rand::Rng;
        let n = 3000;
        let g = lcg(n, 42);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for spec in [
            "topk:ratio=0.01",
            "topk:ratio=0.02,values=fp16",
            "dgc:ratio=0.01,min_dense=100",
            "randomk:ratio=0.01",
            "threshold:tau=0.5",
            "adaptive:pi=0.01,column=500",
        ] {
            let cfg: CodecConfig = spec.parse().unwrap();
            let mut c = cfg.build(&BuildContext::single(3));
            let mut p = Vec::new();
            c.encode(&g, &mut p);
            let mut acc = vec![0.0f32; n];
            c.decode_add(&p, &mut acc).unwrap();
            for t in 0..3000 {
                let mut q = p.clone();
                match t % 4 {
                    0 => {
                        let i = rng.gen_range(HEADER_LEN..q.len());
                        q[i] ^= 1 << rng.gen_range(0..8);
                    }
                    1 => {
                        let i = rng.gen_range(HEADER_LEN..q.len());
                        q[i] = rng.gen();
                    }
                    2 => q.truncate(rng.gen_range(0..q.len())),
                    _ => q.extend((0..rng.gen_range(1..9)).map(|_| rng.gen::<u8>())),
                }
                let mut acc = vec![0.0f32; n];
                let _ = c.decode_add(&q, &mut acc);
            }
        }
    }
}
