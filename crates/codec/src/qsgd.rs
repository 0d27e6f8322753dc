//! `qsgd`: Quantized SGD (Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD:
//! Communication-Efficient SGD via Gradient Quantization and Encoding", NeurIPS 2017).
//!
//! Each tensor of [`crate::BuildContext::layout`] (the whole gradient when the layout does not
//! fit) is cut into buckets of `d = bucket` consecutive elements, the last one of each tensor
//! shorter: a bucket never straddles two tensors (the paper quantizes per layer; a bucket
//! mixing a weight and a tiny bias would scale the bias by the weight's norm). Each bucket `v` has
//! a scale `m` (`norm=l2`: `||v||_2`, the paper's analysis; `norm=max`: `||v||_inf`, its
//! experiments). With `s` levels, `r_i = s |v_i| / m`, `l = floor(r_i)`, and the level is
//! `l + 1` with probability `r_i - l`, else `l` (stochastic rounding), so
//! `Q(v)_i = m sign(v_i) level_i / s` is unbiased, with variance at most
//! `min(d / s^2, sqrt(d) / s) ||v||_2^2` per bucket. `bits=b` means `s = 2^(b-1) - 1` (sign
//! and level in `b` bits: 2 bits is ternary, 8 bits is s = 127); `levels=s` sets `s`
//! directly. The uniforms come from the codec's `(seed, rank, step)` stream ([`crate::StepRng`]).
//!
//! Wire layout, `coding=fixed`: the 12-byte [`crate::Header`] (codec 7), then per bucket
//! of `c` elements, in order:
//! ```text
//! 0..4                 m     f32  the bucket's scale
//! 4..4+4*ceil(c/K)     codes      level + s offset by sign: code = s + sign(v) * level,
//!                                 in [0, 2s], w = bitlen(2s) bits each, K = floor(32/w)
//!                                 per u32 word, lane-packed (see `pack.rs`)
//! ```
//! Ratio: `32 c / (32 + 32 ceil(c/K))`, about `32 / w` (4 bits, d = 512: 7.76).
//!
//! Wire layout, `coding=elias` (the paper's encoding): the header, then one MSB-first bit
//! stream, zero-padded to a byte, holding per bucket: `m` (32 bits, f32), `omega(nnz + 1)`,
//! then for each non-zero level in index order `omega(gap)` (gap = index minus the previous
//! non-zero's index, the first counted from -1), one sign bit (1 = negative) and
//! `omega(level)`; `omega` is Elias's recursive code (`elias.rs`). Small `s` makes most
//! levels zero, so this beats fixed width for `s` around `sqrt(d)` and below.

use std::fmt;

use crate::elias::{BitReader, BitWriter};
use std::ops::Range;

use crate::layout::{expect_len, f32_at, finite, segments};
use crate::pack::{pack, packed_bytes, unpack_add, LANES};
use crate::rng::uniform;
use crate::simd::multiversion;
use crate::{
    BuildContext, Caps, Codec, CodecId, ConfigError, DecodeError, Header, Params, Progress,
    StateReader, StateWriter, StepRng, HEADER_LEN,
};

/// How QSGD scales a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QsgdNorm {
    /// Euclidean norm (the paper's analysis).
    L2,
    /// Largest magnitude (the paper's experiments; lower variance).
    Max,
}

/// How QSGD writes levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QsgdCoding {
    /// Fixed-width codes, lane-packed.
    Fixed,
    /// Elias omega codes of gaps and levels of the non-zeros.
    Elias,
}

/// Parameters of QSGD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QsgdConfig {
    /// Quantization levels `s` (1..=32767).
    pub levels: u32,
    /// Bucket size `d`.
    pub bucket: usize,
    /// Bucket scale.
    pub norm: QsgdNorm,
    /// Level coding.
    pub coding: QsgdCoding,
    /// Error feedback (default off: QSGD is unbiased). Feedback needs `|x - Q(x)| < |x|`,
    /// which QSGD with few levels does not give: with 2 bits its residual grows without bound.
    pub ef: bool,
}

impl Default for QsgdConfig {
    fn default() -> Self {
        QsgdConfig {
            levels: 7,
            bucket: 512,
            norm: QsgdNorm::Max,
            coding: QsgdCoding::Fixed,
            ef: false,
        }
    }
}

/// Largest `s` (16-bit codes).
pub const MAX_LEVELS: u32 = 32767;

impl QsgdConfig {
    /// Reads `bits=` or `levels=`, `bucket=`, `norm=`, `coding=`, `ef=`.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        let bits = p.usize_in("bits", Some(0), 2, 16);
        let levels = p.usize_in("levels", Some(0), 1, MAX_LEVELS as usize);
        let levels = match (bits, levels) {
            (Ok(0), Ok(0)) => 7,
            (Ok(b), Ok(0)) => (1u32 << (b - 1)) - 1,
            (Ok(0), Ok(s)) => s as u32,
            (Ok(_), Ok(s)) => {
                return Err(ConfigError::BadValue {
                    codec: "qsgd".into(),
                    param: "levels".into(),
                    value: s.to_string(),
                    reason: "give bits= or levels=, not both".into(),
                })
            }
            (Err(e), _) | (_, Err(e)) => return Err(e),
        };
        let bucket = p.usize_in("bucket", Some(512), 1, 1 << 30)?;
        let norm = match p.choice("norm", "max", &["l2", "max"])? {
            "l2" => QsgdNorm::L2,
            _ => QsgdNorm::Max,
        };
        let coding = match p.choice("coding", "fixed", &["fixed", "elias"])? {
            "elias" => QsgdCoding::Elias,
            _ => QsgdCoding::Fixed,
        };
        let ef = p.bool("ef", false)?;
        Ok(QsgdConfig {
            levels,
            bucket,
            norm,
            coding,
            ef,
        })
    }

    /// The runtime codec.
    pub fn build(&self, ctx: &BuildContext) -> Box<dyn Codec> {
        let q = Qsgd::new(self.clone(), ctx.seed, ctx.rank).with_layout(&ctx.layout);
        crate::feedback::maybe_wrap(q, self.ef)
    }

    /// Bits per fixed-width code: `bitlen(2s)`.
    pub fn width(&self) -> u32 {
        32 - (2 * self.levels).leading_zeros()
    }
}

impl fmt::Display for QsgdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.levels;
        if (s + 1).is_power_of_two() && s >= 1 {
            write!(f, "bits={}", (s + 1).trailing_zeros() + 1)?;
        } else {
            write!(f, "levels={s}")?;
        }
        let norm = match self.norm {
            QsgdNorm::L2 => "l2",
            QsgdNorm::Max => "max",
        };
        let coding = match self.coding {
            QsgdCoding::Fixed => "fixed",
            QsgdCoding::Elias => "elias",
        };
        write!(
            f,
            ",bucket={},norm={norm},coding={coding},ef={}",
            self.bucket, self.ef
        )
    }
}

/// The QSGD quantizer.
#[derive(Debug, Clone)]
pub struct Qsgd {
    cfg: QsgdConfig,
    rng: StepRng,
    layout: Vec<usize>,
}

/// The buckets of a gradient of `n` elements: runs of `d` inside each tensor of `layout`.
pub(crate) fn buckets(layout: &[usize], n: usize, d: usize) -> Vec<Range<usize>> {
    segments(layout, n)
        .flat_map(|seg| {
            let e = seg.end;
            (seg.start..e)
                .step_by(d.max(1))
                .map(move |a| a..(a + d).min(e))
        })
        .collect()
}

/// Lane-parallel max |x| or sum x^2 of a bucket.
#[inline(always)]
fn bucket_norm(x: &[f32], norm: QsgdNorm) -> f32 {
    let mut acc = [0f32; LANES];
    let mut it = x.chunks_exact(LANES);
    match norm {
        QsgdNorm::Max => {
            for c in &mut it {
                for l in 0..LANES {
                    acc[l] = acc[l].max(c[l].abs());
                }
            }
            let m = acc.iter().fold(0f32, |a, &b| a.max(b));
            it.remainder().iter().fold(m, |a, &b| a.max(b.abs()))
        }
        QsgdNorm::L2 => {
            for c in &mut it {
                for l in 0..LANES {
                    acc[l] += c[l] * c[l];
                }
            }
            let s: f32 =
                acc.iter().sum::<f32>() + it.remainder().iter().map(|v| v * v).sum::<f32>();
            s.sqrt()
        }
    }
}

/// The stochastically rounded level of `v` (0..=s).
#[inline(always)]
fn level(v: f32, inv: f32, sf: f32, s: i32, key: u32, i: u32) -> i32 {
    let r = (v.abs() * inv).min(sf);
    let fl = r.floor();
    let p = r - fl;
    // fl is an integer in [0, 32767]: adding 2^23 puts it in the mantissa, exactly, without
    // a saturating float-to-int cast (which does not vectorize).
    let l = (fl + 8_388_608.0).to_bits() as i32 - 0x4B00_0000;
    (l + (uniform(key, i) < p) as i32).min(s)
}

multiversion! {
fn encode_fixed<const W: u32>(cfg: &QsgdConfig, bks: &[Range<usize>], key: u32, grad: &[f32], body: &mut [u8]) {
    let s = cfg.levels as i32;
    let sf = s as f32;
    let mut at = 0;
    for b in bks {
        let x = &grad[b.clone()];
        let m = bucket_norm(x, cfg.norm);
        let len = 4 + packed_bytes(x.len(), W);
        let dst = &mut body[at..at + len];
        dst[..4].copy_from_slice(&m.to_le_bytes());
        let inv = if m > 0.0 { sf / m } else { 0.0 };
        let base = b.start as u32;
        pack::<W>(x, base, &mut dst[4..], |v, i| {
            let lv = level(v, inv, sf, s, key, i);
            (if v < 0.0 { s - lv } else { s + lv }) as u32
        });
        at += len;
    }
}
}

#[inline(always)]
fn max_code<const W: u32>(src: &[u8]) -> u32 {
    let mask = (1u32 << W) - 1;
    let k = 32 / W;
    let mut mx = [0u32; LANES];
    let mut it = src.chunks_exact(4 * LANES);
    for c in &mut it {
        for l in 0..LANES {
            let w = u32::from_le_bytes([c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]]);
            for j in 0..k {
                mx[l] = mx[l].max((w >> (j * W)) & mask);
            }
        }
    }
    let mut m = mx.iter().copied().max().unwrap_or(0);
    for c in it.remainder().chunks_exact(4) {
        let w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        for j in 0..k {
            m = m.max((w >> (j * W)) & mask);
        }
    }
    m
}

multiversion! {
fn decode_fixed<const W: u32>(
    cfg: &QsgdConfig,
    bks: &[Range<usize>],
    body: &[u8],
    acc: &mut [f32],
) -> Result<(), DecodeError> {
    let s = cfg.levels;
    let mut at = 0;
    for b in bks {
        let len = 4 + packed_bytes(b.len(), W);
        finite(f32_at(body, at), "qsgd scale")?;
        if max_code::<W>(&body[at + 4..at + len]) > 2 * s {
            return Err(DecodeError::InvalidField {
                field: "qsgd code",
                reason: "level above s",
            });
        }
        at += len;
    }
    let mut at = 0;
    for b in bks {
        let x = &mut acc[b.clone()];
        let len = 4 + packed_bytes(x.len(), W);
        let unit = f32_at(body, at) / s as f32;
        let sf = s as f32;
        unpack_add::<W>(&body[at + 4..at + len], x, |c| (c as f32 - sf) * unit);
        at += len;
    }
    Ok(())
}
}

macro_rules! by_width {
    ($w:expr, $f:ident, $($arg:expr),*) => {
        match $w {
            1 => $f::<1>($($arg),*),
            2 => $f::<2>($($arg),*),
            3 => $f::<3>($($arg),*),
            4 => $f::<4>($($arg),*),
            5 => $f::<5>($($arg),*),
            6 => $f::<6>($($arg),*),
            7 => $f::<7>($($arg),*),
            8 => $f::<8>($($arg),*),
            9 => $f::<9>($($arg),*),
            10 => $f::<10>($($arg),*),
            11 => $f::<11>($($arg),*),
            12 => $f::<12>($($arg),*),
            13 => $f::<13>($($arg),*),
            14 => $f::<14>($($arg),*),
            15 => $f::<15>($($arg),*),
            _ => $f::<16>($($arg),*),
        }
    };
}

impl Qsgd {
    /// A QSGD quantizer for `rank` of a run seeded with `seed`.
    pub fn new(cfg: QsgdConfig, seed: u64, rank: usize) -> Self {
        Qsgd {
            cfg,
            rng: StepRng::new(seed, rank),
            layout: Vec::new(),
        }
    }

    /// Keeps buckets inside the tensors of `layout`.
    pub fn with_layout(mut self, layout: &[usize]) -> Self {
        self.layout = layout.to_vec();
        self
    }

    /// The buckets of a gradient of `n` elements.
    pub fn buckets(&self, n: usize) -> Vec<Range<usize>> {
        buckets(&self.layout, n, self.cfg.bucket)
    }

    fn fixed_len(&self, bks: &[Range<usize>]) -> usize {
        let w = self.cfg.width();
        bks.iter().map(|b| 4 + packed_bytes(b.len(), w)).sum()
    }

    fn encode_elias(&self, key: u32, grad: &[f32], out: &mut Vec<u8>) {
        let s = self.cfg.levels as i32;
        let sf = s as f32;
        let mut w = BitWriter::new(out);
        let mut lv: Vec<i32> = Vec::with_capacity(self.cfg.bucket.min(grad.len()));
        for b in self.buckets(grad.len()) {
            let x = &grad[b.clone()];
            let m = bucket_norm(x, self.cfg.norm);
            let inv = if m > 0.0 { sf / m } else { 0.0 };
            let base = b.start as u32;
            lv.clear();
            lv.extend(x.iter().enumerate().map(|(i, &v)| {
                let l = level(v, inv, sf, s, key, base.wrapping_add(i as u32));
                if v < 0.0 {
                    -l
                } else {
                    l
                }
            }));
            w.put(m.to_bits(), 32);
            let nnz = lv.iter().filter(|&&l| l != 0).count();
            w.omega(nnz as u32 + 1);
            let mut prev: i64 = -1;
            for (i, &l) in lv.iter().enumerate() {
                if l != 0 {
                    w.omega((i as i64 - prev) as u32);
                    w.put((l < 0) as u32, 1);
                    w.omega(l.unsigned_abs());
                    prev = i as i64;
                }
            }
        }
        w.finish();
    }

    /// Walks an Elias body, calling `f(index, value)` for each non-zero.
    fn walk_elias(
        &self,
        body: &[u8],
        n: usize,
        mut f: impl FnMut(usize, f32),
    ) -> Result<(), DecodeError> {
        let mut r = BitReader::new(body);
        let s = self.cfg.levels;
        for b in self.buckets(n) {
            let (start, c) = (b.start, b.len());
            let m = finite(f32::from_bits(r.get(32)?), "qsgd scale")?;
            let unit = m / s as f32;
            let nnz = r.omega(c as u32 + 1, "qsgd nnz")? - 1;
            let mut idx: i64 = -1;
            for _ in 0..nnz {
                let gap = r.omega(u32::MAX, "qsgd gap")? as i64;
                idx += gap;
                if idx >= c as i64 {
                    return Err(DecodeError::IndexOutOfRange {
                        index: (start as u64).saturating_add(idx as u64),
                        len: n,
                    });
                }
                let neg = r.get(1)? == 1;
                let l = r.omega(s, "qsgd level")? as f32;
                f(start + idx as usize, if neg { -l * unit } else { l * unit });
            }
        }
        let used = r.bytes_used();
        if used != body.len() {
            return Err(DecodeError::TrailingBytes {
                extra: body.len() - used,
            });
        }
        Ok(())
    }
}

impl Codec for Qsgd {
    fn id(&self) -> CodecId {
        CodecId::Qsgd
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let key = self.rng.next_key();
        Header::write(out, CodecId::Qsgd, grad.len());
        match self.cfg.coding {
            QsgdCoding::Fixed => {
                let bks = self.buckets(grad.len());
                out.resize(HEADER_LEN + self.fixed_len(&bks), 0);
                let body = &mut out[HEADER_LEN..];
                let cfg = &self.cfg;
                by_width!(cfg.width(), encode_fixed, cfg, &bks, key, grad, body)
            }
            QsgdCoding::Elias => self.encode_elias(key, grad, out),
        }
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let body = Header::check(payload, CodecId::Qsgd, acc.len())?;
        match self.cfg.coding {
            QsgdCoding::Fixed => {
                let bks = self.buckets(acc.len());
                expect_len(body, self.fixed_len(&bks))?;
                let cfg = &self.cfg;
                by_width!(cfg.width(), decode_fixed, cfg, &bks, body, acc)
            }
            QsgdCoding::Elias => {
                self.walk_elias(body, acc.len(), |_, _| ())?;
                self.walk_elias(body, acc.len(), |i, v| acc[i] += v)
            }
        }
    }

    fn caps(&self) -> Caps {
        Caps::UNBIASED
    }

    fn set_progress(&mut self, progress: Progress) {
        self.rng.set_step(progress.step);
    }

    fn save_state(&self) -> Vec<u8> {
        let mut w = StateWriter::new(CodecId::Qsgd);
        self.rng.save(&mut w);
        w.finish()
    }

    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        let mut r = StateReader::new(state, CodecId::Qsgd)?;
        let rng = self.rng.loaded(&mut r)?;
        r.finish()?;
        self.rng = rng;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_resumes;

    fn grad(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.61).sin() + 0.3 * (i as f32 * 0.13).cos()) * 0.01)
            .collect()
    }

    fn cfg(levels: u32, bucket: usize, norm: QsgdNorm, coding: QsgdCoding) -> QsgdConfig {
        QsgdConfig {
            levels,
            bucket,
            norm,
            coding,
            ef: false,
        }
    }

    /// Mean of `trials` decodes and the mean squared error per bucket, over fixed seeds.
    fn stats(c: &QsgdConfig, g: &[f32], trials: usize) -> (Vec<f64>, f64) {
        let mut q = Qsgd::new(c.clone(), 42, 1);
        let mut mean = vec![0f64; g.len()];
        let mut sq = 0f64;
        let mut out = Vec::new();
        let mut d = vec![0f32; g.len()];
        for _ in 0..trials {
            q.encode(g, &mut out);
            d.fill(0.0);
            q.decode_add(&out, &mut d).unwrap();
            for i in 0..g.len() {
                mean[i] += d[i] as f64 / trials as f64;
                sq += ((d[i] - g[i]) as f64).powi(2) / trials as f64;
            }
        }
        (mean, sq)
    }

    #[test]
    fn unbiased_and_variance_within_bound() {
        let g = grad(1000);
        for coding in [QsgdCoding::Fixed, QsgdCoding::Elias] {
            for norm in [QsgdNorm::L2, QsgdNorm::Max] {
                for (s, d) in [(1u32, 256usize), (7, 512), (127, 100)] {
                    let c = cfg(s, d, norm, coding);
                    let trials = 2000;
                    let (mean, sq) = stats(&c, &g, trials);
                    // Unbiased: every coordinate's mean within 5 standard errors.
                    for (b, gb) in g.chunks(d).enumerate() {
                        let m = match norm {
                            QsgdNorm::L2 => gb.iter().map(|v| v * v).sum::<f32>().sqrt(),
                            QsgdNorm::Max => gb.iter().fold(0f32, |a, v| a.max(v.abs())),
                        } as f64;
                        let se = (m / s as f64) * 0.5 / (trials as f64).sqrt();
                        for (i, &v) in gb.iter().enumerate() {
                            let e = (mean[b * d + i] - v as f64).abs();
                            assert!(e <= 5.0 * se + 1e-7, "{coding:?} {norm:?} s={s} {e} {se}");
                        }
                    }
                    // Variance bound, summed over buckets.
                    let bound: f64 = g
                        .chunks(d)
                        .map(|b| {
                            let n = b.len() as f64;
                            let sf = s as f64;
                            let n2: f64 = b.iter().map(|v| (*v as f64).powi(2)).sum();
                            (n / (sf * sf)).min(n.sqrt() / sf) * n2
                        })
                        .sum();
                    assert!(
                        sq <= bound * 1.05,
                        "{coding:?} {norm:?} s={s}: {sq} > {bound}"
                    );
                }
            }
        }
    }

    #[test]
    fn fixed_ratio_matches_formula_and_state_resumes() {
        let n = 100_000;
        let g = grad(n);
        let c = cfg(7, 512, QsgdNorm::Max, QsgdCoding::Fixed);
        assert_eq!(c.width(), 4);
        let mut q = Qsgd::new(c, 1, 0);
        let mut out = Vec::new();
        q.encode(&g, &mut out);
        let buckets = n.div_ceil(512);
        let words: usize = g.chunks(512).map(|b| b.len().div_ceil(8)).sum();
        assert_eq!(out.len(), HEADER_LEN + 4 * buckets + 4 * words);
        let mut q2 = Qsgd::new(cfg(7, 512, QsgdNorm::Max, QsgdCoding::Fixed), 1, 0);
        assert_resumes(&mut q, &mut q2, [g.clone()]);
        // A different step gives a different draw, the same step the same one.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let mut q3 = Qsgd::new(cfg(7, 512, QsgdNorm::Max, QsgdCoding::Fixed), 1, 0);
        q3.set_progress(Progress {
            step: 5,
            epoch: 0.0,
        });
        q3.encode(&g, &mut a);
        let mut q4 = Qsgd::new(cfg(7, 512, QsgdNorm::Max, QsgdCoding::Fixed), 1, 0);
        q4.set_progress(Progress {
            step: 5,
            epoch: 0.0,
        });
        q4.encode(&g, &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn elias_is_small_for_few_levels_and_rejects_garbage() {
        let n = 4096;
        let g = grad(n);
        let mut q = Qsgd::new(cfg(1, 4096, QsgdNorm::L2, QsgdCoding::Elias), 3, 0);
        let mut out = Vec::new();
        q.encode(&g, &mut out);
        // s = 1, L2 norm: about sqrt(n) non-zeros, a few bits each.
        assert!(out.len() - HEADER_LEN < n / 8, "{}", out.len());
        let mut acc = vec![0.0; n];
        q.decode_add(&out, &mut acc).unwrap();
        let mut bad = out.clone();
        bad.push(0);
        assert!(q.decode_add(&bad, &mut acc).is_err());
        for cut in HEADER_LEN..out.len() {
            assert!(q.decode_add(&out[..cut], &mut acc).is_err());
        }
    }

    #[test]
    fn spec_bits_and_levels() {
        let p = |s: &str| QsgdConfig::parse(&mut Params::parse(s).unwrap());
        assert_eq!(p("qsgd:bits=8").unwrap().levels, 127);
        assert_eq!(p("qsgd:bits=2").unwrap().levels, 1);
        assert_eq!(p("qsgd:levels=5").unwrap().width(), 4);
        assert!(p("qsgd:bits=4,levels=3").is_err());
        assert!(p("qsgd:bits=1").is_err());
        assert_eq!(
            p("qsgd:levels=3").unwrap().to_string(),
            "bits=3,bucket=512,norm=max,coding=fixed,ef=false"
        );
    }
}
