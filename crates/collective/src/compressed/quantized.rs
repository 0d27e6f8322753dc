//! Quantized ring reduce-scatter + all-gather (Dryden, Moon, Jacobs, Van Essen, MLHPC 2016;
//! the stripes of 1-bit SGD, Seide et al. 2014).
//!
//! **Deprecated: use [`super::StripeAllReduce`].** This forwarding ring re-quantizes each
//! partial sum at every hop, `P` quantizations in series, where the papers' exchange has two.
//! Measured at P=4 (tests/stripe.rs, `stripe_bytes_vs_gather_and_ring`, equal columns) it does
//! not win on bytes (1-bit SGD, LeNet: 8712 bytes per rank vs 8772 for the stripes; 1M-element
//! MLP: 203064 vs 203028; adaptive: 7627 vs 7069 and 175652 vs 157486), nor on the error-feedback
//! running mean after 100 steps (tests/feedback.rs; 1-bit P=4: 0.064 vs 0.058; P=8: 0.082 vs
//! 0.074; adaptive P=8: 0.405 vs 0.355), and it refuses TernGrad.
//! It is kept for comparison and for callers not yet moved.
//!
//! ```text
//! reduce-scatter: step s, rank r: encode(partial chunk r-s-1) with codec rs[r-s-1] ──▶ right
//!                                 decode_add(payload from left) into chunk r-s-2 (f32 add)
//! owner r now holds chunk r summed in full precision; encode it ONCE with codec ag
//! all-gather:     ring all-gather of the P payloads (forwarded, never re-compressed),
//!                 every rank (owner included) decodes every chunk → identical bits
//! ```
//!
//! Error feedback lives in the codecs: each rank keeps one reduce-scatter codec per chunk
//! (each partial chunk it forwards has its own residual, Dryden's `qerror`) and one
//! all-gather codec for the chunk it owns (Dryden's `im_qerror`). Build them with a factory
//! that wraps each in error feedback as wanted.

use std::ops::Range;

use gradwire_codec::{Codec, DecodeError};
use gradwire_transport::Transport;

use super::state::{load_codecs, save_codecs, Tag};
use super::{all_gather_chunks, Reduce};
use crate::ring::{left, reduce_scatter_step, right};
use crate::{chunks, Error, Result};

/// Which leg of the quantized all-reduce a codec serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Leg {
    /// Compresses (and decodes) partial sums of one chunk on the reduce-scatter ring.
    ReduceScatter,
    /// Compresses the fully reduced chunk this rank owns, once, for the all-gather.
    AllGather,
}

/// The tag of a [`QuantizedAllReduce`]'s saved state.
const TAG: Tag = Tag {
    tag: b"GWQR",
    not_ours: "not a quantized all-reduce state",
    other_world: "quantized all-reduce state of another world size",
};

/// Dryden's quantized all-reduce for tensors of one length on one world, with the per-chunk
/// codec state it carries across steps.
pub struct QuantizedAllReduce {
    len: usize,
    rank: usize,
    world: usize,
    /// `rs[c]`: encodes this rank's partial chunk `c`; `rs[rank]` only decodes.
    rs: Vec<Box<dyn Codec>>,
    ag: Box<dyn Codec>,
    send: Vec<u8>,
    recv: Vec<u8>,
    gathered: Vec<Vec<u8>>,
    rs_bytes: u64,
    ag_bytes: u64,
}

impl QuantizedAllReduce {
    /// Builds the codecs for a tensor of `len` elements on rank `rank` of `world`:
    /// `factory(Leg::ReduceScatter, c)` for every chunk `c` in `0..world`, then
    /// `factory(Leg::AllGather, rank)`. Every rank must build the same codec types per
    /// `(leg, chunk)`, since a chunk's payloads are decoded by other ranks' instances.
    pub fn new(
        len: usize,
        rank: usize,
        world: usize,
        mut factory: impl FnMut(Leg, usize) -> Box<dyn Codec>,
    ) -> Self {
        assert!(rank < world, "rank {rank} of {world}");
        let rs = (0..world).map(|c| factory(Leg::ReduceScatter, c)).collect();
        let ag = factory(Leg::AllGather, rank);
        QuantizedAllReduce {
            len,
            rank,
            world,
            rs,
            ag,
            send: Vec::new(),
            recv: Vec::new(),
            gathered: Vec::new(),
            rs_bytes: 0,
            ag_bytes: 0,
        }
    }

    /// The element range of chunk `c`.
    pub fn chunk(&self, c: usize) -> Range<usize> {
        chunks::range(self.len, self.world, c)
    }

    /// The reduce-scatter codec of chunk `c` (for progress, state save/load).
    pub fn rs_codec_mut(&mut self, c: usize) -> &mut dyn Codec {
        &mut *self.rs[c]
    }

    /// The all-gather codec (for progress, state save/load).
    pub fn ag_codec_mut(&mut self) -> &mut dyn Codec {
        &mut *self.ag
    }

    /// Payload bytes this rank has sent on the reduce-scatter and all-gather legs so far
    /// (frame headers excluded), as Dryden counts them separately.
    pub fn bytes_by_leg(&self) -> (u64, u64) {
        (self.rs_bytes, self.ag_bytes)
    }

    /// Everything that changes across steps: the state of every reduce-scatter codec (one
    /// per chunk, in chunk order) and of the all-gather codec ([`Codec::save_state`];
    /// residuals, RNG positions). Layout (see `state.rs`): tag `GWQR`, the world size as a
    /// `u64`, then each codec's state as a `u64` length and its bytes, the all-gather's last.
    /// Buffers and byte counters are not state.
    pub fn save_state(&self) -> Vec<u8> {
        save_codecs(&TAG, &self.rs, &*self.ag)
    }

    /// Restores what [`QuantizedAllReduce::save_state`] saved on the same rank of a world
    /// of the same size with the same codecs. Bad input gives a [`DecodeError`] (a state of
    /// another all-reduce, another world size, truncated, or refused by a codec) and leaves
    /// this all-reduce as it was.
    pub fn load_state(&mut self, state: &[u8]) -> std::result::Result<(), DecodeError> {
        load_codecs(state, &TAG, &mut self.rs, &mut self.ag)
    }

    /// Replaces `grad` by the quantized sum (or mean) over ranks.
    pub fn all_reduce<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        grad: &mut [f32],
        reduce: Reduce,
    ) -> Result<()> {
        super::check_built_for(
            t,
            (self.rank, self.world, self.len),
            grad.len(),
            "QuantizedAllReduce was built for another rank or world size",
        )?;
        let (rank, world) = (self.rank, self.world);
        let shared_scalar = Error::Codec {
            what: "codecs needing a shared scalar (TernGrad) are not supported by the quantized ring; use GatherDecode",
        };
        let (to, from) = (right(rank, world), left(rank, world));
        let before = t.bytes_sent();
        for step in 0..world - 1 {
            let (sc, rc) = reduce_scatter_step(rank, world, step);
            let (sr, rr) = (self.chunk(sc), self.chunk(rc));
            if self.rs[sc].shared_scalars().is_some() {
                return Err(shared_scalar);
            }
            self.rs[sc].encode(&grad[sr], &mut self.send);
            t.send_recv(to, &self.send, from, &mut self.recv)?;
            self.rs[rc]
                .decode_add(&self.recv, &mut grad[rr])
                .map_err(|source| Error::Decode { peer: from, source })?;
        }
        let mid = t.bytes_sent();
        self.rs_bytes += mid - before;
        let mine = self.chunk(rank);
        if self.ag.shared_scalars().is_some() {
            return Err(shared_scalar);
        }
        self.ag.encode(&grad[mine], &mut self.send);
        let (len, ag) = (self.len, &*self.ag);
        let chunk = |c| (chunks::range(len, world, c), ag);
        self.ag_bytes += all_gather_chunks(t, &self.send, &mut self.gathered, grad, chunk, reduce)?;
        Ok(())
    }
}
