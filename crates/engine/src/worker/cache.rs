//! The response cache: the descriptor every rank agreed on for each cached tensor, under an
//! id that is the same on every rank, and the table of tensors some ranks have requested
//! and that are not cached yet. A registered tensor is cached at start under its
//! registration index ([`registered_descriptor`]); any other is checked (name, op, dtype,
//! shape, codec) the round the last rank requests it and cached under the next id, or
//! failed with [`Error::Mismatch`] on every rank ([`Worker::complete_adhoc`]).

use crate::config::{EngineConfig, Policy};
use crate::error::Error;
use crate::fusion::{Kind, TensorState};
use crate::wire::{Descriptor, OpKind};

use super::Worker;

/// A cached tensor: the descriptor every rank agreed on.
pub(super) struct Entry {
    pub(super) desc: Descriptor,
    pub(super) len: usize,
}

/// A tensor requested by some ranks and not cached yet (identical table on every rank).
pub(super) struct Adhoc {
    pub(super) name: String,
    pub(super) by_rank: Vec<Option<(u64, Descriptor)>>,
}

/// The canonical policy string of a registered tensor (compared across ranks).
pub(crate) fn policy_string(p: &Policy, cfg: &EngineConfig) -> String {
    let mut s = format!("{}@{}", p.codec, p.strategy);
    // The role reaches the codecs (TernGrad's output layer, DGC's 1-D tensors): compared too.
    s.push_str(&format!(" role={:?}", p.tensor.role).to_ascii_lowercase());
    if let Some(m) = &cfg.momentum {
        s.push_str(&format!(
            "+momentum({},{},{})",
            m.beta, m.nesterov, m.masking
        ));
    }
    s
}

/// Descriptor of a registered tensor.
pub(crate) fn registered_descriptor(p: &Policy, cfg: &EngineConfig) -> Descriptor {
    Descriptor {
        name: p.tensor.name.clone(),
        op: OpKind::AllReduce,
        dtype: 0,
        root: 0,
        shape: p.tensor.shape.iter().map(|&d| d as u64).collect(),
        policy: policy_string(p, cfg),
    }
}

/// The policy string of an unregistered all-reduce (dense, no momentum).
pub(crate) const ADHOC_POLICY: &str = "none@dense";

impl Worker {
    pub(super) fn push_entry(&mut self, desc: Descriptor, state: TensorState) -> usize {
        let id = self.entries.len();
        let len = desc.shape.iter().product::<u64>() as usize;
        self.by_name.insert(desc.name.clone(), id);
        self.entries.push(Entry { desc, len });
        self.states.push(state);
        self.ready_at.push(vec![0; self.world]);
        id
    }

    /// Checks and caches the uncached tensors every rank has now requested.
    pub(super) fn complete_adhoc(&mut self, ready: &mut Vec<usize>) {
        let mut i = 0;
        while i < self.adhoc.len() {
            if self.adhoc[i].by_rank.iter().any(Option::is_none) {
                i += 1;
                continue;
            }
            let a = self.adhoc.remove(i);
            let entries: Vec<(u64, Descriptor)> = a.by_rank.into_iter().flatten().collect();
            let reference = &entries[0].1;
            let mut bad = Vec::new();
            let mut first = None;
            for (r, (_, d)) in entries.iter().enumerate().skip(1) {
                if let Some(diff) = reference.diff(d) {
                    bad.push(r);
                    first.get_or_insert((r, diff));
                }
            }
            if let Some((r, (field, a0, ar))) = first {
                let e = Error::Mismatch {
                    tensor: a.name.clone(),
                    field,
                    reference: 0,
                    ranks: bad,
                    detail: format!("rank 0: {a0}, rank {r}: {ar}"),
                };
                tracing::error!("{e}");
                if let Some(s) = self.pending.take_new(&a.name) {
                    s.slot.complete(Err(e));
                }
                continue;
            }
            let desc = reference.clone();
            let kind = match desc.op {
                OpKind::AllReduce => Kind::Dense,
                OpKind::AllGather => Kind::AllGather,
                OpKind::Broadcast => Kind::Broadcast(desc.root as usize),
                OpKind::Barrier => Kind::Barrier,
            };
            let id = self.push_entry(
                desc,
                TensorState {
                    kind,
                    codec: None,
                    quantized: None,
                    stripe: None,
                    powersgd: None,
                    velocity: None,
                },
            );
            for (r, (t, _)) in entries.iter().enumerate() {
                self.ready_at[id][r] = *t;
            }
            if let Some(s) = self.pending.take_new(&a.name) {
                self.pending.insert_id(id, s);
            }
            ready.push(id);
        }
    }
}
