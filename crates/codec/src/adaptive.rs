//! Adaptive quantization — Dryden, Moon, Jacobs & Van Essen, "Communication Quantization for
//! Data-parallel Training of Deep Neural Networks", MLHPC 2016 (as in LBANN's
//! `lbann_quantizer`).
//!
//! With a residual `r` (error feedback, always on): `x = g + r`. Per column, a positive threshold
//! `tau+` and a negative threshold `tau-` are estimated from a random sample of `x` (at least
//! 128 elements, `64/pi` when larger; the whole column when it is smaller) so that about a
//! proportion `pi` of the positive and of the negative entries lie beyond them. Entries
//! `x >= tau+` are sent as `+mu+`, entries `x <= -tau-` as `-mu-`, where `mu+` and `mu-` are
//! the means of the magnitudes of the entries sent (the reconstruction values); the residual
//! keeps `x - sent`. `pi` defaults to 1/64, LBANN's default proportion (one in 64 values).
//!
//! Columns (`column=`, default `shape`): LBANN quantizes each column of its column-major
//! `[out, in]` weight matrices, i.e. one input unit's `out` weights; in burn's row-major
//! `[in, out]` Linear weight that is one row, so a column here is one index of the tensor's
//! leading axis (`out` elements of a Linear weight, one output channel's `c_in*kh*kw` filter of
//! a conv weight, a whole bias; see `layout.rs` and `onebit.rs`). Deviation when the shapes are
//! unknown: runs of 2048 elements inside each tensor of the layout. `column=tensor` makes
//! each tensor one column (this codec's behaviour before shapes were known), `column=N` uses
//! runs of `N`.
//!
//! Ternary reconstruction (`ternary=true`, off by default; LBANN's optional variant): each
//! column also sends a third value `mu0`, the mean of the entries it did not send, and every
//! unsent entry decodes to `mu0` instead of 0 (the residual keeps `x - mu0` there). The
//! message is then dense in effect (4 more bytes per column, every entry reconstructed).
//!
//! Golomb-Rice index coding (`index=golomb`, off by default; LBANN's option, `M = 16`): the
//! words become one MSB-first bit stream, zero-padded to a byte, holding per sent entry the
//! gap to the previous sent index (`index - previous - 1`, the first counted from -1) as
//! `q = gap / 16` one-bits, a zero, the 4-bit remainder, then the sign bit (1 = `-mu_neg`).
//!
//! Message size is bounded: when sampling under-estimated the thresholds and
//! more than `max(ceil(max_excess * pi * len), 2)` entries of a column qualify, only that many
//! (the largest `|x|`) are sent and the rest go back to the residual. The floor of 2 keeps
//! the one entry of each sign the quantiles always select: without it a column shorter than
//! `1 / (max_excess * pi)` (32 elements at the defaults: LeNet's conv1 filters of 25, its
//! output rows of 10, small biases) was cut to its single largest `|x|`, one sign per step.
//! Deviation: LBANN caps the whole matrix at `MAX_QUANTIZED_EXCESS * n / proportion`, trimming
//! from the last columns; per column here, so no column loses its entries to another's.
//!
//! Exchange, and what learns (LeNet / Fashion-MNIST, 4 workers, SGD lr 0.05, momentum 0.9):
//! `--sync auto` routes this codec to the stripe all-reduce, Dryden's exchange with two
//! quantizations in series (each rank's slice with its residual, then the owner's reduced
//! slice, at the same `pi`, with a second residual). That second quantization is what kills
//! LeNet in 2 seeds of 3: the owner receives up to `2P` entries per column and forwards about
//! 2 (one of each sign in a column of up to 128 entries: all of LeNet's but conv2's filters),
//! so the update lags about twice as far behind the gradient as after one quantization and
//! points elsewhere (docs/fidelity.md has the per-step figures). It is the algorithm as
//! specified, not a defect of this quantizer (the exchange equals a naive two-stage oracle bit
//! for bit). The named alternative is `--sync gather`: each rank's message quantized once,
//! all-gathered and summed exactly (numerically the stripe exchange with a lossless owner
//! leg: same epoch-1 loss and accuracy, measured); with
//! `--momentum-correction on` it reaches 87.47 / 88.19 / 87.92% in seeds 1 / 2 / 3 (dense
//! 87.63 / 89.04 / 88.69%), at 5.3-5.5x instead of the stripes' 10-14x.
//!
//! Wire layout (little-endian):
//! ```text
//! 0..12   Header (codec id 5 = adaptive, element count n)
//! 12..16  ncols u32
//! 16..    ncols column records of 16 bytes: count u64 (words of this column),
//!         mu_pos f32, mu_neg f32 (finite, >= 0); with ternary=true 20 bytes, then mu0 f32
//!         (finite), and ncols must be the decoder's column count with every word inside
//!         its column
//! then    sum(count) words, (index << 1) | sign (sign 1 = -mu_neg, 0 = +mu_pos), in column
//!         order; flat indices strictly increasing over the payload, < n. u32 words when
//!         n <= 2^31, u64 words for larger tensors
//! ```
//! Size: `16 + 16 * ncols + 4 * sent` bytes. The encoder selects with u32 indices, so it
//! takes at most `u32::MAX` elements; the decoder reads both word widths.

use std::fmt;
use std::ops::Range;

use rand::Rng;

use crate::elias::{BitReader, BitWriter};
use crate::onebit::UNKNOWN_SHAPE_RUN;
use crate::sparse::{
    check_len, check_next, cut_to_k, fit, index_of, is_negative, k_for, load_rng_residual,
    put_words, read_f32, read_u32, read_u64, save_rng_residual, word_at, word_bytes,
};
use crate::{
    BuildContext, Caps, Codec, CodecId, Columns, ConfigError, DecodeError, Feedback, Header,
    Params, Progress, SparseGrad, StepRng, TensorInfo, HEADER_LEN,
};

/// LBANN's default proportion: one in 64 values.
pub const DEFAULT_PI: f64 = 1.0 / 64.0;

/// Parameters of `adaptive:pi=0.015625[,column=shape][,max_excess=2][,ternary=false]
/// [,index=words|golomb]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveConfig {
    /// Proportion of positive (and of negative) entries sent, in (0, 0.5] (default 1/64).
    pub pi: f64,
    /// How elements group into columns (default: the tensors' shapes).
    pub column: Columns,
    /// Cap per column, as a multiple of `pi * len` (default 2, at least 1).
    pub max_excess: f64,
    /// Ternary reconstruction: unsent entries decode to their column's mean (default off).
    pub ternary: bool,
    /// Golomb-Rice coding (M = 16) of the index gaps instead of 32-bit words (default off).
    pub golomb: bool,
}

impl AdaptiveConfig {
    /// Reads `pi`, `column`, `max_excess`, `ternary`.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        Ok(AdaptiveConfig {
            pi: p.f64_in("pi", Some(DEFAULT_PI), 1e-9, 0.5)?,
            column: p.columns(
                "column",
                Columns::Shape(UNKNOWN_SHAPE_RUN),
                UNKNOWN_SHAPE_RUN,
            )?,
            max_excess: p.f64_in("max_excess", Some(2.0), 1.0, 1e6)?,
            ternary: p.bool("ternary", false)?,
            golomb: p.choice("index", "words", &["words", "golomb"])? == "golomb",
        })
    }

    /// The canonical `key=value,...` parameters (parse back to `self`).
    pub fn spec_params(&self) -> String {
        self.to_string()
    }

    /// The runtime codec.
    pub fn build(&self, ctx: &BuildContext) -> Box<dyn Codec> {
        Box::new(Adaptive::new(self.clone(), ctx))
    }
}

impl fmt::Display for AdaptiveConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pi={},column={},max_excess={}",
            self.pi, self.column, self.max_excess
        )?;
        if self.ternary {
            write!(f, ",ternary=true")?;
        }
        if self.golomb {
            write!(f, ",index=golomb")?;
        }
        Ok(())
    }
}

/// Dryden's adaptive quantizer (with its residual).
#[derive(Debug)]
pub struct Adaptive {
    cfg: AdaptiveConfig,
    layout: Vec<usize>,
    tensors: Vec<TensorInfo>,
    rng: StepRng,
    residual: Vec<f32>,
    sample: Vec<f32>,
    cand: Vec<u32>,
    scratch: Vec<u32>,
    /// Per column: (words, mu_pos, mu_neg, mu0 (0 unless ternary)).
    cols: Vec<(u64, f32, f32, f32)>,
    sel: SparseGrad,
}

/// Decodes `total` Golomb-Rice (M = 16) coded entries of a tensor of `n` elements into
/// words `(index << 1) | sign`; the stream must fill `bytes` exactly (to the padding byte).
fn golomb_words(bytes: &[u8], total: usize, n: usize) -> Result<Vec<u64>, DecodeError> {
    let mut r = BitReader::new(bytes);
    let mut words = Vec::with_capacity(total);
    let mut next = 0u64;
    for _ in 0..total {
        let mut q = 0u64;
        while r.get(1)? == 1 {
            q += 1;
            if q > (n as u64 >> 4) {
                return Err(DecodeError::InvalidField {
                    field: "gap",
                    reason: "index gap beyond the tensor",
                });
            }
        }
        let i = next + (q << 4) + u64::from(r.get(4)?);
        if i >= n as u64 {
            return Err(DecodeError::IndexOutOfRange { index: i, len: n });
        }
        words.push((i << 1) | u64::from(r.get(1)?));
        next = i + 1;
    }
    if r.bytes_used() != bytes.len() {
        return Err(DecodeError::InvalidField {
            field: "length",
            reason: "bytes after the Golomb-Rice stream",
        });
    }
    Ok(words)
}

/// The `ceil(pi * len)`-th largest of `v` (sorted descending in place), or +inf if `v` is empty.
fn quantile_desc(v: &mut [f32], pi: f64) -> f32 {
    if v.is_empty() {
        return f32::INFINITY;
    }
    let m = k_for(pi, v.len());
    let (_, kth, _) = v.select_nth_unstable_by(m - 1, |a, b| b.total_cmp(a));
    *kth
}

impl Adaptive {
    /// An adaptive quantizer for `ctx` (its layout gives the columns when `column=0`).
    pub fn new(cfg: AdaptiveConfig, ctx: &BuildContext) -> Self {
        Adaptive {
            cfg,
            layout: ctx.layout.clone(),
            tensors: ctx.tensors.clone(),
            rng: StepRng::new(ctx.seed, ctx.rank),
            residual: Vec::new(),
            sample: Vec::new(),
            cand: Vec::new(),
            scratch: Vec::new(),
            cols: Vec::new(),
            sel: SparseGrad::default(),
        }
    }

    /// Bytes of one column record on the wire.
    fn record_len(&self) -> usize {
        if self.cfg.ternary {
            20
        } else {
            16
        }
    }

    /// What was not sent yet.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// The column ranges of a gradient of `n` elements.
    pub fn columns(&self, n: usize) -> Vec<Range<usize>> {
        self.cfg.column.ranges(&self.tensors, &self.layout, n)
    }

    /// Quantizes `grad + residual`: fills `self.cols`, and `out` with the sent (index, +-mu).
    fn select(&mut self, grad: &[f32], out: &mut SparseGrad) {
        let n = grad.len();
        assert!(
            n <= u32::MAX as usize,
            "adaptive selection uses u32 indices: {n} elements is too many"
        );
        out.clear();
        self.cols.clear();
        fit(&mut self.residual, n);
        for (x, &y) in self.residual.iter_mut().zip(grad) {
            *x += y;
        }
        let cols = self.columns(n);
        let mut stream = self.rng.next_stream();
        let pi = self.cfg.pi;
        for col in cols {
            let x = &mut self.residual[col.clone()];
            let len = x.len();
            let want = ((64.0 / pi).ceil() as usize).max(128);
            self.sample.clear();
            if len <= want {
                self.sample.extend_from_slice(x);
            } else {
                self.sample
                    .extend((0..want).map(|_| x[stream.gen_range(0..len)]));
            }
            let (mut pos, mut neg): (Vec<f32>, Vec<f32>) = self
                .sample
                .iter()
                .filter(|v| **v != 0.0 && !v.is_nan())
                .partition(|v| **v > 0.0);
            for v in &mut neg {
                *v = -*v;
            }
            let tp = quantile_desc(&mut pos, pi);
            let tn = quantile_desc(&mut neg, pi);
            self.cand.clear();
            for (i, &v) in x.iter().enumerate() {
                if (v > 0.0 && v >= tp) || (v < 0.0 && -v >= tn) {
                    self.cand.push(i as u32);
                }
            }
            // The quantiles send at least one entry of each sign: the cap never cuts below 2.
            let cap = k_for(self.cfg.max_excess * pi, len).max(2).min(len);
            cut_to_k(x, cap, &mut self.cand, &mut self.scratch);
            let (mut sp, mut np, mut sn, mut nn) = (0f64, 0u64, 0f64, 0u64);
            for &i in &self.cand {
                let v = x[i as usize];
                if v > 0.0 {
                    sp += v as f64;
                    np += 1;
                } else {
                    sn -= v as f64;
                    nn += 1;
                }
            }
            let mu_p = if np > 0 { (sp / np as f64) as f32 } else { 0.0 };
            let mu_n = if nn > 0 { (sn / nn as f64) as f32 } else { 0.0 };
            let unsent = len - self.cand.len();
            let mu_0 = if self.cfg.ternary && unsent > 0 {
                let all: f64 = x.iter().map(|&v| f64::from(v)).sum();
                let mean = ((all - (sp - sn)) / unsent as f64) as f32;
                // Every unsent entry keeps x - mu0 (the candidates are sorted).
                let mut next = self.cand.iter().peekable();
                for (i, r) in x.iter_mut().enumerate() {
                    if next.peek().is_some_and(|&&c| c as usize == i) {
                        next.next();
                    } else {
                        *r -= mean;
                    }
                }
                mean
            } else {
                0.0
            };
            for &i in &self.cand {
                let r = &mut x[i as usize];
                let s = if *r > 0.0 { mu_p } else { -mu_n };
                *r -= s;
                out.indices.push(col.start as u32 + i);
                out.values.push(s);
            }
            self.cols.push((self.cand.len() as u64, mu_p, mu_n, mu_0));
        }
    }
}

impl Codec for Adaptive {
    fn id(&self) -> CodecId {
        CodecId::Adaptive
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let mut sel = std::mem::take(&mut self.sel);
        self.select(grad, &mut sel);
        let n = grad.len();
        Header::write(out, CodecId::Adaptive, n);
        let rec = self.record_len();
        out.reserve(4 + rec * self.cols.len() + word_bytes(n) * sel.indices.len());
        out.extend_from_slice(&(self.cols.len() as u32).to_le_bytes());
        for &(count, mp, mn, m0) in &self.cols {
            out.extend_from_slice(&count.to_le_bytes());
            out.extend_from_slice(&mp.to_le_bytes());
            out.extend_from_slice(&mn.to_le_bytes());
            if self.cfg.ternary {
                out.extend_from_slice(&m0.to_le_bytes());
            }
        }
        if self.cfg.golomb {
            let mut bits = BitWriter::new(out);
            let mut next = 0u32;
            for (&i, &v) in sel.indices.iter().zip(&sel.values) {
                let gap = i - next;
                let mut q = gap >> 4;
                while q >= 32 {
                    bits.put(u32::MAX, 32);
                    q -= 32;
                }
                if q > 0 {
                    bits.put((1u32 << q) - 1, q);
                }
                bits.put(0, 1);
                bits.put(gap & 15, 4);
                bits.put(u32::from(v < 0.0), 1);
                next = i + 1;
            }
            bits.finish();
            self.sel = sel;
            return;
        }
        let signs = sel.values.iter().map(|&v| v < 0.0);
        put_words(out, n, sel.indices.iter().copied().zip(signs));
        self.sel = sel;
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let n = acc.len();
        Header::check(payload, CodecId::Adaptive, n)?;
        let ncols = read_u32(payload, HEADER_LEN)? as usize;
        let w = word_bytes(n);
        let rec = self.record_len();
        let body = HEADER_LEN + 4;
        if (payload.len() - body) / rec < ncols {
            return Err(DecodeError::Truncated {
                need: body.saturating_add(ncols.saturating_mul(rec)),
                have: payload.len(),
            });
        }
        // Ternary: the columns must be the decoder's (unsent entries decode to mu0).
        let ranges = if self.cfg.ternary {
            let r = self.columns(n);
            if r.len() != ncols {
                return Err(DecodeError::InvalidField {
                    field: "ncols",
                    reason: "column count differs from the decoder's columns",
                });
            }
            r
        } else {
            Vec::new()
        };
        let words_at = body + rec * ncols;
        let mut total = 0u64;
        for c in 0..ncols {
            let at = body + rec * c;
            total = total.saturating_add(read_u64(payload, at)?);
            for mu in [read_f32(payload, at + 8)?, read_f32(payload, at + 12)?] {
                if !(mu.is_finite() && mu >= 0.0) {
                    return Err(DecodeError::InvalidField {
                        field: "mu",
                        reason: "reconstruction value not finite and non-negative",
                    });
                }
            }
            if self.cfg.ternary && !read_f32(payload, at + 16)?.is_finite() {
                return Err(DecodeError::InvalidField {
                    field: "mu0",
                    reason: "unsent reconstruction value not finite",
                });
            }
        }
        if total > n as u64 {
            return Err(DecodeError::InvalidField {
                field: "count",
                reason: "more words than elements",
            });
        }
        let golomb = if self.cfg.golomb {
            golomb_words(&payload[words_at..], total as usize, n)?
        } else {
            check_len(words_at + w * total as usize, payload.len())?;
            Vec::new()
        };
        let words = &payload[words_at..];
        let word = |j: usize| -> u64 {
            if self.cfg.golomb {
                golomb[j]
            } else {
                word_at(words, w, j)
            }
        };
        let mut next = 0u64;
        let mut j = 0usize;
        for c in 0..ncols {
            let count = read_u64(payload, body + rec * c)? as usize;
            for _ in 0..count {
                let i = index_of(word(j));
                next = check_next(i, next, n)?;
                if let Some(r) = ranges.get(c) {
                    if !r.contains(&(i as usize)) {
                        return Err(DecodeError::InvalidField {
                            field: "index",
                            reason: "word outside its column",
                        });
                    }
                }
                j += 1;
            }
        }
        let mut j = 0usize;
        for c in 0..ncols {
            let at = body + rec * c;
            let count = read_u64(payload, at)? as usize;
            let mp = read_f32(payload, at + 8)?;
            let mn = read_f32(payload, at + 12)?;
            let value = |x: u64| if is_negative(x) { -mn } else { mp };
            match ranges.get(c) {
                Some(r) => {
                    let m0 = read_f32(payload, at + 16)?;
                    let end = j + count;
                    for i in r.clone() {
                        if j < end && index_of(word(j)) as usize == i {
                            acc[i] += value(word(j));
                            j += 1;
                        } else {
                            acc[i] += m0;
                        }
                    }
                }
                None => {
                    for _ in 0..count {
                        let x = word(j);
                        acc[index_of(x) as usize] += value(x);
                        j += 1;
                    }
                }
            }
        }
        Ok(())
    }

    fn caps(&self) -> Caps {
        Caps {
            feedback: Feedback::Owned,
            ..Caps::default()
        }
    }

    fn set_progress(&mut self, progress: Progress) {
        self.rng.set_step(progress.step);
    }

    fn save_state(&self) -> Vec<u8> {
        save_rng_residual(CodecId::Adaptive, &self.rng, &self.residual)
    }

    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        load_rng_residual(state, CodecId::Adaptive, &mut self.rng, &mut self.residual)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codec(spec: &str, layout: Vec<usize>) -> Adaptive {
        let mut p = Params::parse(spec).unwrap();
        let cfg = AdaptiveConfig::parse(&mut p).unwrap();
        p.finish().unwrap();
        let ctx = BuildContext {
            seed: 5,
            rank: 1,
            world_size: 2,
            layout,
            ..Default::default()
        };
        Adaptive::new(cfg, &ctx)
    }

    fn grad(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let h = (i ^ seed.wrapping_mul(0x9e37_79b9)).wrapping_mul(2654435761);
                let u = ((h >> 8) % 20001) as f32 / 10000.0 - 1.0;
                u * u * u + 0.1 * u
            })
            .collect()
    }

    #[test]
    fn quantizes_to_column_means_and_conserves_the_signal() {
        let layout = vec![3000, 50_000, 1000];
        let n: usize = layout.iter().sum();
        let mut c = codec("adaptive:pi=0.01,column=tensor", layout.clone());
        let mut before = vec![0.0f32; n];
        let mut out = Vec::new();
        for s in 0..3 {
            let g = grad(n, s);
            let x: Vec<f32> = g.iter().zip(&before).map(|(a, b)| a + b).collect();
            c.encode(&g, &mut out);
            let mut sent = vec![0.0; n];
            c.decode_add(&out, &mut sent).unwrap();
            let mut start = 0;
            let mut words = 0;
            for &len in &layout {
                let col = start..start + len;
                let pos: Vec<usize> = col.clone().filter(|&i| sent[i] > 0.0).collect();
                let neg: Vec<usize> = col.clone().filter(|&i| sent[i] < 0.0).collect();
                // Roughly pi of each sign, never more than the cap.
                let npos = col.clone().filter(|&i| x[i] > 0.0).count();
                assert!(pos.len() + neg.len() <= k_for(0.02, len));
                assert!(pos.len() >= npos / 400, "{} of {npos}", pos.len());
                // Reconstruction values are the means of what they replace.
                let mean =
                    |ix: &[usize]| ix.iter().map(|&i| x[i] as f64).sum::<f64>() / ix.len() as f64;
                if !pos.is_empty() {
                    assert!((sent[pos[0]] as f64 - mean(&pos)).abs() < 1e-5);
                    assert!(pos.iter().all(|&i| sent[i] == sent[pos[0]]));
                }
                if !neg.is_empty() {
                    assert!((sent[neg[0]] as f64 - mean(&neg)).abs() < 1e-5);
                }
                words += pos.len() + neg.len();
                start += len;
            }
            assert_eq!(out.len(), 16 + 16 * 3 + 4 * words, "size formula");
            for i in 0..n {
                assert!((sent[i] + c.residual()[i] - x[i]).abs() < 1e-5);
            }
            before = c.residual().to_vec();
        }
        let st = c.save_state();
        let mut d = codec("adaptive:pi=0.01,column=tensor", layout);
        d.load_state(&st).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        c.encode(&grad(n, 9), &mut a);
        d.encode(&grad(n, 9), &mut b);
        assert_eq!(a, b);
    }

    /// `ternary=true` against a naive reference: the same selection as without it (same
    /// sample stream), the sent entries decode to the same `+-mu`, every unsent entry to the
    /// mean of its column's unsent inputs, the residual holds the rest exactly, and the
    /// message grows by 4 bytes per column.
    #[test]
    fn ternary_sends_the_unsent_mean_as_a_third_value() {
        let n = 1000;
        let g = grad(n, 3);
        let mut plain = codec("adaptive:pi=0.05,column=100", vec![300, 700]);
        let mut tern = codec("adaptive:pi=0.05,column=100,ternary=true", vec![300, 700]);
        let (mut pb, mut tb) = (Vec::new(), Vec::new());
        plain.encode(&g, &mut pb);
        tern.encode(&g, &mut tb);
        assert_eq!(tb.len(), pb.len() + 4 * 10);
        let (mut pd, mut td) = (vec![0f32; n], vec![0f32; n]);
        plain.decode_add(&pb, &mut pd).unwrap();
        tern.decode_add(&tb, &mut td).unwrap();
        let mut unsent_total = 0;
        for c in 0..10 {
            let col = c * 100..(c + 1) * 100;
            let unsent: Vec<usize> = col.clone().filter(|&i| pd[i] == 0.0).collect();
            assert!(!unsent.is_empty() && unsent.len() < 100);
            unsent_total += unsent.len();
            let mean = unsent.iter().map(|&i| f64::from(g[i])).sum::<f64>() / unsent.len() as f64;
            for i in col {
                if pd[i] != 0.0 {
                    assert_eq!(td[i], pd[i], "sent entry {i}");
                } else {
                    assert!(
                        (f64::from(td[i]) - mean).abs() < 1e-6,
                        "{i}: {} vs {mean}",
                        td[i]
                    );
                }
            }
        }
        assert!(unsent_total > 500);
        for i in 0..n {
            assert!(
                (g[i] - (td[i] + tern.residual()[i])).abs() < 1e-6,
                "error feedback loses signal at {i}"
            );
        }
        // A column count other than the decoder's, or a non-finite mu0: refused.
        let mut bad = tb.clone();
        bad[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&9u32.to_le_bytes());
        assert!(tern.decode_add(&bad, &mut td).is_err());
        let mut bad = tb.clone();
        let at = HEADER_LEN + 4 + 16;
        bad[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(tern.decode_add(&bad, &mut td).is_err());
        // A plain payload is not a ternary one.
        assert!(tern.decode_add(&pb, &mut td).is_err());
    }

    /// `index=golomb` against a hand-coded stream (M = 16: gap 3 = `0 0011`, sign 0; gap 21 =
    /// `10 0101`, sign 1; zero padding) and against the word coding: same decode, fewer
    /// bytes; every truncation refused.
    #[test]
    fn golomb_rice_gaps_match_a_hand_coded_stream_and_the_words() {
        assert_eq!(
            golomb_words(&[0x1A, 0x58], 2, 40).unwrap(),
            vec![3 << 1, (25 << 1) | 1]
        );
        assert!(
            golomb_words(&[0x1A, 0x58, 0], 2, 40).is_err(),
            "trailing byte"
        );
        assert!(golomb_words(&[0x1A], 2, 40).is_err(), "truncated");
        assert!(
            golomb_words(&[0x1A, 0x58], 2, 25).is_err(),
            "index beyond n"
        );
        assert!(golomb_words(&[0xff; 8], 1, 40).is_err(), "gap beyond n");
        for spec in [
            "adaptive:pi=0.05,column=100",
            "adaptive:pi=0.05,column=100,ternary=true",
        ] {
            let g = grad(1000, 5);
            let mut words = codec(spec, vec![300, 700]);
            let mut rice = codec(&format!("{spec},index=golomb"), vec![300, 700]);
            let (mut wb, mut rb) = (Vec::new(), Vec::new());
            words.encode(&g, &mut wb);
            rice.encode(&g, &mut rb);
            assert!(rb.len() < wb.len(), "{spec}: {} vs {}", rb.len(), wb.len());
            let (mut wd, mut rd) = (vec![0f32; 1000], vec![0f32; 1000]);
            words.decode_add(&wb, &mut wd).unwrap();
            rice.decode_add(&rb, &mut rd).unwrap();
            assert_eq!(wd, rd, "{spec}");
            assert_eq!(words.residual(), rice.residual());
            for cut in 0..rb.len() {
                assert!(
                    rice.decode_add(&rb[..cut], &mut rd).is_err(),
                    "{spec} cut {cut}"
                );
            }
        }
    }

    #[test]
    fn column_param_and_cap() {
        let n = 10_000;
        // A skewed gradient: sampling at pi=0.05 would pick far more than the cap in a column
        // full of equal values; the cap holds.
        let g = vec![1.0f32; n];
        let mut c = codec("adaptive:pi=0.05,column=1000,max_excess=1", vec![]);
        let mut s = SparseGrad::default();
        c.select(&g, &mut s);
        assert_eq!(c.cols.len(), 10);
        assert_eq!(s.indices.len(), 10 * 50);
        assert!(s.values.iter().all(|&v| v == 1.0));
    }

    /// A column shorter than `1 / (max_excess * pi)` (LeNet's output rows of 10, conv1's
    /// filters of 25, its biases): the quantile sends the largest entry of each sign, and the
    /// cap must not cut that to one entry (it used to: `ceil(2 * 10 / 64) = 1`, so such a
    /// column sent only its largest `|x|`, one sign, per step).
    #[test]
    fn short_columns_send_one_entry_of_each_sign() {
        let g = [0.1f32, -0.4, 0.3, 0.05, -0.2, 0.0, 0.25, -0.1, 0.2, -0.05];
        let mut c = codec("adaptive", vec![10]);
        let mut s = SparseGrad::default();
        c.select(&g, &mut s);
        assert_eq!(s.indices, vec![1, 2]);
        assert_eq!(s.values, vec![-0.4, 0.3]);
        let mut want = g.to_vec();
        want[1] = 0.0;
        want[2] = 0.0;
        assert_eq!(c.residual(), &want[..]);
        // One sign only: one entry.
        let mut c = codec("adaptive", vec![4]);
        c.select(&[0.5, 0.25, 0.0, 1.0], &mut s);
        assert_eq!((s.indices.clone(), s.values.clone()), (vec![3], vec![1.0]));
    }

    #[test]
    fn decoder_rejects_malformed() {
        let n = 2000;
        let mut c = codec("adaptive:pi=0.02", vec![1000, 1000]);
        let mut out = Vec::new();
        c.encode(&grad(n, 1), &mut out);
        let mut acc = vec![0.0; n];
        for cut in 0..out.len() {
            assert!(c.decode_add(&out[..cut], &mut acc).is_err());
        }
        let mut bad = out.clone();
        bad[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(c.decode_add(&bad, &mut acc).is_err());
        let mut bad = out.clone();
        bad[HEADER_LEN + 12..HEADER_LEN + 16].copy_from_slice(&f32::NAN.to_le_bytes());
        assert!(matches!(
            c.decode_add(&bad, &mut acc),
            Err(DecodeError::InvalidField { field: "mu", .. })
        ));
        let mut bad = out.clone();
        bad[HEADER_LEN + 4..HEADER_LEN + 12].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(c.decode_add(&bad, &mut acc).is_err());
        let mut bad = out.clone();
        let at = bad.len() - 4;
        bad[at..].copy_from_slice(&(5000u32 << 1).to_le_bytes());
        assert!(matches!(
            c.decode_add(&bad, &mut acc),
            Err(DecodeError::IndexOutOfRange { .. })
        ));
        bad[at..].copy_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            c.decode_add(&bad, &mut acc),
            Err(DecodeError::InvalidField { field: "index", .. })
        ));
        assert!(acc.iter().all(|&v| v == 0.0));
        let mut p = Params::parse(&format!("adaptive:{}", c.cfg.spec_params())).unwrap();
        assert_eq!(AdaptiveConfig::parse(&mut p).unwrap(), c.cfg);
    }
}
