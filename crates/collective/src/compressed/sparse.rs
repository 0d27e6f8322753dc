//! Sparse all-reduce for sparsifying codecs (top-k, DGC, threshold, random-k).
//!
//! Recursive doubling (any world size, through the [`fold`](crate::fold)) over sorted
//! `(index, value)` lists: at each step partners swap their current sums and merge them, so
//! an index that several ranks selected travels once, not once per rank. When a merged set
//! holds more than [`DENSE_FRACTION`] of the tensor, both partners switch to a dense vector
//! (a pair costs 8 bytes, a dense element 4) and stay dense. Bytes per rank:
//! `~ k · log2 P` pairs when the index sets coincide, `~ k · (P-1)` when disjoint (as an
//! all-gather), never more than `~ len · log2 P` f32s.
//!
//! Wire format: see [`SPARSE_HEADER_LEN`](super::SPARSE_HEADER_LEN) and `sparse_wire.rs`
//! (magic, kind, pair count, tensor length; total and length-checked).

use gradwire_codec::{Codec, SparseGrad};
use gradwire_transport::Transport;

use super::sparse_wire::{self, Kind};
use super::Reduce;
use crate::fold::{doubling_partners, Fold, Role};
use crate::{Error, Result};

/// A merged set denser than `1 / DENSE_FRACTION` of the tensor goes dense.
pub const DENSE_FRACTION: usize = 3;

/// The sum of a [`SparseAllReduce::all_reduce_pairs_sum`], as the all-reduce ended it.
#[derive(Debug, Clone, Copy)]
pub enum Sum<'a> {
    /// Sorted pairs, each index once; every other element of the sum is zero.
    Sparse(&'a SparseGrad),
    /// Every element of the sum.
    Dense(&'a [f32]),
}

/// The running sum: sorted pairs or a dense vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Sparse,
    Dense,
}

/// Sparse all-reduce with its reusable buffers.
#[derive(Debug, Default)]
pub struct SparseAllReduce {
    mine: SparseGrad,
    cur: SparseGrad,
    other: SparseGrad,
    merged: SparseGrad,
    dense: Vec<f32>,
    other_dense: Vec<f32>,
    send: Vec<u8>,
    recv: Vec<u8>,
}

impl SparseAllReduce {
    /// An empty one; buffers grow on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// Selects this rank's pairs with the codec's [`gradwire_codec::SparseEncode`] (advancing
    /// its state exactly as `encode` would), sums every rank's pairs, and writes the dense sum
    /// (or mean) to `grad`. Fails with [`Error::Codec`] if the codec does not sparsify.
    pub fn all_reduce<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        codec: &mut dyn Codec,
        grad: &mut [f32],
        reduce: Reduce,
    ) -> Result<()> {
        let Some(codec) = codec.sparse_encode() else {
            return Err(Error::Codec {
                what: "sparse all-reduce needs a sparsifying codec (Codec::sparse_encode)",
            });
        };
        let mut mine = std::mem::take(&mut self.mine);
        mine.clear();
        codec.encode_sparse(grad, &mut mine);
        let res = self.all_reduce_pairs(t, &mine, grad);
        self.mine = mine;
        res?;
        reduce.finish(grad, t.world_size());
        Ok(())
    }

    /// Pairs this rank selected in the last [`SparseAllReduce::all_reduce`].
    pub fn last_pairs(&self) -> usize {
        self.mine.indices.len()
    }

    /// Sums every rank's `mine` (strictly increasing indices `< out.len()`) and writes the
    /// dense sum to `out` (every rank must pass the same `out.len()`).
    pub fn all_reduce_pairs<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        mine: &SparseGrad,
        out: &mut [f32],
    ) -> Result<()> {
        match self.all_reduce_pairs_sum(t, mine, out.len())? {
            Sum::Sparse(s) => {
                out.fill(0.0);
                sparse_wire::scatter_add(s, out);
            }
            Sum::Dense(d) => out.copy_from_slice(d),
        }
        Ok(())
    }

    /// Sums every rank's `mine` (strictly increasing indices `< len`; every rank passes the
    /// same `len`) and returns the sum as it ended: sorted pairs (each index once) or a dense
    /// vector of `len`, borrowed from this all-reduce's buffers. For callers that write the
    /// sum somewhere of their own (scaled, split by tensor) without first zeroing and filling
    /// a dense buffer.
    pub fn all_reduce_pairs_sum<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        mine: &SparseGrad,
        len: usize,
    ) -> Result<Sum<'_>> {
        if mine.indices.len() != mine.values.len()
            || mine.indices.windows(2).any(|w| w[0] >= w[1])
            || mine.indices.last().is_some_and(|&i| i as usize >= len)
        {
            return Err(Error::Codec {
                what: "sparse input: indices not strictly increasing, out of range, or not one per value",
            });
        }
        let (rank, world) = (t.rank(), t.world_size());
        self.cur.clone_from(mine);
        let mut state = State::Sparse;
        if self.cur.indices.len() * DENSE_FRACTION > len {
            self.go_dense(len);
            state = State::Dense;
        }
        let fold = Fold::new(world);
        match fold.role(rank) {
            Role::Extra { proxy } => {
                self.encode(state, len);
                t.send(proxy, &self.send)?;
                t.recv(proxy, &mut self.recv)?;
                return Ok(
                    match sparse_wire::decode(
                        proxy,
                        &self.recv,
                        len,
                        &mut self.other,
                        &mut self.dense,
                    )? {
                        Kind::Sparse => Sum::Sparse(&self.other),
                        Kind::Dense => Sum::Dense(&self.dense),
                    },
                );
            }
            Role::Proxy { extra, vrank } => {
                t.recv(extra, &mut self.recv)?;
                state = self.absorb(extra, state, len)?;
                for pv in doubling_partners(vrank, fold.p2) {
                    state = self.exchange(t, fold.real(pv), state, len)?;
                }
                self.encode(state, len);
                t.send(extra, &self.send)?;
            }
            Role::Member { vrank } => {
                for pv in doubling_partners(vrank, fold.p2) {
                    state = self.exchange(t, fold.real(pv), state, len)?;
                }
            }
        }
        Ok(match state {
            State::Sparse => Sum::Sparse(&self.cur),
            State::Dense => Sum::Dense(&self.dense),
        })
    }

    fn encode(&mut self, state: State, len: usize) {
        match state {
            State::Sparse => sparse_wire::encode_sparse(&self.cur, len, &mut self.send),
            State::Dense => sparse_wire::encode_dense(&self.dense, &mut self.send),
        }
    }

    fn exchange<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        partner: usize,
        state: State,
        len: usize,
    ) -> Result<State> {
        self.encode(state, len);
        t.send_recv(partner, &self.send, partner, &mut self.recv)?;
        self.absorb(partner, state, len)
    }

    /// Adds the message in `self.recv` (from `peer`) into the running sum.
    fn absorb(&mut self, peer: usize, state: State, len: usize) -> Result<State> {
        let kind = sparse_wire::decode(
            peer,
            &self.recv,
            len,
            &mut self.other,
            &mut self.other_dense,
        )?;
        Ok(match (state, kind) {
            (State::Sparse, Kind::Sparse) => {
                // The union's size decides; both partners compute the same. Its bounds
                // (max(a, b) <= n <= a + b) decide without counting when they can.
                let (a, b) = (self.cur.indices.len(), self.other.indices.len());
                let n = if (a + b) * DENSE_FRACTION <= len || a.max(b) * DENSE_FRACTION > len {
                    a + b
                } else {
                    sparse_wire::union_len(&self.cur.indices, &self.other.indices)
                };
                if n * DENSE_FRACTION > len {
                    self.go_dense(len);
                    sparse_wire::scatter_add(&self.other, &mut self.dense);
                    State::Dense
                } else {
                    sparse_wire::merge(&self.cur, &self.other, &mut self.merged);
                    std::mem::swap(&mut self.cur, &mut self.merged);
                    State::Sparse
                }
            }
            (State::Sparse, Kind::Dense) => {
                // dense = theirs + mine, as the partner computes it.
                std::mem::swap(&mut self.dense, &mut self.other_dense);
                sparse_wire::scatter_add(&self.cur, &mut self.dense);
                State::Dense
            }
            (State::Dense, Kind::Sparse) => {
                sparse_wire::scatter_add(&self.other, &mut self.dense);
                State::Dense
            }
            (State::Dense, Kind::Dense) => {
                self.dense
                    .iter_mut()
                    .zip(&self.other_dense)
                    .for_each(|(a, b)| *a += *b);
                State::Dense
            }
        })
    }

    /// Turns the sparse running sum into a dense one.
    fn go_dense(&mut self, len: usize) {
        self.dense.clear();
        self.dense.resize(len, 0.0);
        sparse_wire::scatter_add(&self.cur, &mut self.dense);
    }
}
