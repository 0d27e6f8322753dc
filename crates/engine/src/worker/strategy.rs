//! Each registered tensor's state from its policy: which strategy's all-reduce carries it
//! (dense, gather, sparse, stripe, PowerSGD, quantized ring) and the codecs that strategy
//! runs, built with the tensor's seed; and the selection units (one codec over all tensors
//! of a global top-k policy, [`selection_units`]).

use gradwire_codec::{BuildContext, CodecConfig, TensorInfo, TopKScope};
use gradwire_collective::compressed::{
    Leg, PowerSgdAllReduce, QuantizedAllReduce, StripeAllReduce,
};

use crate::config::{tensor_seed, Policy, Strategy};
use crate::fusion::{Kind, TensorState};

use super::Worker;

/// The shape of a quantized ring chunk `r` of tensor `t`, when it is whole rows of it (a
/// piece of a 1-D tensor is a 1-D tensor of the same role); `None` (element counts only)
/// when the chunk cuts through rows.
pub(crate) fn chunk_info(t: &TensorInfo, r: &std::ops::Range<usize>) -> Option<TensorInfo> {
    if r.is_empty() {
        return None;
    }
    if !t.is_matrix() {
        return Some(TensorInfo::new([r.len()], t.role));
    }
    let col = t.column_len();
    (r.start.is_multiple_of(col) && r.len().is_multiple_of(col)).then(|| t.rows(r.len() / col))
}

/// The selection units of `policies`: the tensors of each global-scope top-k policy (same
/// codec and strategy, sparse all-reduce or gather) when it covers at least two tensors,
/// as registration indices, in order of first appearance. Aji & Heafield's one threshold
/// over the whole gradient: each unit has one codec whose layout is all of its tensors.
pub(crate) fn selection_units(policies: &[Policy]) -> Vec<Vec<usize>> {
    let mut units: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, p) in policies.iter().enumerate() {
        let global = matches!(&p.codec, CodecConfig::TopK(c) if c.scope == TopKScope::Global);
        if !global || !matches!(p.strategy, Strategy::Sparse | Strategy::Gather) {
            continue;
        }
        let key = format!("{}@{}", p.codec, p.strategy);
        match units.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ids)) => ids.push(i),
            None => units.push((key, vec![i])),
        }
    }
    units
        .into_iter()
        .map(|(_, ids)| ids)
        .filter(|ids| ids.len() > 1)
        .collect()
}

/// The context registered tensor `index` (policy `p`) builds its codec with on `rank` of
/// `world`, for an engine seeded `seed`: the tensor's seed, its length as the layout, its
/// shape and role. The gather and sparse strategies build their codec with it, and
/// [`crate::Engine::codec_context`] hands it out.
pub(crate) fn tensor_context(
    seed: u64,
    index: usize,
    rank: usize,
    world: usize,
    p: &Policy,
) -> BuildContext {
    let seed = tensor_seed(seed, index);
    BuildContext::new(seed, rank, world, vec![p.tensor.len()]).with_tensors(vec![p.tensor.info()])
}

impl Worker {
    pub(super) fn build_state(&self, index: usize, p: &Policy) -> TensorState {
        let len = p.tensor.len();
        let (rank, world) = (self.rank, self.world);
        let seed = tensor_seed(self.cfg.seed, index);
        let info = p.tensor.info();
        let ctx = tensor_context(self.cfg.seed, index, rank, world, p);
        let mut state = TensorState {
            kind: Kind::Dense,
            codec: None,
            quantized: None,
            stripe: None,
            powersgd: None,
            velocity: self.cfg.momentum.map(|_| vec![0.0; len]),
        };
        match p.strategy {
            Strategy::Dense | Strategy::Auto => {}
            Strategy::Gather => {
                state.kind = Kind::Gather;
                state.codec = Some(p.codec.build(&ctx));
            }
            Strategy::Sparse => {
                state.kind = Kind::Sparse;
                state.codec = Some(p.codec.build(&ctx));
            }
            Strategy::Stripe => {
                state.kind = Kind::Stripe;
                state.stripe = Some(StripeAllReduce::new(&p.codec, &ctx, len));
            }
            Strategy::PowerSgd => {
                let CodecConfig::PowerSgd(c) = &p.codec else {
                    unreachable!("plan() admits only the powersgd codec under powersgd")
                };
                state.kind = Kind::PowerSgd;
                state.powersgd = Some(PowerSgdAllReduce::new(c, &ctx, len));
            }
            Strategy::Quantized => {
                let codec = p.codec.clone();
                let q = QuantizedAllReduce::new(len, rank, world, |leg, chunk| {
                    let r = gradwire_collective::chunks::range(len, world, chunk);
                    let leg_no: u64 = match leg {
                        Leg::ReduceScatter => 0,
                        Leg::AllGather => 1,
                    };
                    let c = BuildContext::new(
                        seed ^ ((leg_no + 1) << 40) ^ ((chunk as u64) << 20),
                        rank,
                        world,
                        vec![r.len()],
                    );
                    codec.build(&match chunk_info(&info, &r) {
                        Some(t) => c.with_tensors(vec![t]),
                        None => c,
                    })
                });
                state.kind = Kind::Quantized;
                state.quantized = Some(q);
            }
        }
        state
    }

    /// The state of tensor `index`, a member of selection unit `unit`: its own velocity; the
    /// unit's first tensor also holds the unit's codec, built with that tensor's seed and the
    /// layout of every tensor of the unit (one top-k over their concatenation).
    pub(super) fn build_unit_state(
        &self,
        unit: usize,
        index: usize,
        policies: &[Policy],
    ) -> TensorState {
        let ids = &self.units[unit];
        let p = &policies[index];
        let codec = (ids[0] == index).then(|| {
            let layout = ids.iter().map(|&i| policies[i].tensor.len()).collect();
            let infos = ids.iter().map(|&i| policies[i].tensor.info()).collect();
            let seed = tensor_seed(self.cfg.seed, index);
            let ctx = BuildContext::new(seed, self.rank, self.world, layout).with_tensors(infos);
            p.codec.build(&ctx)
        });
        TensorState {
            kind: match p.strategy {
                Strategy::Sparse => Kind::SparseUnit(unit),
                _ => Kind::GatherUnit(unit),
            },
            codec,
            quantized: None,
            stripe: None,
            powersgd: None,
            velocity: self.cfg.momentum.map(|_| vec![0.0; p.tensor.len()]),
        }
    }
}
