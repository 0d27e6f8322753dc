//! Pre-encoded all-reduce submissions ([`Engine::all_reduce_encoded`]): a rank that encoded
//! a registered tensor itself (on a GPU, with a codec built from [`Engine::codec_context`])
//! hands the engine the payload instead of the dense data, and the engine does the rest
//! (negotiation, fusion, the collective, decoding, the mean) as for dense data.
//!
//! This file owns which tensors take payloads ([`Table`]: the gather and sparse strategies,
//! per tensor, without shared scalars or momentum correction), the checks a payload passes
//! before it is queued (header, then the whole body, so that a bad payload fails its own
//! handle and never reaches a round), and what it becomes in the queue ([`Encoded`]: the
//! payload itself under gather, the codec's exact (index, value) pairs under sparse, read
//! back by [`pairs`]).

mod pairs;

#[cfg(fuzzing)]
pub use pairs::fuzz_encoded_pairs;

use std::sync::Mutex;

use gradwire_codec::{BuildContext, Codec, CodecConfig, Header, SparseGrad};

use crate::config::{EngineConfig, Policy, Strategy};
use crate::error::{EncodedRefusal, Error};
use crate::handle::Handle;
use crate::worker::{lock, selection_units, tensor_context};
use crate::Engine;

/// A pre-encoded submission's part that replaces the engine's own encode in the round.
pub(crate) enum Encoded {
    /// Under the gather strategy: the payload, all-gathered as the engine's would be.
    Payload(Vec<u8>),
    /// Under the sparse strategy: the pairs the codec's `encode_sparse` would have selected,
    /// summed by the sparse all-reduce.
    Pairs(SparseGrad),
}

/// One registered tensor, as [`Engine::all_reduce_encoded`] sees it.
struct Entry {
    /// The codec configuration and build context of the engine's codec for the tensor, or
    /// why the tensor takes no payloads.
    admits: Result<(CodecConfig, BuildContext), EncodedRefusal>,
    /// Whether the tensor runs under the sparse strategy (else gather).
    sparse: bool,
    /// Elements of the tensor.
    len: usize,
    /// A codec built as the engine's is, that only decodes (to check payloads; never
    /// encodes, so it has no state to keep in step): built on first use.
    checker: Mutex<Option<Box<dyn Codec>>>,
}

/// Per registered tensor (registration order), whether and how it takes payloads.
pub(crate) struct Table {
    entries: Vec<Entry>,
}

/// Why registered tensor `index` (policy `p`, of `units`' selection units) takes no
/// payloads, if it does not.
fn refusal(
    index: usize,
    p: &Policy,
    units: &[Vec<usize>],
    cfg: &EngineConfig,
) -> Option<EncodedRefusal> {
    if !matches!(p.strategy, Strategy::Gather | Strategy::Sparse) {
        return Some(EncodedRefusal::Strategy(p.strategy));
    }
    if units.iter().any(|u| u.contains(&index)) {
        return Some(EncodedRefusal::SelectionUnit);
    }
    if p.codec.needs_shared_scalars() {
        return Some(EncodedRefusal::SharedScalars(p.codec.to_string()));
    }
    if cfg.momentum.is_some() {
        return Some(EncodedRefusal::Momentum);
    }
    if p.strategy == Strategy::Sparse && !p.codec.sparsifies() {
        return Some(EncodedRefusal::Unsupported(p.codec.to_string()));
    }
    None
}

impl Table {
    /// The table of an engine on `rank` of `world` with these policies and configuration.
    pub(crate) fn new(policies: &[Policy], cfg: &EngineConfig, rank: usize, world: usize) -> Table {
        let units = selection_units(policies);
        let entries = policies
            .iter()
            .enumerate()
            .map(|(i, p)| Entry {
                admits: match refusal(i, p, &units, cfg) {
                    Some(r) => Err(r),
                    None => Ok((p.codec.clone(), tensor_context(cfg.seed, i, rank, world, p))),
                },
                sparse: p.strategy == Strategy::Sparse,
                len: p.tensor.len(),
                checker: Mutex::new(None),
            })
            .collect();
        Table { entries }
    }

    /// Checks `payload` for registered tensor `id` and turns it into what the round uses,
    /// with the result's buffer (zeros of the tensor's length). Nothing beyond that buffer
    /// and the pairs (at most one per element) is allocated, and only once the header has
    /// named this tensor's codec and length.
    fn admit(&self, id: usize, payload: Vec<u8>) -> Result<(Vec<f32>, Encoded), EncodedRefusal> {
        let e = &self.entries[id];
        let (cfg, ctx) = e.admits.as_ref().map_err(Clone::clone)?;
        Header::check(&payload, cfg.id(), e.len).map_err(EncodedRefusal::Payload)?;
        let mut data = vec![0.0f32; e.len];
        let mut checker = lock(&e.checker);
        let checker = checker.get_or_insert_with(|| cfg.build(ctx));
        if e.sparse {
            let pairs = pairs::read_pairs(&mut **checker, &payload, e.len)?;
            Ok((data, Encoded::Pairs(pairs)))
        } else {
            // The whole body, as every rank's decoder will read it in the round.
            checker
                .decode_add(&payload, &mut data)
                .map_err(EncodedRefusal::Payload)?;
            data.fill(0.0);
            Ok((data, Encoded::Payload(payload)))
        }
    }
}

impl Engine {
    /// How the engine builds the codec of registered tensor `name`: its codec configuration
    /// and the `BuildContext` (seed, rank, world, layout, tensor infos) the engine's own codec
    /// for it is built with, so that a codec built elsewhere (on a GPU) with these writes the
    /// bytes the engine's would. `None` for a name that is not registered or whose policy
    /// cannot take encoded payloads (see [`Engine::all_reduce_encoded`]).
    pub fn codec_context(&self, name: &str) -> Option<(CodecConfig, BuildContext)> {
        let &id = self.registered.get(name)?;
        self.encoded.entries[id].admits.as_ref().ok().cloned()
    }

    /// Mean over ranks of registered tensor `name`, whose payload this rank encoded itself
    /// (with a codec built from [`Engine::codec_context`]). The handle's result is the mean,
    /// of the tensor's length, exactly as [`Engine::all_reduce`]'s would be had the engine
    /// encoded the same payload; it goes through negotiation and fusion with the other ready
    /// tensors of its kind like any submission. Other ranks may submit dense data
    /// ([`Engine::all_reduce`]) or payloads for the same tensor: each rank chooses per
    /// submission.
    ///
    /// Taken for registered tensors under the `gather` and `sparse` strategies, per tensor:
    /// not a selection unit (`topk:scope=global` over several tensors selects over all of
    /// them at once), not a codec that agrees on scalars in the round before it encodes
    /// (TernGrad's shared max), and not with [`EngineConfig::momentum`] on (the correction
    /// runs on the dense data before the encode). Under `sparse` the payload is read back as
    /// the exact (index, value) pairs the codec's `encode_sparse` selects, by the codec's
    /// own reader (`SparseEncode::decode_pairs`: top-k, DGC, threshold and random-k; a codec
    /// without a sparse form is refused with [`EncodedRefusal::Unsupported`]). Anything else,
    /// and a payload that is not the tensor's codec's for its length (header or body,
    /// checked whole before it is queued), fails the handle at once with
    /// [`Error::EncodedRefused`] naming the tensor and the reason ([`EncodedRefusal`]);
    /// nothing is queued and the engine stays usable. A payload that passes is one every
    /// rank's decoder reads, so no round fails on it. A refused submission is one this rank
    /// has not made: the other ranks wait for it as for any tensor this rank has not
    /// submitted (resubmit, with a payload or with [`Engine::all_reduce`]; otherwise the
    /// stall inspector and the shutdown name this rank as missing).
    ///
    /// The codec's state lives in the caller's codec: the engine's own codec for the tensor
    /// does not encode this submission and does not advance (residuals, momenta, RNG
    /// positions stay where they were), so [`Engine::save_state`] / [`Engine::load_state`]
    /// do not carry the outside codec's state, and a rank that switches a tensor between
    /// payloads and dense data gets what the engine's codec, left behind, makes of it. Give
    /// the outside codec the progress given to [`Engine::set_progress`]
    /// (`Codec::set_progress`) before each encode, as the engine does with its own.
    pub fn all_reduce_encoded(&self, name: &str, payload: Vec<u8>) -> Handle {
        let admitted = match self.registered.get(name) {
            Some(&id) => self
                .encoded
                .admit(id, payload)
                .map(|(data, enc)| (id, data, enc)),
            None => Err(EncodedRefusal::NotRegistered),
        };
        match admitted {
            Ok((id, data, enc)) => {
                let target = Ok(self.targets[id].clone());
                self.submit_many(vec![(target, data, Some(enc))])
                    .pop()
                    .expect("one handle")
            }
            Err(reason) => Handle::failed(
                name.into(),
                Error::EncodedRefused {
                    tensor: name.into(),
                    reason,
                },
            ),
        }
    }
}
