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
//!
//! Files: `config.rs` (the spec's parameters), `select.rs` (the per-column quantization with
//! its residual), `wire.rs` (the encoder and decoder of the layout above, Golomb-Rice gaps
//! included), `tests.rs`.

use std::ops::Range;

use crate::{BuildContext, SparseGrad, StepRng, TensorInfo};

mod config;
mod select;
mod wire;

#[cfg(test)]
mod tests;

pub use config::AdaptiveConfig;

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
}
