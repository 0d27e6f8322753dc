//! All-reduces that carry codec payloads instead of raw f32s.
//!
//! - [`GatherDecode`]: encode, all-gather the payloads, `decode_add` each into the output
//!   (no dense temporary per peer). For any codec, and the only choice for unbiased
//!   stochastic ones and codecs with a shared scalar (TernGrad).
//! - [`QuantizedAllReduce`]: Dryden et al. 2016's quantized ring reduce-scatter +
//!   all-gather (1-bit SGD's stripes): each hop sends a compressed chunk, the owner adds in
//!   full precision and re-compresses once for the all-gather; error feedback on both legs
//!   lives in the per-chunk / per-leg codecs the caller's factory builds.
//! - [`SparseAllReduce`]: for sparsifying codecs (top-k, DGC, threshold): recursive doubling
//!   over sorted (index, value) lists, merged as they are reduced, with a dense fallback, so
//!   the bytes do not grow as `P × k` when the ranks' index sets overlap.
//!
//! Each all-reduce sums (or averages) and leaves every rank with bit-identical results.

mod gather_decode;
mod quantized;
mod sparse;
mod sparse_wire;

pub use gather_decode::GatherDecode;
pub use quantized::{Leg, QuantizedAllReduce};
pub use sparse::{SparseAllReduce, DENSE_FRACTION};
#[doc(hidden)]
pub use sparse_wire::fuzz_decode as fuzz_sparse_wire;
pub use sparse_wire::HEADER as SPARSE_HEADER_LEN;

/// How a compressed all-reduce combines the ranks' gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduce {
    /// The sum over ranks.
    Sum,
    /// The sum divided by the world size.
    #[default]
    Mean,
}

impl Reduce {
    pub(crate) fn finish(self, out: &mut [f32], world: usize) {
        if self == Reduce::Mean && world > 1 {
            let n = world as f32;
            out.iter_mut().for_each(|x| *x /= n);
        }
    }
}
