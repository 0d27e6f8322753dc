//! The shard's limits on what it holds and what one reply may carry, and the checks that
//! refuse a request before anything is allocated for it (each refusal a `LimitExceeded`
//! error whose `value` is the limit).

use crate::spec::ChunkId;
use crate::wire::{ErrorCode, HEADER_LEN};

use super::*;

/// What a shard agrees to hold. Elements are f32 values: the chunks' parameters plus
/// Sandblaster's scratch vectors (optimizer state and a sync round's pending sums add up
/// to four more per parameter, so memory is at most about 20 bytes per counted element).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most chunks (table slices) on the shard.
    pub max_chunks: usize,
    /// Most f32 elements held, chunks and scratch vectors together.
    pub max_elements: usize,
    /// Most scratch vector slices (Sandblaster's `SetVec` and vector-op results).
    pub max_vectors: usize,
    /// Most workers a shard is configured for.
    pub max_workers: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_chunks: 1 << 16,
            max_elements: 1 << 30,
            max_vectors: 1 << 16,
            max_workers: 1 << 16,
        }
    }
}

/// A `LimitExceeded` rejection.
pub(super) fn exceeded(limit: usize, message: String) -> Rejection {
    err(ErrorCode::LimitExceeded, None, limit as u64, message)
}

impl Shard {
    /// Elements held now (chunks and scratch vectors).
    pub(super) fn elements(st: &State) -> usize {
        let chunks: usize = st.chunks.values().map(|c| c.values.len()).sum();
        let vecs: usize = st
            .vecs
            .values()
            .flat_map(|m| m.values())
            .map(Vec::len)
            .sum();
        chunks + vecs
    }

    /// Whether a new chunk of `len` elements fits.
    pub(super) fn check_new_chunk(
        &self,
        st: &State,
        id: ChunkId,
        len: usize,
    ) -> Result<(), Rejection> {
        let l = &self.cfg.limits;
        if st.chunks.len() >= l.max_chunks {
            return Err(exceeded(
                l.max_chunks,
                format!("{id}: the shard holds its limit of {} chunks", l.max_chunks),
            ));
        }
        self.check_elements(st, len, 0)
    }

    /// Whether `add` more elements fit once `freed` are released.
    pub(super) fn check_elements(
        &self,
        st: &State,
        add: usize,
        freed: usize,
    ) -> Result<(), Rejection> {
        let max = self.cfg.limits.max_elements;
        let after = Self::elements(st).saturating_sub(freed).saturating_add(add);
        if after > max {
            return Err(exceeded(
                max,
                format!("{add} more elements would put the shard over its limit of {max}"),
            ));
        }
        Ok(())
    }

    /// Whether `add` new scratch vectors fit.
    pub(super) fn check_vectors(&self, st: &State, add: usize) -> Result<(), Rejection> {
        let max = self.cfg.limits.max_vectors;
        let have: usize = st.vecs.values().map(BTreeMap::len).sum();
        if have.saturating_add(add) > max {
            return Err(exceeded(
                max,
                format!("the shard holds its limit of {max} scratch vectors"),
            ));
        }
        Ok(())
    }

    /// Whether a Values reply of `elements` f32 fits in one frame body.
    pub(super) fn check_reply(&self, id: ChunkId, elements: usize) -> Result<(), Rejection> {
        let max = self.cfg.max_body;
        let bytes = elements.saturating_mul(4).saturating_add(20);
        if bytes > max {
            return Err(exceeded(
                max,
                format!(
                    "{id}: a reply of {elements} values ({} bytes with its header) is above the \
                     frame limit of {max} bytes; ask for fewer rows",
                    bytes + HEADER_LEN
                ),
            ));
        }
        Ok(())
    }
}
