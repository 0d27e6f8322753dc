//! The state a shard keeps under its lock: workers (dedup window, liveness), chunks
//! (values, optimizer state, open sync round, clocks) and Sandblaster scratch vectors.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use gradwire_codec::Codec;

use crate::durability::Wal;
use crate::spec::{ChunkId, TableSpec};
use crate::updater::OptState;

use super::*;

#[derive(Debug)]
pub(super) struct WorkerSlot {
    pub(super) incarnation: u64,
    pub(super) base: u64,
    pub(super) above: BTreeSet<u64>,
    pub(super) last_joined: HashMap<ChunkId, u64>,
    pub(super) last_seen: Instant,
    pub(super) left: bool,
}

impl WorkerSlot {
    pub(super) fn new(now: Instant) -> Self {
        WorkerSlot {
            incarnation: 0,
            base: 0,
            above: BTreeSet::new(),
            last_joined: HashMap::new(),
            last_seen: now,
            left: false,
        }
    }
    pub(super) fn seen(&self, seq: u64) -> bool {
        seq < self.base || self.above.contains(&seq)
    }
    pub(super) fn record(&mut self, seq: u64) {
        self.above.insert(seq);
        while self.above.remove(&self.base) {
            self.base += 1;
        }
    }
}

pub(super) struct Chunk {
    pub(super) spec: TableSpec,
    pub(super) values: Vec<f32>,
    pub(super) opt: OptState,
    pub(super) round: u64,
    pub(super) n_grad: u32,
    pub(super) pend_grad: Vec<f32>,
    pub(super) pend_add: Vec<f32>,
    pub(super) contributors: BTreeSet<u32>,
    pub(super) clocks: Vec<u64>,
    pub(super) decoder: Option<Box<dyn Codec>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Live {
    Alive,
    Left,
    Dead,
}

pub(super) struct State {
    pub(super) chunks: BTreeMap<ChunkId, Chunk>,
    pub(super) workers: Vec<WorkerSlot>,
    pub(super) vecs: HashMap<u64, BTreeMap<ChunkId, Vec<f32>>>,
    pub(super) lsn: u64,
    pub(super) wal: Option<Wal>,
    pub(super) stats: ShardStats,
    pub(super) frame: Vec<u8>,
}
