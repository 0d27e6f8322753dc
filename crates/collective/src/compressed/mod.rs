//! All-reduces that carry codec payloads instead of raw f32s.
//!
//! - [`GatherDecode`]: encode, all-gather the payloads, `decode_add` each into the output
//!   (no dense temporary per peer). For any codec, and the only choice for unbiased
//!   stochastic ones and codecs with a shared scalar (TernGrad).
//! - [`StripeAllReduce`]: 1-bit SGD's stripes (Seide 2014, CNTK) and Dryden 2016's direct
//!   exchange: each rank quantizes its slice for each owner once, the owner sums and
//!   re-quantizes once, the stripes are all-gathered: two quantizations in series, for any
//!   dense quantizing codec. The choice for `onebit`, `adaptive` and the other quantizers.
//! - [`QuantizedAllReduce`] (deprecated, see its module doc): Dryden et al. 2016's quantized ring reduce-scatter +
//!   all-gather (1-bit SGD's stripes): each hop sends a compressed chunk, the owner adds in
//!   full precision and re-compresses once for the all-gather; error feedback on both legs
//!   lives in the per-chunk / per-leg codecs the caller's factory builds.
//! - [`PowerSgdAllReduce`]: PowerSGD as published (Vogels 2019): `P` and then `Q` all-reduced,
//!   orthogonalized in between, error feedback, warm start; the `powersgd` codec through
//!   [`GatherDecode`] is the local variant (each rank's own approximation, summed).
//! - [`SparseAllReduce`]: for sparsifying codecs (top-k, DGC, threshold): recursive doubling
//!   over sorted (index, value) lists, merged as they are reduced, with a dense fallback, so
//!   the bytes do not grow as `P × k` when the ranks' index sets overlap.
//!
//! Each all-reduce sums (or averages) and leaves every rank with bit-identical results.
//!
//! The all-reduces that carry state across steps (the quantized ring's and the stripes'
//! codecs, PowerSGD's `Q`s, error and step count) save it with `save_state` and restore it
//! with `load_state` (layout in `state.rs`: a tag, then length-checked fields; bad input
//! gives a [`DecodeError`](gradwire_codec::DecodeError) and changes nothing), so a training
//! that stops can resume bit for bit.

mod gather_decode;
mod powersgd;
mod quantized;
mod sparse;
mod sparse_wire;
mod state;
mod stripe;

pub use gather_decode::GatherDecode;
pub use powersgd::{factor_algorithm, initial_q, orthogonalize, PowerSgdAllReduce, PowerSgdTensor};
pub use quantized::{Leg, QuantizedAllReduce};
pub use sparse::{SparseAllReduce, Sum as SparseSum, DENSE_FRACTION};
#[cfg(fuzzing)]
pub use sparse_wire::fuzz_decode as fuzz_sparse_wire;
pub use sparse_wire::HEADER as SPARSE_HEADER_LEN;
pub use stripe::{OwnContribution, StripeAllReduce, StripePlan};

/// Refuses a call on a transport or buffer other than the ones an all-reduce was built for:
/// `name` (the type) appears in the error.
pub(crate) fn check_built_for<T: gradwire_transport::Transport + ?Sized>(
    t: &T,
    (rank, world, len): (usize, usize, usize),
    grad_len: usize,
    name: &'static str,
) -> crate::Result<()> {
    check_len(len, grad_len)?;
    if t.rank() != rank || t.world_size() != world {
        return Err(crate::Error::Codec { what: name });
    }
    Ok(())
}

/// Refuses a gradient of `grad_len` elements where an all-reduce was built for `len`.
pub(crate) fn check_len(len: usize, grad_len: usize) -> crate::Result<()> {
    if grad_len != len {
        return Err(crate::Error::BadOutputLength {
            expected: len,
            got: grad_len,
        });
    }
    Ok(())
}

/// The all-gather leg of the two-leg all-reduces ([`QuantizedAllReduce`],
/// [`StripeAllReduce`]): all-gathers every rank's `payload` (its chunk, encoded), overwrites
/// chunk `c` of `grad` with the decoding of rank `c`'s payload (`chunk(c)`: its range and the
/// codec that decodes it), in rank order so that every rank ends with the same bits, then
/// applies `reduce`. Returns the bytes this rank sent.
pub(crate) fn all_gather_chunks<'c, T: gradwire_transport::Transport + ?Sized>(
    t: &mut T,
    payload: &[u8],
    gathered: &mut Vec<Vec<u8>>,
    grad: &mut [f32],
    chunk: impl Fn(usize) -> (std::ops::Range<usize>, &'c dyn gradwire_codec::Codec),
    reduce: Reduce,
) -> crate::Result<u64> {
    let before = t.bytes_sent();
    crate::gather::all_gather_bytes(t, payload, gathered)?;
    let sent = t.bytes_sent() - before;
    for (peer, p) in gathered.iter().enumerate() {
        let (r, codec) = chunk(peer);
        grad[r.clone()].fill(0.0);
        codec
            .decode_add(p, &mut grad[r])
            .map_err(|source| crate::Error::Decode { peer, source })?;
    }
    reduce.finish(grad, t.world_size());
    Ok(sent)
}

/// Adds the decoding of every rank's payload to `out` with `codec`, in rank order
/// (`payloads` yields rank 0's first) so that every rank ends with the same bits. A payload
/// that does not decode gives [`Error::Decode`](crate::Error::Decode) naming its rank; the
/// payloads before it have been added.
pub fn decode_add_each<'p>(
    codec: &dyn gradwire_codec::Codec,
    payloads: impl IntoIterator<Item = &'p [u8]>,
    out: &mut [f32],
) -> crate::Result<()> {
    for (peer, p) in payloads.into_iter().enumerate() {
        codec
            .decode_add(p, out)
            .map_err(|source| crate::Error::Decode { peer, source })?;
    }
    Ok(())
}

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
