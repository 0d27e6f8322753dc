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
mod simd;
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

    /// Whether `E[decode(encode(g))] == g` (QSGD, TernGrad, random-k scaled): such codecs need
    /// no error feedback.
    fn is_unbiased(&self) -> bool {
        false
    }

    /// Tells the codec where training is (DGC's warm-up, seeded RNG streams).
    fn set_progress(&mut self, _progress: Progress) {}

    /// Scalars that every rank must agree on before encoding (TernGrad's shared max, one per
    /// tensor), computed from this rank's gradient; `None` for codecs that need none.
    fn local_scalars(&self, _grad: &[f32]) -> Option<Vec<f32>> {
        None
    }

    /// Sets the agreed scalars (the element-wise max over ranks of [`Codec::local_scalars`])
    /// for the next encode only.
    fn set_shared_scalars(&mut self, _values: &[f32]) {}

    /// For sparsifying codecs (top-k, DGC, threshold, random-k): selects this step's
    /// (index, value) pairs exactly as [`Codec::encode`] would (advancing the same state) and
    /// returns `true`, so a sparse allreduce can merge indices as it reduces. Other codecs
    /// return `false` and leave `out` untouched.
    fn encode_sparse(&mut self, _grad: &[f32], _out: &mut SparseGrad) -> bool {
        false
    }

    /// Error feedback fused into the codec: encodes `x = grad + residual` into `out` and sets
    /// `residual = x - decode(out)`, returning `true`. Codecs that have no fused path return
    /// `false` and touch nothing; [`ErrorFeedback`] then does the same in generic passes.
    fn encode_feedback(
        &mut self,
        _grad: &[f32],
        _residual: &mut [f32],
        _out: &mut Vec<u8>,
    ) -> bool {
        false
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
    fn is_unbiased(&self) -> bool {
        (**self).is_unbiased()
    }
    fn set_progress(&mut self, progress: Progress) {
        (**self).set_progress(progress)
    }
    fn local_scalars(&self, grad: &[f32]) -> Option<Vec<f32>> {
        (**self).local_scalars(grad)
    }
    fn set_shared_scalars(&mut self, values: &[f32]) {
        (**self).set_shared_scalars(values)
    }
    fn encode_sparse(&mut self, grad: &[f32], out: &mut SparseGrad) -> bool {
        (**self).encode_sparse(grad, out)
    }
    fn encode_feedback(&mut self, grad: &[f32], residual: &mut [f32], out: &mut Vec<u8>) -> bool {
        (**self).encode_feedback(grad, residual, out)
    }
    fn save_state(&self) -> Vec<u8> {
        (**self).save_state()
    }
    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        (**self).load_state(state)
    }
}
