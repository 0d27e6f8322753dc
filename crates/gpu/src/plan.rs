//! Launch plans: the tables the device kernels read, built on the host from a codec's layout,
//! and the word-to-element map of the lane-packed codes, shared by the plans and the tests.
//!
//! The CPU codecs pack fixed-width codes in lane-parallel words (`gradwire-codec`'s
//! `pack.rs`): with `K = 32 / W` codes of `W` bits per word, a full block of `16 K` elements
//! fills 16 words, element `16 j + l` of the block in word `l` at bit `j W`; a final partial
//! block of `r` elements has `lanes = ceil(r / K)` words, element `j lanes + l` in word `l`.
//! [`word_elems`] is that map read backwards (one word, its elements), which is what a GPU
//! thread that writes one word needs; the kernels in [`crate::kernels`] carry the same
//! function in CUDA C (`gw_word`), and the tests here rebuild the CPU codecs' bytes from it.
//!
//! A *run* is one stretch of codes with its own scale: a 1-bit SGD column, a QSGD bucket, a
//! TernGrad tensor. A [`Piece`] is the part of a run one thread block packs: whole 16-word
//! blocks of it (the partial block, if any, last), at most [`PIECE_WORDS`] words, so a
//! 100M-element tensor spreads over the whole GPU rather than one block.

use std::ops::Range;

/// Words of a full lane-packed block.
pub const LANES: u32 = 16;
/// Most words one thread block packs.
pub const PIECE_WORDS: u32 = 1024;

/// Words that `len` codes of `width` bits take.
pub fn words(len: usize, width: u32) -> usize {
    len.div_ceil((32 / width) as usize)
}

/// The elements of word `w` of a run of `len` codes of `width` bits: `(first, stride,
/// count)`, the elements being `first + j * stride` for `j < count`, code `j` at bit
/// `j * width`.
pub fn word_elems(len: u32, width: u32, w: u32) -> (u32, u32, u32) {
    let k = 32 / width;
    let block = LANES * k;
    let full = len / block;
    if w < full * LANES {
        ((w / LANES) * block + w % LANES, LANES, k)
    } else {
        let r = len - full * block;
        let lanes = r.div_ceil(k);
        let l = w - full * LANES;
        let count = if l < r {
            (r - l).div_ceil(lanes).min(k)
        } else {
            0
        };
        (full * block + l, lanes, count)
    }
}

/// One run of codes: elements `start..start + len` of the gradient, its codes at word
/// `code_word` of the payload body, its scale(s) at word `scale_word`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Run {
    /// First element (index into the flat gradient).
    pub start: u32,
    /// Number of elements.
    pub len: u32,
    /// Body word of the run's first scale.
    pub scale_word: u32,
    /// Body word of the run's first code word.
    pub code_word: u32,
}

/// Part of a run packed by one thread block: words `word_begin..word_end` of run `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Piece {
    /// The run's first element.
    pub start: u32,
    /// The run's length.
    pub len: u32,
    /// First word of the run this piece packs.
    pub word_begin: u32,
    /// One past the last word.
    pub word_end: u32,
    /// Body word of the run's first code word.
    pub code_word: u32,
    /// Index of the run (its scales).
    pub run: u32,
}

/// A plan's tables, flattened to the `u32`s the kernels read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The runs in body order.
    pub runs: Vec<Run>,
    /// The pieces, every run's words covered once.
    pub pieces: Vec<Piece>,
    /// Length of the payload body (after the 12-byte header) in 32-bit words.
    pub body_words: usize,
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The device kernels index elements and words with `u32`.
    #[error("{what} of {value} does not fit the device kernels' 32-bit indices")]
    TooLarge {
        /// What overflowed.
        what: &'static str,
        /// Its value.
        value: usize,
    },
}

fn u32_of(what: &'static str, value: usize) -> Result<u32, PlanError> {
    u32::try_from(value).map_err(|_| PlanError::TooLarge { what, value })
}

impl Plan {
    /// Runs of `width`-bit codes over `ranges`, each preceded in the body by `scales` words,
    /// with `float` ranges written as raw f32 words instead (no scale, no codes).
    pub fn new(
        ranges: &[(Range<usize>, bool)],
        width: u32,
        scales: u32,
    ) -> Result<Plan, PlanError> {
        let mut plan = Plan::default();
        let mut at = 0usize;
        for (r, float) in ranges {
            let start = u32_of("element index", r.start)?;
            let len = u32_of("run length", r.len())?;
            u32_of("element index", r.end)?;
            if *float {
                plan.runs.push(Run {
                    start,
                    len,
                    scale_word: u32_of("payload length", at)?,
                    code_word: u32_of("payload length", at)?,
                });
                at += r.len();
                continue;
            }
            let nw = words(r.len(), width);
            let run = Run {
                start,
                len,
                scale_word: u32_of("payload length", at)?,
                code_word: u32_of("payload length", at + scales as usize)?,
            };
            let idx = u32_of("run count", plan.runs.len())?;
            let mut w = 0u32;
            let nw32 = u32_of("words", nw)?;
            while w < nw32 {
                let end = (w + PIECE_WORDS).min(nw32);
                plan.pieces.push(Piece {
                    start,
                    len,
                    word_begin: w,
                    word_end: end,
                    code_word: run.code_word,
                    run: idx,
                });
                w = end;
            }
            plan.runs.push(run);
            at += scales as usize + nw;
        }
        u32_of("payload length", at)?;
        plan.body_words = at;
        Ok(plan)
    }

    /// The pieces as 6 `u32` each: start, len, word_begin, word_end, code_word, run.
    pub fn piece_table(&self) -> Vec<u32> {
        self.pieces
            .iter()
            .flat_map(|p| [p.start, p.len, p.word_begin, p.word_end, p.code_word, p.run])
            .collect()
    }

    /// The runs as 4 `u32` each: start, len, scale_word, code_word.
    pub fn run_table(&self) -> Vec<u32> {
        self.runs
            .iter()
            .flat_map(|r| [r.start, r.len, r.scale_word, r.code_word])
            .collect()
    }
}

/// TernGrad's statistics blocks: runs of at most 4096 elements inside each ternary tensor
/// (the CPU codec's f64 accumulation step), as `(start, len)`, and per tensor the range of
/// its blocks.
pub fn stat_blocks(tensors: &[Range<usize>]) -> (Vec<u32>, Vec<Range<usize>>) {
    const BLOCK: usize = 4096;
    let mut blocks = Vec::new();
    let mut per = Vec::new();
    for t in tensors {
        let first = blocks.len() / 2;
        let mut a = t.start;
        while a < t.end {
            let e = (a + BLOCK).min(t.end);
            blocks.push(a as u32);
            blocks.push((e - a) as u32);
            a = e;
        }
        per.push(first..blocks.len() / 2);
    }
    (blocks, per)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_codec::{BuildContext, Codec, CodecConfig, OneBit, HEADER_LEN};

    /// The CPU packer's map, forwards: element `e` of a run of `len` → (word, bit slot).
    fn forward(len: u32, width: u32, e: u32) -> (u32, u32) {
        let k = 32 / width;
        let block = LANES * k;
        let full = len / block;
        if e < full * block {
            let (b, o) = (e / block, e % block);
            (b * LANES + o % LANES, o / LANES)
        } else {
            let r = len - full * block;
            let lanes = r.div_ceil(k);
            let o = e - full * block;
            (full * LANES + o % lanes, o / lanes)
        }
    }

    #[test]
    fn word_elems_inverts_the_cpu_packing_for_every_width_and_tail() {
        for width in [1u32, 2, 3, 4, 5, 8, 11, 16] {
            for len in [
                0u32, 1, 5, 31, 32, 33, 255, 256, 257, 511, 512, 513, 1000, 2048, 2049,
            ] {
                let nw = words(len as usize, width) as u32;
                let mut seen = vec![false; len as usize];
                for w in 0..nw {
                    let (first, stride, count) = word_elems(len, width, w);
                    assert!(count <= 32 / width);
                    for j in 0..count {
                        let e = first + j * stride;
                        assert!(e < len, "w{width} len{len} word{w} j{j}");
                        assert_eq!(forward(len, width, e), (w, j), "w{width} len{len}");
                        assert!(!seen[e as usize]);
                        seen[e as usize] = true;
                    }
                }
                assert!(
                    seen.iter().all(|&s| s),
                    "every element packed: w{width} len{len}"
                );
            }
        }
    }

    #[test]
    fn pieces_cover_every_word_once_in_whole_blocks() {
        let ranges = vec![
            (0..100_000, false),
            (100_000..100_010, true),
            (100_010..100_513, false),
        ];
        let plan = Plan::new(&ranges, 4, 1).unwrap();
        assert_eq!(plan.runs.len(), 3);
        let mut covered = 0usize;
        for p in &plan.pieces {
            assert_eq!(p.word_begin % LANES, 0);
            assert!(p.word_end - p.word_begin <= PIECE_WORDS);
            covered += (p.word_end - p.word_begin) as usize;
        }
        assert_eq!(covered, words(100_000, 4) + words(503, 4));
        assert_eq!(
            plan.body_words,
            1 + words(100_000, 4) + 10 + 1 + words(503, 4)
        );
        assert_eq!(plan.runs[1].scale_word as usize, 1 + words(100_000, 4));
        assert_eq!(plan.runs[2].code_word, plan.runs[1].scale_word + 10 + 1);
    }

    #[test]
    fn a_plan_refuses_what_u32_indices_cannot_hold() {
        let r = vec![(0..(u32::MAX as usize + 2), false)];
        assert!(matches!(
            Plan::new(&r, 1, 2),
            Err(PlanError::TooLarge { .. })
        ));
    }

    fn grad(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) >> 8) as f32 / 16_777_216.0 - 0.5) * 3.0)
            .collect()
    }

    /// Packs every piece of `plan` as the device kernels do (one word at a time from
    /// `word_elems`), with `code(run, element)` giving each code.
    fn emulate(plan: &Plan, width: u32, body: &mut [u32], code: impl Fn(usize, u32) -> u32) {
        for p in &plan.pieces {
            for w in p.word_begin..p.word_end {
                let (first, stride, count) = word_elems(p.len, width, w);
                let mut word = 0u32;
                for j in 0..count {
                    let i = p.start + first + j * stride;
                    word |= code(p.run as usize, i) << (j * width);
                }
                body[(p.code_word + w) as usize] = word;
            }
        }
    }

    fn body_words(payload: &[u8]) -> Vec<u32> {
        payload[HEADER_LEN..]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// The plan's runs and the word map rebuild 1-bit SGD's payload bit for bit (scales from
    /// the CPU payload; the bits from the kernel's rule).
    #[test]
    fn the_plan_rebuilds_one_bit_sgd_payloads() {
        for (n, layout) in [(5000usize, vec![]), (7000, vec![3000, 10, 3990])] {
            let g = grad(n);
            let ctx = BuildContext::new(0, 0, 1, layout.clone());
            let c = OneBit::with_columns(gradwire_codec::Columns::Shape(2048), &ctx);
            let cols = c.columns(n);
            let mut cpu = c.clone();
            let mut want = Vec::new();
            cpu.encode(&g, &mut want);
            let plan = Plan::new(
                &cols.iter().map(|r| (r.clone(), false)).collect::<Vec<_>>(),
                1,
                2,
            )
            .unwrap();
            let want_words = body_words(&want);
            assert_eq!(plan.body_words, want_words.len());
            let mut body = vec![0u32; plan.body_words];
            for r in &plan.runs {
                body[r.scale_word as usize] = want_words[r.scale_word as usize];
                body[r.scale_word as usize + 1] = want_words[r.scale_word as usize + 1];
            }
            emulate(&plan, 1, &mut body, |_, i| (g[i as usize] >= 0.0) as u32);
            assert_eq!(body, want_words, "n={n} layout={layout:?}");
        }
    }

    /// Same for QSGD 4-bit: the level rule with the codec's uniform stream, keyed as the
    /// device kernel keys it (the global element index), gives the CPU payload exactly.
    #[test]
    fn the_plan_rebuilds_qsgd_payloads() {
        let n = 10_000;
        let layout = vec![6000, 4000];
        let g = grad(n);
        let cfg: CodecConfig = "qsgd:bits=4".parse().unwrap();
        let mut cpu = cfg.build(&BuildContext::new(7, 1, 2, layout.clone()));
        let mut want = Vec::new();
        cpu.encode(&g, &mut want);
        // The key the CPU codec drew for that encode: the same StepRng, first call.
        let key = gradwire_codec::StepRng::new(7, 1).next_key();
        let bks = gradwire_codec::external::qsgd_buckets(&layout, n, 512);
        let plan = Plan::new(
            &bks.iter().map(|r| (r.clone(), false)).collect::<Vec<_>>(),
            4,
            1,
        )
        .unwrap();
        let want_words = body_words(&want);
        assert_eq!(plan.body_words, want_words.len());
        let mut body = vec![0u32; plan.body_words];
        let (s, sf) = (7i32, 7f32);
        let mut inv = Vec::new();
        for r in &plan.runs {
            let x = &g[r.start as usize..(r.start + r.len) as usize];
            let m = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            body[r.scale_word as usize] = m.to_bits();
            inv.push(if m > 0.0 { sf / m } else { 0.0 });
        }
        emulate(&plan, 4, &mut body, |run, i| {
            let v = g[i as usize];
            let r = (v.abs() * inv[run]).min(sf);
            let fl = r.floor();
            let lv =
                (fl as i32 + (gradwire_codec::external::uniform(key, i) < r - fl) as i32).min(s);
            (if v < 0.0 { s - lv } else { s + lv }) as u32
        });
        assert_eq!(body, want_words);
    }

    #[test]
    fn stat_blocks_cut_tensors_at_4096() {
        let (b, per) = stat_blocks(&[0..5000, 5000..5001]);
        assert_eq!(b, vec![0, 4096, 4096, 904, 5000, 1]);
        assert_eq!(per, vec![0..2, 2..3]);
    }
}
