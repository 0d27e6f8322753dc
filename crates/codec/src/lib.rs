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
//! Beyond `encode`/`decode_add`, a codec states what else it does in [`Codec::caps`]
//! ([`Caps`]): whether it emits (index, value) pairs for the sparse all-reduce
//! ([`Codec::encode_sparse`]), whether the ranks must agree on scalars before it encodes
//! ([`Codec::local_scalars`], TernGrad's shared max), whether it has a fused error-feedback
//! kernel ([`Codec::encode_feedback`]), whether it is unbiased, and who keeps its residual.
//! Callers choose their path from these flags and call a method only when its flag is set;
//! no method answers "not supported" with a sentinel.
//!
//! # Error feedback: who owns the residual
//! One rule. A codec **owns** its residual ([`Feedback::Owned`]) exactly when the residual
//! decides what is selected: the sparsifiers and selectors of the seed papers (top-k,
//! threshold, random-k with `ef`, adaptive quantization, and DGC, whose accumulated velocity
//! plays that part). Their selection reads `g + r` and writes back what stays in the same
//! pass, [`Codec::encode_sparse`] advances it exactly as `encode` does, and their `ef=`
//! switches their own residual; they are never wrapped. Every other codec keeps no residual:
//! with `ef=true` the one generic [`ErrorFeedback`] wrapper keeps it ([`Feedback::Generic`]),
//! running the codec's fused kernel when [`Caps::fused_feedback`] is set and three generic
//! passes otherwise. Without `ef` nobody keeps one ([`Feedback::None`]): the default of the
//! unbiased codecs (QSGD, TernGrad, scaled random-k) and the plain casts (`none`, `fp16`,
//! `bf16`), a named option (`ef=false`) for the others. A codec that reports
//! [`Caps::unbiased`] keeps no residual.
#![deny(missing_docs)]

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
pub use layout::{segments, tensors_for, Columns, TensorInfo, TensorRole};
pub use onebit::{OneBit, OneBitConfig};
pub use params::{ConfigError, Params};
pub use powersgd::{PowerSgd, PowerSgdConfig};
pub use qsgd::{Qsgd, QsgdCoding, QsgdConfig, QsgdNorm};
pub use randomk::{RandomK, RandomKConfig};
pub use rng::StepRng;
pub use signsgd::{SignSgd, SignSgdConfig};
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
        crate::sparse::write_sparse(out, codec, n, &sel.indices, &sel.values, vf, true)
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

    /// What this codec can do beyond `encode`/`decode_add`, and who keeps its residual
    /// (constant over the codec's life). Default: none of it ([`Caps::default`]).
    fn caps(&self) -> Caps {
        Caps::default()
    }

    /// Tells the codec where training is (DGC's warm-up, seeded RNG streams).
    fn set_progress(&mut self, _progress: Progress) {}

    /// Scalars that every rank must agree on before encoding (TernGrad's shared max, one per
    /// tensor), computed from this rank's gradient. Call only when
    /// [`Caps::shared_scalars`]; the default panics (a caller bug).
    fn local_scalars(&self, _grad: &[f32]) -> Vec<f32> {
        panic!(
            "{} needs no shared scalars: check caps().shared_scalars first",
            self.id().name()
        )
    }

    /// Sets the agreed scalars (the element-wise max over ranks of [`Codec::local_scalars`])
    /// for the next encode only. Codecs without [`Caps::shared_scalars`] ignore it.
    fn set_shared_scalars(&mut self, _values: &[f32]) {}

    /// Selects this step's (index, value) pairs into `out` (cleared first) exactly as
    /// [`Codec::encode`] would (advancing the same state), so a sparse all-reduce can merge
    /// indices as it reduces. Call only when [`Caps::sparse`]; the default panics (a caller
    /// bug).
    fn encode_sparse(&mut self, _grad: &[f32], _out: &mut SparseGrad) {
        panic!(
            "{} does not sparsify: check caps().sparse first",
            self.id().name()
        )
    }

    /// Error feedback fused into the codec: encodes `x = grad + residual` into `out` and sets
    /// `residual = x - decode(out)` (`residual.len() == grad.len()`). Call only when
    /// [`Caps::fused_feedback`] ([`ErrorFeedback`] does); the default panics (a caller bug).
    fn encode_feedback(&mut self, _grad: &[f32], _residual: &mut [f32], _out: &mut Vec<u8>) {
        panic!(
            "{} has no fused error feedback: check caps().fused_feedback first",
            self.id().name()
        )
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

/// What a codec can do beyond `encode`/`decode_add` ([`Codec::caps`]); see the crate doc for
/// the rule on who owns the residual. `Caps::default()` is a plain dense codec: no sparse
/// form, no shared scalars, no fused kernel, biased, no residual.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caps {
    /// Emits (index, value) pairs for the sparse all-reduce: [`Codec::encode_sparse`] selects
    /// exactly what [`Codec::encode`] sends (top-k, threshold, random-k, DGC).
    pub sparse: bool,
    /// The ranks must agree on scalars before every encode: [`Codec::local_scalars`], an
    /// element-wise max over ranks, then [`Codec::set_shared_scalars`] (TernGrad).
    pub shared_scalars: bool,
    /// Has a fused error-feedback kernel, [`Codec::encode_feedback`], that
    /// [`ErrorFeedback`] runs instead of its generic passes (fp32, 1-bit SGD, signSGD).
    pub fused_feedback: bool,
    /// `E[decode(encode(g))] == g` (QSGD, TernGrad, scaled random-k; lossless fp32): needs no
    /// residual.
    pub unbiased: bool,
    /// Who keeps what a payload leaves out.
    pub feedback: Feedback,
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

impl Caps {
    /// A sparsifier's: [`Caps::sparse`], with `feedback`, biased.
    pub fn sparsifier(feedback: Feedback) -> Caps {
        Caps {
            sparse: true,
            feedback,
            ..Caps::default()
        }
    }
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
    fn local_scalars(&self, grad: &[f32]) -> Vec<f32> {
        (**self).local_scalars(grad)
    }
    fn set_shared_scalars(&mut self, values: &[f32]) {
        (**self).set_shared_scalars(values)
    }
    fn encode_sparse(&mut self, grad: &[f32], out: &mut SparseGrad) {
        (**self).encode_sparse(grad, out)
    }
    fn encode_feedback(&mut self, grad: &[f32], residual: &mut [f32], out: &mut Vec<u8>) {
        (**self).encode_feedback(grad, residual, out)
    }
    fn save_state(&self) -> Vec<u8> {
        (**self).save_state()
    }
    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        (**self).load_state(state)
    }
}
