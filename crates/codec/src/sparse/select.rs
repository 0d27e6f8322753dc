//! Selection for the sparsifying codecs (top-k, DGC, threshold, adaptive, random-k): magnitude
//! keys, the fused scan kernels, threshold estimation by sampling, and exact k-th cuts.
//!
//! Magnitudes are compared as *keys*: the f32 bit pattern with the sign bit cleared. For
//! non-negative floats (NaN included) the integer order of the bits is the total order of the
//! values, so a NaN ranks above +inf and is sent rather than kept in a residual forever.
//!
//! The fast path (top-k `select=sampled`, DGC) is: sample 0.1% to 1% of the elements (the
//! DGC paper's range; enough for 32 expected hits of the k-th value where that fits, at least
//! 1024) in cache-line blocks at jittered strided positions, take an order
//! statistic of their keys with a safety margin (`c + 3 sqrt(c) + 2` sample hits where `c` is
//! the expected count at the true k-th value), run ONE branch-light pass that compares every
//! key with that threshold (fused with `x = g + r` or the momentum update by the caller), and
//! then cut the few candidates down to exactly the k largest with `select_nth_unstable` (the
//! paper's hierarchical re-selection). If the sample over-estimated the threshold and fewer than
//! k candidates came out, the threshold is lowered (4x more sample hits each time, finally 0)
//! and the values are scanned again (rare). The result is therefore the exact top-k (ties
//! broken by the lowest index) unless fewer than k elements are non-zero, in which case all
//! non-zero elements are selected.
//!
//! Random-k's shared index streams ([`step_key`]) live here too: they choose the indices.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The magnitude key of `x`: its bits with the sign cleared (monotone in |x|, NaN on top).
#[inline(always)]
pub(crate) fn key(x: f32) -> u32 {
    x.to_bits() & 0x7fff_ffff
}

/// Elements scanned per block by the fused kernels; a block with no hit costs no branch.
const BLOCK: usize = 32;

#[inline(always)]
fn hits(block: &[f32], thr: i32) -> u32 {
    let mut any = 0u32;
    for &v in block {
        any |= ((key(v) as i32) > thr) as u32;
    }
    any
}

#[inline(never)]
fn push_hits(block: &[f32], base: usize, thr: u32, cand: &mut Vec<u32>) {
    for (j, &v) in block.iter().enumerate() {
        if key(v) > thr {
            cand.push((base + j) as u32);
        }
    }
}

/// Appends to `cand` the (slice-local) indices of `x` whose key exceeds `thr`, in order.
pub(crate) fn scan_above(x: &[f32], thr: u32, cand: &mut Vec<u32>) {
    let t = thr as i32;
    let mut chunks = x.chunks_exact(BLOCK);
    let mut base = 0;
    for c in &mut chunks {
        if hits(c, t) != 0 {
            push_hits(c, base, thr, cand);
        }
        base += BLOCK;
    }
    push_hits(chunks.remainder(), base, thr, cand);
}

/// Fused: `r += g` for every element, and appends the indices whose new key exceeds `thr`.
pub(crate) fn scan_add_into(g: &[f32], r: &mut [f32], thr: u32, cand: &mut Vec<u32>) {
    debug_assert_eq!(g.len(), r.len());
    let t = thr as i32;
    let mut gc = g.chunks_exact(BLOCK);
    let mut rc = r.chunks_exact_mut(BLOCK);
    let mut base = 0;
    for (gb, rb) in (&mut gc).zip(&mut rc) {
        let mut n = 0u32;
        for (x, &y) in rb.iter_mut().zip(gb) {
            *x += y;
            n |= ((key(*x) as i32) > t) as u32;
        }
        if n != 0 {
            push_hits(rb, base, thr, cand);
        }
        base += BLOCK;
    }
    let rr = rc.into_remainder();
    for (x, &y) in rr.iter_mut().zip(gc.remainder()) {
        *x += y;
    }
    push_hits(rr, base, thr, cand);
}

/// A 64-bit key mixing `seed`, `stream` and `step` (for streams shared by all ranks).
pub(crate) fn step_key(seed: u64, stream: u64, step: u64) -> u64 {
    let mut z = seed ^ 0x9e37_79b9_7f4a_7c15;
    for w in [stream, step] {
        z = splitmix(z ^ w);
    }
    z
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `ceil(ratio * n)` clamped to `[1, n]` (0 when `n == 0`), robust to `0.01 * 100 = 1.0000001`.
pub(crate) fn k_for(ratio: f64, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let x = ratio * n as f64;
    let r = x.round();
    let k = if (x - r).abs() <= 1e-9 * x.max(1.0) {
        r
    } else {
        x.ceil()
    };
    (k as usize).clamp(1, n)
}

/// Below this many elements selection skips sampling (threshold 0, exact cut).
pub(crate) const SMALL_N: usize = 1 << 14;
const SAMPLE_RUN: usize = 16;
const MAX_SAMPLES: usize = 1 << 18;

/// Threshold estimation from a sample of keys, with successively lower fallbacks.
///
/// `ThresholdEstimate::first` samples on the CPU; an encoder whose values live elsewhere
/// (the GPU codecs) draws the same positions with [`ThresholdEstimate::sample_runs`],
/// gathers their keys itself and hands them to [`ThresholdEstimate::first_from_keys`].
#[derive(Debug, Default, Clone)]
pub struct ThresholdEstimate {
    keys: Vec<u32>,
    /// Sample hits wanted above the current threshold.
    m: usize,
    /// `keys[..upper]` is still unordered (below the current order statistic).
    upper: usize,
    /// The current threshold.
    thr: u32,
}

impl ThresholdEstimate {
    /// Samples the would-be values `value_at(i)`, `i < n`, and returns a key threshold above
    /// which a bit more than `k` elements are expected. Returns 0 for small `n`.
    pub(crate) fn first(
        &mut self,
        n: usize,
        k: usize,
        rng: &mut ChaCha8Rng,
        mut value_at: impl FnMut(usize) -> f32,
    ) -> u32 {
        let mut keys = std::mem::take(&mut self.keys);
        keys.clear();
        let sampled = self.sample_runs(n, k, rng, |start| {
            keys.extend((start..start + SAMPLE_RUN).map(|i| key(value_at(i))));
        });
        self.keys = keys;
        if !sampled {
            return 0;
        }
        self.upper = self.keys.len();
        self.cut()
    }

    /// Draws the sample for a tensor of `n` elements keeping `k`: calls `run(start)` for
    /// each run of 16 consecutive positions `start..start + 16` and sets the margin; returns
    /// false (threshold 0, no sample) for small tensors or `k > n / 2`.
    pub fn sample_runs(
        &mut self,
        n: usize,
        k: usize,
        rng: &mut ChaCha8Rng,
        mut run: impl FnMut(usize),
    ) -> bool {
        self.keys.clear();
        self.thr = 0;
        self.upper = 0;
        if n <= SMALL_N || k > n / 2 {
            return false;
        }
        let p = k as f64 / n as f64;
        // 32 expected hits of the k-th value, within the paper's 0.1%..1% of the tensor (at
        // least 1024, at most a quarter of it).
        let want = ((32.0 / p) as usize)
            .clamp(n / 1000, n / 100)
            .clamp(1024, MAX_SAMPLES);
        let want = want.min(n / 4);
        let runs = want.div_ceil(SAMPLE_RUN);
        let stride = n / runs;
        if stride < SAMPLE_RUN {
            return false;
        }
        for j in 0..runs {
            run(j * stride + rng.gen_range(0..=stride - SAMPLE_RUN));
        }
        let c = (runs * SAMPLE_RUN) as f64 * p;
        self.m = (c + 3.0 * c.sqrt() + 2.0).ceil() as usize;
        true
    }

    /// The first threshold from the keys at the positions [`ThresholdEstimate::sample_runs`]
    /// drew, in its order.
    pub fn first_from_keys(&mut self, keys: &[u32]) -> u32 {
        self.keys.clear();
        self.keys.extend_from_slice(keys);
        self.upper = self.keys.len();
        self.cut()
    }

    fn cut(&mut self) -> u32 {
        let s = self.keys.len();
        if self.m >= s || self.upper == 0 {
            self.thr = 0;
            self.upper = 0;
            return 0;
        }
        let pos = (s - self.m).min(self.upper - 1);
        self.keys[..self.upper].select_nth_unstable(pos);
        self.upper = pos;
        self.thr = self.keys[pos];
        self.thr
    }

    /// A lower threshold (4x the sample hits, finally 0), or `None` when already at 0.
    pub fn lower(&mut self) -> Option<u32> {
        if self.thr == 0 {
            return None;
        }
        let prev = self.thr;
        self.m = self.m.saturating_mul(4);
        while self.cut() == prev && prev != 0 {
            self.m = self.m.saturating_mul(4);
        }
        Some(self.thr)
    }
}

/// Cuts `cand` (increasing local indices into `x`) down to the `k` largest keys, keeping index
/// order; ties at the k-th key go to the lowest indices. No-op when `cand.len() <= k`.
pub(crate) fn cut_to_k(x: &[f32], k: usize, cand: &mut Vec<u32>, scratch: &mut Vec<u32>) {
    if cand.len() <= k {
        return;
    }
    if k == 0 {
        cand.clear();
        return;
    }
    scratch.clear();
    scratch.extend(cand.iter().map(|&i| key(x[i as usize])));
    let pos = scratch.len() - k;
    scratch.select_nth_unstable(pos);
    let tk = scratch[pos];
    let above = scratch[pos + 1..].iter().filter(|&&v| v > tk).count();
    let mut ties = k - above;
    cand.retain(|&i| {
        let kk = key(x[i as usize]);
        if kk > tk {
            true
        } else if kk == tk && ties > 0 {
            ties -= 1;
            true
        } else {
            false
        }
    });
}

/// Exact top-k of `x` by a full `select_nth_unstable` over all keys: appends exactly
/// `min(k, n)` local indices, increasing; ties at the k-th key go to the lowest indices.
pub(crate) fn exact_topk(x: &[f32], k: usize, scratch: &mut Vec<u32>, out: &mut Vec<u32>) {
    let n = x.len();
    if k >= n {
        out.extend(0..n as u32);
        return;
    }
    if k == 0 {
        return;
    }
    scratch.clear();
    scratch.extend(x.iter().map(|&v| key(v)));
    let pos = n - k;
    scratch.select_nth_unstable(pos);
    let tk = scratch[pos];
    let above = scratch[pos + 1..].iter().filter(|&&v| v > tk).count();
    let mut ties = k - above;
    for (i, &v) in x.iter().enumerate() {
        let kk = key(v);
        if kk > tk || (kk == tk && ties > 0) {
            if kk == tk {
                ties -= 1;
            }
            out.push(i as u32);
        }
    }
}

/// Selects (sampled) the top `k` of `x` in place of a fused pass that already ran with
/// threshold `thr`: lowers the threshold and rescans while fewer than `k` candidates came out,
/// then cuts to exactly `k`.
pub(crate) fn finish_sampled(
    x: &[f32],
    k: usize,
    est: &mut ThresholdEstimate,
    cand: &mut Vec<u32>,
    scratch: &mut Vec<u32>,
) {
    while cand.len() < k {
        match est.lower() {
            Some(t) => {
                cand.clear();
                scan_above(x, t, cand);
            }
            None => break,
        }
    }
    cut_to_k(x, k, cand, scratch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparse::{lcg, reference_topk};
    use rand::SeedableRng;

    /// DGC samples 0.1% to 1% of the gradient for its threshold (section 5 of the paper);
    /// within that range the sample aims at 32 hits of the k-th value, never under 1024.
    #[test]
    fn threshold_samples_are_the_papers_tenth_to_one_percent() {
        let n = 1 << 20;
        for (k, lo, hi) in [
            (1, n / 100, n / 100 + 16),         // 32/p beyond 1%: capped at 1%
            (1049, n / 100, n / 100 + 16),      // DGC's 0.1%: 32/p = 32,000 > 1%, so 1%
            (10_486, 3_199, 3_216),             // top-k's 1%: 32/p = 3,200, inside the range
            (262_144, n / 1000, n / 1000 + 16), // DGC's first warm-up epoch (25%): 0.1%
        ] {
            let mut est = ThresholdEstimate::default();
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            est.first(n, k, &mut rng, |i| i as f32);
            let s = est.keys.len();
            assert!(
                (lo..=hi).contains(&s),
                "k={k}: {s} samples, want {lo}..={hi}"
            );
        }
        // Small tensors: at least 1024 samples (at most a quarter of the tensor).
        let mut est = ThresholdEstimate::default();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        est.first(40_000, 40, &mut rng, |i| i as f32);
        assert!(
            (1024..=1040).contains(&est.keys.len()),
            "{}",
            est.keys.len()
        );
    }

    #[test]
    fn exact_and_sampled_agree_with_reference() {
        for &(n, k) in &[
            (10, 3),
            (1000, 10),
            (100_000, 100),
            (100_000, 5000),
            (40_000, 1),
        ] {
            let x = lcg(n, n as u64);
            let want = reference_topk(&x, k);
            let mut scratch = Vec::new();
            let mut got = Vec::new();
            exact_topk(&x, k, &mut scratch, &mut got);
            assert_eq!(got, want, "exact n={n} k={k}");
            let mut est = ThresholdEstimate::default();
            let mut rng = ChaCha8Rng::seed_from_u64(1);
            let thr = est.first(n, k, &mut rng, |i| x[i]);
            let mut cand = Vec::new();
            scan_above(&x, thr, &mut cand);
            finish_sampled(&x, k, &mut est, &mut cand, &mut scratch);
            assert_eq!(cand, want, "sampled n={n} k={k}");
        }
    }

    /// Sampling elsewhere (positions drawn, keys gathered by the caller) gives the CPU's
    /// threshold, and the same lower ones.
    #[test]
    fn keys_gathered_elsewhere_give_the_same_thresholds() {
        let n = 1 << 20;
        let x = lcg(n, 5);
        for k in [n / 1000, n / 100, n / 10] {
            let mut cpu = ThresholdEstimate::default();
            let t = cpu.first(n, k, &mut ChaCha8Rng::seed_from_u64(3), |i| x[i]);
            let mut ext = ThresholdEstimate::default();
            let mut keys = Vec::new();
            assert!(
                ext.sample_runs(n, k, &mut ChaCha8Rng::seed_from_u64(3), |s| {
                    keys.extend((s..s + 16).map(|i| key(x[i])));
                })
            );
            assert_eq!(ext.first_from_keys(&keys), t, "k={k}");
            assert!(t > 0);
            assert_eq!(ext.lower(), cpu.lower());
        }
        let mut e = ThresholdEstimate::default();
        assert!(!e.sample_runs(
            1000,
            1,
            &mut ChaCha8Rng::seed_from_u64(1),
            |_| unreachable!()
        ));
    }

    #[test]
    fn sampled_falls_back_when_sample_overshoots() {
        // All the mass in one narrow spike the strided sample is unlikely to see.
        let n = 200_000;
        let mut x = vec![0.001f32; n];
        for v in &mut x[1000..1100] {
            *v = 5.0;
        }
        let k = 500;
        let mut est = ThresholdEstimate::default();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let thr = est.first(n, k, &mut rng, |i| x[i]);
        let mut cand = Vec::new();
        scan_above(&x, thr, &mut cand);
        let mut scratch = Vec::new();
        finish_sampled(&x, k, &mut est, &mut cand, &mut scratch);
        assert_eq!(cand, reference_topk(&x, k));
    }

    #[test]
    fn fused_kernel_adds_and_collects() {
        let g = lcg(1000, 5);
        let mut r = lcg(1000, 6);
        let want: Vec<f32> = g.iter().zip(&r).map(|(a, b)| a + b).collect();
        let mut cand = Vec::new();
        scan_add_into(&g, &mut r, key(0.9), &mut cand);
        assert_eq!(r, want);
        let exp: Vec<u32> = (0..1000u32)
            .filter(|&i| want[i as usize].abs() > 0.9)
            .collect();
        assert_eq!(cand, exp);
    }

    #[test]
    fn k_for_is_exact_on_round_products() {
        assert_eq!(k_for(0.01, 100), 1);
        assert_eq!(k_for(0.01, 101), 2);
        assert_eq!(k_for(0.001, 25_000_000), 25_000);
        assert_eq!(k_for(1e-9, 10), 1);
        assert_eq!(k_for(1.0, 10), 10);
        assert_eq!(k_for(0.5, 0), 0);
    }
}
