//! gradwire-codec: gradient compression, f32 <-> bytes. Pure: no I/O, no threads, no globals.
//!
//! This layer owns the codecs of the seed papers (1-bit SGD, Strom's threshold quantization,
//! Dryden's adaptive quantization, top-k gradient dropping, QSGD, TernGrad, DGC, and a few
//! later ones), their wire formats, error feedback, and the spec strings that name them
//! (`topk:ratio=0.01`, `qsgd:bits=4,bucket=512`). It must never know about ranks' sockets,
//! collectives or models: a codec sees a flat `&[f32]` gradient and produces bytes.
//!
//! Every payload starts with a [`Header`] (magic, version, codec id, element count), so a
//! decoder refuses what is not its own; every decoder is total: malformed input gives a
//! [`DecodeError`], never a panic, and never allocates more than the accumulator.
//!
//! # Capabilities
//! Beyond `encode`/`decode_add`, a codec declares what else it does by type, not by flags:
//! each capability is a trait of its own, and [`Codec`] has one accessor per capability that
//! returns `Option<&mut dyn Trait>`, `None` by default (as `Transport::split_step` does).
//! A codec with the capability implements the trait and overrides the accessor to return
//! `Some(self)`:
//! - [`SparseEncode`] ([`Codec::sparse_encode`]): (index, value) pairs for the sparse
//!   all-reduce (top-k, threshold, random-k, DGC);
//! - [`SharedScalars`] ([`Codec::shared_scalars`]): scalars the ranks agree on before every
//!   encode (TernGrad's shared max);
//! - [`FeedbackEncode`] ([`Codec::feedback_encode`]): a fused error-feedback kernel (fp32,
//!   1-bit SGD, signSGD).
//!
//! Callers choose their path with `if let Some(s) = codec.sparse_encode()`; there is no
//! method that a codec without the capability would have to answer with a panic or a
//! sentinel. [`Codec::caps`] keeps only the two value properties: whether the codec is
//! unbiased and who keeps its residual ([`Caps`]).
//!
//! # Error feedback: who owns the residual
//! One rule. A codec **owns** its residual ([`Feedback::Owned`]) exactly when the residual
//! decides what is selected: the sparsifiers and selectors of the seed papers (top-k,
//! threshold, random-k with `ef`, adaptive quantization, and DGC, whose accumulated velocity
//! plays that part). Their selection reads `g + r` and writes back what stays in the same
//! pass, [`SparseEncode::encode_sparse`] advances it exactly as `encode` does, and their `ef=`
//! switches their own residual; they are never wrapped. Every other codec keeps no residual:
//! with `ef=true` the one generic [`ErrorFeedback`] wrapper keeps it ([`Feedback::Generic`]),
//! running the codec's fused kernel when it has one ([`Codec::feedback_encode`]) and three generic
//! passes otherwise. Without `ef` nobody keeps one ([`Feedback::None`]): the default of the
//! unbiased codecs (QSGD, TernGrad, scaled random-k) and the plain casts (`none`, `fp16`,
//! `bf16`), a named option (`ef=false`) for the others. A codec that reports
//! [`Caps::unbiased`] keeps no residual.
#![deny(missing_docs)]

pub mod bench;
mod bf16;
mod config;
mod elias;
mod feedback;
mod fp16;
mod fp32;
mod header;
mod layout;
mod onebit;
mod pack;
mod params;
mod powersgd;
mod qsgd;
mod rng;
mod signsgd;
#[doc(hidden)]
pub mod simd;
mod state;
mod terngrad;
#[cfg(test)]
mod testing;
// Sparse codecs (threshold, adaptive, topk, randomk, dgc): their `mod` lines go here.
mod adaptive;
mod dgc;
mod randomk;
mod sparse;
mod threshold;
mod topk;

pub use adaptive::{Adaptive, AdaptiveConfig};
pub use bf16::Bf16;
pub use config::{CastConfig, CodecConfig, KNOWN};
pub use dgc::{Dgc, DgcConfig};
pub use feedback::ErrorFeedback;
pub use fp16::Fp16;
pub use fp32::Fp32;
pub use header::{CodecId, Header, HEADER_LEN, MAGIC, VERSION};
pub use layout::{segments, tensor_ranges, tensors_for, Columns, TensorInfo, TensorRole};
pub use onebit::{OneBit, OneBitConfig};
pub use params::{ConfigError, Params};
pub use powersgd::{PowerSgd, PowerSgdConfig};
pub use qsgd::{Qsgd, QsgdCoding, QsgdConfig, QsgdNorm};
pub use randomk::{RandomK, RandomKConfig};
pub use rng::StepRng;
pub use signsgd::{SignSgd, SignSgdConfig};
/// Fuzzing entry: reads its input as a payload of one of the sparse codecs and checks their
/// [`SparseEncode::decode_pairs`] against their own `decode_add` (never a panic).
#[cfg(fuzzing)]
#[doc(hidden)]
pub use sparse::fuzz_decode_pairs;
pub use sparse::ValueFormat;
pub use state::{StateReader, StateWriter};
pub use terngrad::{TernGrad, TernGradConfig};
pub use threshold::{Threshold, ThresholdConfig};
pub use topk::{TopK, TopKConfig, TopKScope, TopKSelect};

/// What an encoder that runs elsewhere (the GPU codecs of `gradwire-gpu`) needs to write
/// byte-identical payloads: the sparse payload writer, the per-tensor `k`, the sampled
/// threshold and the exact cut of the sparsifiers, QSGD's buckets and the uniform stream of
/// the stochastic quantizers. Not for ordinary callers.
#[doc(hidden)]
pub mod external {
    use crate::{CodecId, SparseGrad, ValueFormat};

    /// Writes the sparse payload of top-k and DGC for `sel` (strictly increasing indices
    /// `< n`) exactly as those codecs do, index coding chosen as they choose it.
    pub fn write_sparse(
        out: &mut Vec<u8>,
        codec: CodecId,
        n: usize,
        sel: &SparseGrad,
        vf: ValueFormat,
    ) {
        crate::sparse::write_selection(out, codec, n, sel, vf)
    }

    /// `ceil(ratio * n)` clamped to `[1, n]`, as the sparsifiers compute `k`.
    pub fn k_for(ratio: f64, n: usize) -> usize {
        crate::sparse::k_for(ratio, n)
    }

    pub use crate::sparse::ThresholdEstimate;

    /// Cuts `cand` (increasing indices into `x`) down to the `k` largest magnitudes, keeping
    /// index order, ties at the k-th to the lowest indices: the sparsifiers' exact cut.
    pub fn cut_to_k(x: &[f32], k: usize, cand: &mut Vec<u32>, scratch: &mut Vec<u32>) {
        crate::sparse::cut_to_k(x, k, cand, scratch)
    }

    /// The uniform in `[0, 1)` the stochastic quantizers draw for element `i` under `key`.
    pub fn uniform(key: u32, i: u32) -> f32 {
        crate::rng::uniform(key, i)
    }

    /// The QSGD buckets of a gradient of `n` elements over `layout` (runs of `d` inside each
    /// tensor).
    pub fn qsgd_buckets(layout: &[usize], n: usize, d: usize) -> Vec<std::ops::Range<usize>> {
        crate::qsgd::buckets(layout, n, d)
    }
}

/// Where a codec runs: enough to seed its RNG and know its tensors' boundaries, shapes and
/// roles.
///
/// Build one with [`BuildContext::new`] (and [`BuildContext::with_tensors`] when the shapes
/// are known), or a struct literal ending in `..Default::default()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildContext {
    /// The run's seed; stochastic codecs derive their RNG from (seed, rank, step).
    pub seed: u64,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Element counts of the tensors packed, in order, into the flat gradient
    /// (their sum is the gradient's length). Empty means one tensor.
    pub layout: Vec<usize>,
    /// Shape and role of each tensor, in the order of `layout` (empty: unknown). Codecs use
    /// it only when its element counts sum to the gradient's length; [`BuildContext::with_tensors`]
    /// keeps `layout` consistent with it.
    pub tensors: Vec<TensorInfo>,
}

impl Default for BuildContext {
    /// Seed 0, rank 0 of 1, one tensor of unknown shape.
    fn default() -> Self {
        BuildContext {
            seed: 0,
            rank: 0,
            world_size: 1,
            layout: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl BuildContext {
    /// A context for `rank` of `world_size` with the tensor sizes `layout` (shapes unknown).
    pub fn new(seed: u64, rank: usize, world_size: usize, layout: Vec<usize>) -> Self {
        BuildContext {
            seed,
            rank,
            world_size,
            layout,
            tensors: Vec::new(),
        }
    }

    /// A context for a single tensor on rank 0 of 1.
    pub fn single(seed: u64) -> Self {
        BuildContext::new(seed, 0, 1, Vec::new())
    }

    /// Sets the tensors' shapes and roles, and `layout` to their element counts.
    pub fn with_tensors(mut self, tensors: Vec<TensorInfo>) -> Self {
        self.layout = tensors.iter().map(TensorInfo::numel).collect();
        self.tensors = tensors;
        self
    }

    /// The tensors of a gradient of `len` elements, when their shapes are known and fit.
    pub fn tensors_for(&self, len: usize) -> Option<&[TensorInfo]> {
        tensors_for(&self.tensors, len)
    }
}

/// Why a payload could not be decoded. Every decoder returns one of these for bad input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than the header, or than what the header announces.
    #[error("payload truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// Longer than the header announces.
    #[error("payload has {extra} trailing bytes")]
    TrailingBytes {
        /// Bytes after the announced end.
        extra: usize,
    },
    /// The magic number is not gradwire's.
    #[error("bad magic {found:#06x} (not a gradwire payload)")]
    BadMagic {
        /// What was found.
        found: u16,
    },
    /// A wire-format version this build does not read.
    #[error("unsupported payload version {found}")]
    BadVersion {
        /// What was found.
        found: u8,
    },
    /// The payload was made by another codec.
    #[error("payload of codec {found} given to the {expected} decoder")]
    WrongCodec {
        /// The decoder's codec.
        expected: CodecId,
        /// The payload's codec id byte.
        found: u8,
    },
    /// The element count differs from the accumulator's length.
    #[error("payload holds {found} elements, accumulator has {expected}")]
    LengthMismatch {
        /// The accumulator's length.
        expected: usize,
        /// The header's element count.
        found: u64,
    },
    /// An index points outside the tensor.
    #[error("index {index} out of range for {len} elements")]
    IndexOutOfRange {
        /// The bad index.
        index: u64,
        /// The tensor length.
        len: usize,
    },
    /// A field holds an impossible value (a NaN scale, zero levels, a bad count, ...).
    #[error("invalid field {field}: {reason}")]
    InvalidField {
        /// The field's name.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl DecodeError {
    /// A saved state ([`Codec::save_state`], [`StateReader`]) that holds an impossible value:
    /// the [`DecodeError::InvalidField`] of field `state`.
    pub const fn invalid_state(reason: &'static str) -> Self {
        DecodeError::InvalidField {
            field: "state",
            reason,
        }
    }
}

/// A gradient compressor. `encode` writes one payload (header included) into a reusable
/// buffer; `decode_add` adds a payload's decoded values into a running sum.
pub trait Codec: Send {
    /// Which codec this is (written into every payload header).
    fn id(&self) -> CodecId;

    /// Compresses `grad` into `out` (cleared first; its capacity is reused across steps).
    /// Stateful codecs (error feedback, momentum, RNG) advance their state.
    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>);

    /// Decodes `payload` and adds it, element by element, into `acc`.
    /// `acc.len()` must equal the payload's element count. Structural errors (header,
    /// lengths, scales, codes) are found before `acc` is touched.
    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError>;

    /// Whether this codec is unbiased and who keeps its residual (constant over the codec's
    /// life). Default: biased, no residual ([`Caps::default`]). What else it can do is
    /// declared by the capability accessors below, not here.
    fn caps(&self) -> Caps {
        Caps::default()
    }

    /// Tells the codec where training is (DGC's warm-up, seeded RNG streams).
    fn set_progress(&mut self, _progress: Progress) {}

    /// Its (index, value) form for the sparse all-reduce ([`SparseEncode`]), if it has one:
    /// a sparsifier returns `Some(self)` (top-k, threshold, random-k, DGC). Default: `None`.
    fn sparse_encode(&mut self) -> Option<&mut dyn SparseEncode> {
        None
    }

    /// Its scalars that the ranks must agree on before every encode ([`SharedScalars`]), if
    /// any: TernGrad returns `Some(self)`. Default: `None` (nothing to agree on).
    fn shared_scalars(&mut self) -> Option<&mut dyn SharedScalars> {
        None
    }

    /// Its fused error-feedback kernel ([`FeedbackEncode`]), if it has one, which
    /// [`ErrorFeedback`] runs instead of its generic passes: fp32, 1-bit SGD and signSGD
    /// return `Some(self)`. Default: `None`.
    fn feedback_encode(&mut self) -> Option<&mut dyn FeedbackEncode> {
        None
    }

    /// Serializes all state (residuals, momenta, RNG position, warm-up position).
    fn save_state(&self) -> Vec<u8> {
        Vec::new()
    }

    /// Restores state saved by [`Codec::save_state`] of the same configuration.
    fn load_state(&mut self, _state: &[u8]) -> Result<(), DecodeError> {
        Ok(())
    }
}

/// The two properties of a codec that are values, not methods ([`Codec::caps`]): whether it
/// is unbiased and who keeps its residual (see the crate doc for the rule). What a codec can
/// *do* beyond `encode`/`decode_add` is declared by its capability accessors
/// ([`Codec::sparse_encode`], [`Codec::shared_scalars`], [`Codec::feedback_encode`]).
/// `Caps::default()`: biased, no residual.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caps {
    /// `E[decode(encode(g))] == g` (QSGD, TernGrad, scaled random-k; lossless fp32): needs no
    /// residual.
    pub unbiased: bool,
    /// Who keeps what a payload leaves out.
    pub feedback: Feedback,
}

impl Caps {
    /// Unbiased, no residual (QSGD, TernGrad, lossless fp32).
    pub const UNBIASED: Caps = Caps {
        unbiased: true,
        feedback: Feedback::None,
    };

    /// Biased, its residual kept as `feedback` says.
    pub const fn biased(feedback: Feedback) -> Caps {
        Caps {
            unbiased: false,
            feedback,
        }
    }
}

/// A codec's (index, value) form, for the sparse all-reduce, which merges indices as it
/// reduces instead of gathering payloads, and the reading of its payloads back into that
/// form (a payload encoded elsewhere, summed by the sparse all-reduce). Implemented by the
/// sparsifiers (top-k, threshold, random-k, DGC), which return it from
/// [`Codec::sparse_encode`].
pub trait SparseEncode {
    /// Selects this step's (index, value) pairs into `out` (cleared first) exactly as
    /// [`Codec::encode`] would (advancing the same state): the values are what `decode_add`
    /// of `encode`'s payload would add.
    fn encode_sparse(&mut self, grad: &[f32], out: &mut SparseGrad);

    /// The pairs `encode_sparse` gave for the step whose `encode` wrote `payload` (`n`
    /// elements), into `out` (cleared first): exactly, values bit for bit, a kept 0.0
    /// included. Validates everything first (on an error `out` is left empty); typed errors,
    /// never a panic; allocates at most one pair per element. Reads the payload with the
    /// codec's own parser and changes no state (`&mut self` only because
    /// [`Codec::sparse_encode`] hands the capability out that way). A gradient of more than
    /// `u32::MAX` elements, which no sparse encode takes, is refused.
    ///
    /// Default: a [`DecodeError::InvalidField`] error (`field` "codec"), for a sparse form
    /// whose payloads do not give its pairs back; every sparsifier of this crate reads them.
    fn decode_pairs(
        &mut self,
        payload: &[u8],
        n: usize,
        out: &mut SparseGrad,
    ) -> Result<(), DecodeError> {
        let _ = (payload, n);
        no_pairs(out)
    }
}

/// [`SparseEncode::decode_pairs`] of a sparse form whose payloads do not give its pairs back:
/// `out` emptied, and an `InvalidField` error naming the codec.
pub(crate) fn no_pairs(out: &mut SparseGrad) -> Result<(), DecodeError> {
    out.clear();
    Err(DecodeError::InvalidField {
        field: "codec",
        reason: "its payloads do not give its sparse pairs back",
    })
}

/// Scalars that every rank must agree on before encoding (TernGrad's shared max, one per
/// tensor). The caller computes [`SharedScalars::local_scalars`] on every rank, takes the
/// element-wise max over ranks and hands it back with [`SharedScalars::set_shared_scalars`]
/// before the next encode. Returned by [`Codec::shared_scalars`].
pub trait SharedScalars {
    /// This rank's scalars, computed from its gradient.
    fn local_scalars(&mut self, grad: &[f32]) -> Vec<f32>;

    /// Sets the agreed scalars (the element-wise max over ranks of
    /// [`SharedScalars::local_scalars`]) for the next encode only.
    fn set_shared_scalars(&mut self, values: &[f32]);
}

/// Error feedback fused into a codec's kernel, run by [`ErrorFeedback`] instead of its three
/// generic passes (fp32, 1-bit SGD, signSGD). Returned by [`Codec::feedback_encode`].
pub trait FeedbackEncode {
    /// Encodes `x = grad + residual` into `out` (cleared first) and sets
    /// `residual = x - decode(out)` (`residual.len() == grad.len()`); the payload is the one
    /// `encode(x)` writes.
    fn encode_feedback(&mut self, grad: &[f32], residual: &mut [f32], out: &mut Vec<u8>);
}

/// Who keeps a codec's residual (what its payloads left out, added to the next gradient).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Feedback {
    /// Nobody: what a payload leaves out is dropped (unbiased or lossless codecs, `ef=false`).
    #[default]
    None,
    /// The generic [`ErrorFeedback`] wrapper (biased quantizers with `ef=true`).
    Generic,
    /// The codec itself, fused with its selection (top-k, threshold, random-k with `ef`,
    /// adaptive quantization; DGC's accumulated velocity).
    Owned,
}

impl Feedback {
    /// `Owned` when `ef` is set, `None` otherwise (for codecs with their own `ef=` switch).
    pub fn owned_if(ef: bool) -> Self {
        if ef {
            Feedback::Owned
        } else {
            Feedback::None
        }
    }
}

/// Where training stands, for codecs whose behaviour changes over time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Progress {
    /// Optimizer steps taken so far.
    pub step: u64,
    /// Epochs completed, fractional (1.5 = halfway through the second epoch).
    pub epoch: f32,
}

/// A sparse gradient: strictly increasing indices and their values.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SparseGrad {
    /// Element indices, strictly increasing.
    pub indices: Vec<u32>,
    /// The value at each index.
    pub values: Vec<f32>,
}

impl SparseGrad {
    /// Empties both vectors, keeping their capacity.
    pub fn clear(&mut self) {
        self.indices.clear();
        self.values.clear();
    }

    /// Empties both vectors for a selection over `n` elements, which must fit the `u32`
    /// indices (`codec` names the selecting codec in the panic).
    #[track_caller]
    pub(crate) fn start(&mut self, n: usize, codec: &str) {
        assert!(
            n <= u32::MAX as usize,
            "{codec} indices are u32: {n} elements is too many"
        );
        self.clear();
    }

    /// Empties both vectors for pairs read back from a payload of `n` elements
    /// ([`SparseEncode::decode_pairs`]): an error where `n` does not fit the `u32` indices
    /// (no sparse encode takes such a gradient, see [`SparseGrad::start`]).
    pub(crate) fn start_pairs(&mut self, n: usize) -> Result<(), DecodeError> {
        self.clear();
        if n > u32::MAX as usize {
            return Err(DecodeError::InvalidField {
                field: "n",
                reason: "more elements than u32 indices address",
            });
        }
        Ok(())
    }
}

impl Codec for Box<dyn Codec> {
    fn id(&self) -> CodecId {
        (**self).id()
    }
    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        (**self).encode(grad, out)
    }
    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        (**self).decode_add(payload, acc)
    }
    fn caps(&self) -> Caps {
        (**self).caps()
    }
    fn set_progress(&mut self, progress: Progress) {
        (**self).set_progress(progress)
    }
    fn sparse_encode(&mut self) -> Option<&mut dyn SparseEncode> {
        (**self).sparse_encode()
    }
    fn shared_scalars(&mut self) -> Option<&mut dyn SharedScalars> {
        (**self).shared_scalars()
    }
    fn feedback_encode(&mut self) -> Option<&mut dyn FeedbackEncode> {
        (**self).feedback_encode()
    }
    fn save_state(&self) -> Vec<u8> {
        (**self).save_state()
    }
    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        (**self).load_state(state)
    }
}
