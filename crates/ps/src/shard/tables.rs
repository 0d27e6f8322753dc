//! Creating chunks: `Init` (the first wins, an identical later one is acknowledged) and
//! the per-chunk codec decoder.

use std::collections::BTreeSet;

use gradwire_codec::BuildContext;

use crate::spec::{ChunkId, PushCodec, TableSpec};
use crate::updater::OptState;
use crate::wire::{ErrorCode, Request, Response};

use super::*;

impl Shard {
    pub(super) fn new_chunk(&self, spec: TableSpec, values: Vec<f32>) -> Chunk {
        let decoder = match &spec.codec {
            PushCodec::Codec(c) => Some(c.build(&BuildContext {
                seed: self.cfg.seed,
                rank: 0,
                world_size: self.cfg.num_workers as usize,
                layout: Vec::new(),
                ..Default::default()
            })),
            _ => None,
        };
        Chunk {
            spec,
            values,
            opt: OptState::default(),
            round: 0,
            n_grad: 0,
            pend_grad: Vec::new(),
            pend_add: Vec::new(),
            contributors: BTreeSet::new(),
            clocks: vec![0; self.cfg.num_workers as usize],
            decoder,
        }
    }

    /// Creates `chunk` (`creates`: the caller may create tables), or acknowledges an
    /// identical existing one. A caller that may not create waits (until `deadline`) for
    /// the coordinator to create it, then gets `NotInitialized`.
    pub(super) fn init(
        &self,
        chunk: ChunkId,
        spec: TableSpec,
        values: Vec<f32>,
        creates: bool,
        deadline: Instant,
    ) -> Result<Response, Rejection> {
        let mut st = self.lock();
        if !creates {
            st = self
                .wait(
                    st,
                    deadline,
                    |_, st, _| Ok(st.chunks.contains_key(&chunk)),
                    |_| (None, String::new()),
                )
                .map_err(|_| {
                    err(
                        ErrorCode::NotInitialized,
                        None,
                        0,
                        format!("{chunk} is not created yet (only the coordinator creates tables)"),
                    )
                })?;
        }
        if let Some(c) = st.chunks.get(&chunk) {
            if c.spec == spec && c.values.len() == values.len() {
                return Ok(Response::Ok { value: 0 });
            }
            return Err(err(
                ErrorCode::ShapeMismatch,
                None,
                c.values.len() as u64,
                format!(
                    "{chunk} exists with {} elements and spec ({}, {}, {}); init gave {} elements",
                    c.values.len(),
                    c.spec.consistency,
                    c.spec.updater,
                    c.spec.codec,
                    values.len()
                ),
            ));
        }
        self.check_new_chunk(&st, chunk, values.len())?;
        if !values.len().is_multiple_of(spec.row_len as usize) {
            return Err(invalid(format!(
                "{chunk}: {} elements are not whole rows of {}",
                values.len(),
                spec.row_len
            )));
        }
        let req = Request::Init {
            chunk,
            spec,
            values,
        };
        self.log_request(&mut st, &req)?;
        let Request::Init { spec, values, .. } = req else {
            unreachable!("built above")
        };
        let c = self.new_chunk(spec, values);
        st.chunks.insert(chunk, c);
        Ok(Response::Ok { value: 1 })
    }
}
