//! Shared machinery of the sparsifying codecs (top-k, DGC, random-k, threshold, adaptive):
//! threshold estimation by sampling, exact k-th selection, the fused scan kernels, and the
//! sparse payload writer/reader.
//!
//! # Selection
//! Magnitudes are compared as *keys*: the f32 bit pattern with the sign bit cleared. For
//! non-negative floats (NaN included) the integer order of the bits is the total order of the
//! values, so a NaN ranks above +inf and is sent rather than kept in a residual forever.
//!
//! The fast path (top-k `select=sampled`, DGC) is: sample a few thousand to a few hundred
//! thousand elements in cache-line blocks at jittered strided positions, take an order
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
//! # Sparse payload wire layout (top-k, DGC)
//! ```text
//! 0..12   Header (codec id, element count n)
//! 12      index coding u8: 0 = plain u32 LE per index, 1 = delta LEB128 (see below)
//! 13      value coding u8: 0 = f32 LE, 1 = f16 LE (IEEE half)
//! 14..16  reserved u16 = 0
//! 16..24  nnz u64: number of (index, value) pairs, <= n
//! 24..    nnz values (4 or 2 bytes each)
//! then    the nnz indices, strictly increasing, each < n:
//!           plain: u32 LE each
//!           delta: LEB128 varints (1..5 bytes): first index, then (index - previous - 1)
//! ```
//! The writer picks whichever index coding is shorter. Decoders check every field and the
//! exact length before touching the accumulator, so a bad payload leaves it unchanged.

use half::f16;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::{CodecId, DecodeError, Header, HEADER_LEN};

/// How the values of a sparse payload travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ValueFormat {
    /// 32-bit IEEE floats.
    #[default]
    Fp32,
    /// 16-bit IEEE floats (the rounding error stays in the residual).
    Fp16,
}

impl ValueFormat {
    /// The spec-string spelling (`fp32`, `fp16`).
    pub fn name(self) -> &'static str {
        match self {
            ValueFormat::Fp32 => "fp32",
            ValueFormat::Fp16 => "fp16",
        }
    }

    pub(crate) fn from_name(s: &str) -> Self {
        if s == "fp16" {
            ValueFormat::Fp16
        } else {
            ValueFormat::Fp32
        }
    }

    /// Bytes per value on the wire.
    pub fn bytes(self) -> usize {
        match self {
            ValueFormat::Fp32 => 4,
            ValueFormat::Fp16 => 2,
        }
    }

    /// The value as the receiver will see it.
    #[inline]
    pub(crate) fn round(self, v: f32) -> f32 {
        match self {
            ValueFormat::Fp32 => v,
            ValueFormat::Fp16 => to_f16(v).to_f32(),
        }
    }
}

/// `v` as f16, saturating finite values at +-65504 instead of overflowing to infinity.
#[inline]
pub(crate) fn to_f16(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.is_infinite() && v.is_finite() {
        if v > 0.0 {
            f16::MAX
        } else {
            f16::MIN
        }
    } else {
        h
    }
}

/// Bytes of the sparse payload before the values.
pub(crate) const SPARSE_PREFIX: usize = HEADER_LEN + 12;

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
#[derive(Debug, Default, Clone)]
pub(crate) struct ThresholdEstimate {
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
        self.keys.clear();
        self.thr = 0;
        self.upper = 0;
        if n <= SMALL_N || k > n / 2 {
            return 0;
        }
        let p = k as f64 / n as f64;
        let want = ((32.0 / p) as usize).max(n / 1000).clamp(1024, MAX_SAMPLES);
        let want = want.min(n / 4);
        let runs = want.div_ceil(SAMPLE_RUN);
        let stride = n / runs;
        if stride < SAMPLE_RUN {
            return 0;
        }
        for j in 0..runs {
            let start = j * stride + rng.gen_range(0..=stride - SAMPLE_RUN);
            for i in start..start + SAMPLE_RUN {
                self.keys.push(key(value_at(i)));
            }
        }
        let s = self.keys.len();
        let c = s as f64 * p;
        self.m = (c + 3.0 * c.sqrt() + 2.0).ceil() as usize;
        self.upper = s;
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
    pub(crate) fn lower(&mut self) -> Option<u32> {
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

fn varint_len(v: u32) -> usize {
    match v {
        0..=0x7f => 1,
        0x80..=0x3fff => 2,
        0x4000..=0x1f_ffff => 3,
        0x20_0000..=0xfff_ffff => 4,
        _ => 5,
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn gaps(indices: &[u32]) -> impl Iterator<Item = u32> + '_ {
    let mut prev: Option<u32> = None;
    indices.iter().map(move |&i| {
        let g = match prev {
            None => i,
            Some(p) => i - p - 1,
        };
        prev = Some(i);
        g
    })
}

/// Bytes the index section of a sparse payload will take (the shorter coding).
#[cfg(test)]
pub(crate) fn index_bytes(indices: &[u32]) -> usize {
    let delta: usize = gaps(indices).map(varint_len).sum();
    delta.min(4 * indices.len())
}

/// Writes a whole sparse payload (layout in the module doc). `indices` strictly increasing,
/// each `< n`; `values` already rounded to `vf`. The index coding is the shorter of the two
/// (plain only, if `!allow_delta`).
pub(crate) fn write_sparse(
    out: &mut Vec<u8>,
    codec: CodecId,
    n: usize,
    indices: &[u32],
    values: &[f32],
    vf: ValueFormat,
    allow_delta: bool,
) {
    debug_assert_eq!(indices.len(), values.len());
    let delta: usize = gaps(indices).map(varint_len).sum();
    let use_delta = allow_delta && delta < 4 * indices.len();
    Header::write(out, codec, n);
    out.reserve(12 + values.len() * vf.bytes() + delta.min(4 * indices.len()));
    out.push(use_delta as u8);
    out.push(match vf {
        ValueFormat::Fp32 => 0,
        ValueFormat::Fp16 => 1,
    });
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&(indices.len() as u64).to_le_bytes());
    match vf {
        ValueFormat::Fp32 => {
            for v in values {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        ValueFormat::Fp16 => {
            for v in values {
                out.extend_from_slice(&to_f16(*v).to_le_bytes());
            }
        }
    }
    if use_delta {
        for g in gaps(indices) {
            put_varint(out, g);
        }
    } else {
        for i in indices {
            out.extend_from_slice(&i.to_le_bytes());
        }
    }
}

fn invalid(field: &'static str, reason: &'static str) -> DecodeError {
    DecodeError::InvalidField { field, reason }
}

/// Reads a little-endian u64 at `at`, or `Truncated`.
pub(crate) fn read_u64(b: &[u8], at: usize) -> Result<u64, DecodeError> {
    b.get(at..at + 8)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
        .ok_or(DecodeError::Truncated {
            need: at + 8,
            have: b.len(),
        })
}

/// Reads a little-endian u32 at `at`, or `Truncated`.
pub(crate) fn read_u32(b: &[u8], at: usize) -> Result<u32, DecodeError> {
    b.get(at..at + 4)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
        .ok_or(DecodeError::Truncated {
            need: at + 4,
            have: b.len(),
        })
}

/// Reads a little-endian f32 at `at`, or `Truncated`.
pub(crate) fn read_f32(b: &[u8], at: usize) -> Result<f32, DecodeError> {
    read_u32(b, at).map(f32::from_bits)
}

/// Checks that a payload of `total` bytes is exactly `need` long.
pub(crate) fn check_len(need: usize, total: usize) -> Result<(), DecodeError> {
    if total < need {
        Err(DecodeError::Truncated { need, have: total })
    } else if total > need {
        Err(DecodeError::TrailingBytes {
            extra: total - need,
        })
    } else {
        Ok(())
    }
}

/// A validated view of a sparse payload.
struct SparseView<'a> {
    nnz: usize,
    vf: ValueFormat,
    values: &'a [u8],
    indices: &'a [u8],
    delta: bool,
}

impl SparseView<'_> {
    fn value(&self, j: usize) -> f32 {
        match self.vf {
            ValueFormat::Fp32 => {
                let b = &self.values[4 * j..4 * j + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }
            ValueFormat::Fp16 => {
                let b = &self.values[2 * j..2 * j + 2];
                f16::from_le_bytes([b[0], b[1]]).to_f32()
            }
        }
    }

    /// Visits every index in order (validated already, or validating: `f` may fail).
    fn for_each_index(&self, n: usize, mut f: impl FnMut(usize, usize)) -> Result<(), DecodeError> {
        if self.delta {
            let b = self.indices;
            let mut pos = 0;
            let mut next: u64 = 0;
            for j in 0..self.nnz {
                let mut v: u64 = 0;
                let mut shift = 0;
                loop {
                    let byte = *b.get(pos).ok_or(DecodeError::Truncated {
                        need: SPARSE_PREFIX + self.values.len() + pos + 1,
                        have: SPARSE_PREFIX + self.values.len() + b.len(),
                    })?;
                    pos += 1;
                    if shift == 28 && byte > 0x0f {
                        return Err(invalid("index", "varint longer than 32 bits"));
                    }
                    v |= u64::from(byte & 0x7f) << shift;
                    if byte & 0x80 == 0 {
                        break;
                    }
                    shift += 7;
                }
                let idx = next + v;
                if idx >= n as u64 {
                    return Err(DecodeError::IndexOutOfRange { index: idx, len: n });
                }
                f(j, idx as usize);
                next = idx + 1;
            }
            if pos != b.len() {
                return Err(DecodeError::TrailingBytes {
                    extra: b.len() - pos,
                });
            }
        } else {
            let mut next: u64 = 0;
            for (j, c) in self.indices.chunks_exact(4).enumerate() {
                let idx = u64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                if idx >= n as u64 {
                    return Err(DecodeError::IndexOutOfRange { index: idx, len: n });
                }
                if idx < next {
                    return Err(invalid("index", "indices not strictly increasing"));
                }
                f(j, idx as usize);
                next = idx + 1;
            }
        }
        Ok(())
    }
}

fn parse_sparse(payload: &[u8], codec: CodecId, n: usize) -> Result<SparseView<'_>, DecodeError> {
    Header::check(payload, codec, n)?;
    if payload.len() < SPARSE_PREFIX {
        return Err(DecodeError::Truncated {
            need: SPARSE_PREFIX,
            have: payload.len(),
        });
    }
    let delta = match payload[HEADER_LEN] {
        0 => false,
        1 => true,
        _ => return Err(invalid("index_coding", "must be 0 (plain) or 1 (delta)")),
    };
    let vf = match payload[HEADER_LEN + 1] {
        0 => ValueFormat::Fp32,
        1 => ValueFormat::Fp16,
        _ => return Err(invalid("value_coding", "must be 0 (fp32) or 1 (fp16)")),
    };
    if payload[HEADER_LEN + 2] != 0 || payload[HEADER_LEN + 3] != 0 {
        return Err(invalid("reserved", "must be zero"));
    }
    let nnz = read_u64(payload, HEADER_LEN + 4)?;
    if nnz > n as u64 {
        return Err(invalid("nnz", "more pairs than elements"));
    }
    let nnz = nnz as usize;
    let vend = SPARSE_PREFIX + nnz * vf.bytes();
    if payload.len() < vend {
        return Err(DecodeError::Truncated {
            need: vend,
            have: payload.len(),
        });
    }
    if !delta {
        check_len(vend + 4 * nnz, payload.len())?;
    } else if payload.len() - vend > 5 * nnz {
        return Err(DecodeError::TrailingBytes {
            extra: payload.len() - vend - 5 * nnz,
        });
    }
    Ok(SparseView {
        nnz,
        vf,
        values: &payload[SPARSE_PREFIX..vend],
        indices: &payload[vend..],
        delta,
    })
}

/// Decodes a sparse payload of `codec` and adds `scale * value` at each index into `acc`.
/// Validates everything first: on error `acc` is unchanged.
pub(crate) fn decode_sparse_add(
    payload: &[u8],
    codec: CodecId,
    acc: &mut [f32],
) -> Result<(), DecodeError> {
    let n = acc.len();
    let view = parse_sparse(payload, codec, n)?;
    view.for_each_index(n, |_, _| {})?;
    view.for_each_index(n, |j, i| acc[i] += view.value(j))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn lcg(n: usize, seed: u64) -> Vec<f32> {
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

    fn reference_topk(x: &[f32], k: usize) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..x.len() as u32).collect();
        idx.sort_by(|&a, &b| key(x[b as usize]).cmp(&key(x[a as usize])).then(a.cmp(&b)));
        idx.truncate(k);
        idx.sort_unstable();
        idx
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
    fn sparse_round_trip_both_codings() {
        let n = 100_000;
        for idx in [vec![0u32, 5, 99_999], (0..2000).map(|i| i * 3).collect()] {
            let vals: Vec<f32> = idx.iter().map(|&i| i as f32 * 0.5 - 3.0).collect();
            for vf in [ValueFormat::Fp32, ValueFormat::Fp16] {
                let mut out = Vec::new();
                write_sparse(&mut out, CodecId::TopK, n, &idx, &vals, vf, true);
                assert_eq!(
                    out.len(),
                    SPARSE_PREFIX + idx.len() * vf.bytes() + index_bytes(&idx)
                );
                let mut acc = vec![0.0; n];
                decode_sparse_add(&out, CodecId::TopK, &mut acc).unwrap();
                for (&i, &v) in idx.iter().zip(&vals) {
                    assert_eq!(acc[i as usize], vf.round(v));
                }
            }
        }
    }

    #[test]
    fn sparse_decoder_rejects_malformed() {
        let n = 100;
        let mut plain = Vec::new();
        write_sparse(
            &mut plain,
            CodecId::TopK,
            n,
            &[1, 70],
            &[1.0, 2.0],
            ValueFormat::Fp32,
            false,
        );
        assert_eq!(plain[HEADER_LEN], 0);
        let mut acc = vec![0.0; n];
        let d = |p: &[u8], acc: &mut [f32]| decode_sparse_add(p, CodecId::TopK, acc);
        for cut in 0..plain.len() {
            assert!(d(&plain[..cut], &mut acc).is_err(), "cut {cut}");
        }
        let mut p = plain.clone();
        p.push(0);
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::TrailingBytes { .. })
        ));
        let mut p = plain.clone();
        let at = p.len() - 4;
        p[at..].copy_from_slice(&100u32.to_le_bytes());
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::IndexOutOfRange { index: 100, .. })
        ));
        let mut p = plain.clone();
        p[at..].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::InvalidField { .. })
        ));
        let mut p = plain.clone();
        p[HEADER_LEN + 4..HEADER_LEN + 12].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::InvalidField { .. })
        ));
        let mut p = plain.clone();
        p[HEADER_LEN + 1] = 7;
        assert!(d(&p, &mut acc).is_err());
        assert!(acc.iter().all(|&v| v == 0.0), "errors leave acc unchanged");

        let mut delta = Vec::new();
        write_sparse(
            &mut delta,
            CodecId::TopK,
            n,
            &[1, 2, 3],
            &[1.0; 3],
            ValueFormat::Fp16,
            true,
        );
        assert_eq!(delta[HEADER_LEN], 1);
        for cut in 0..delta.len() {
            assert!(d(&delta[..cut], &mut acc).is_err(), "cut {cut}");
        }
        let mut p = delta.clone();
        let last = p.len() - 1;
        p[last] = 0x7f; // 2 + 1 + 127 > n
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::IndexOutOfRange { .. })
        ));
        p[last] = 0x80; // unterminated varint
        assert!(matches!(
            d(&p, &mut acc),
            Err(DecodeError::Truncated { .. })
        ));
        assert!(acc.iter().all(|&v| v == 0.0));
    }

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
