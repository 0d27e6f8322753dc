//! [`KvStore`], a worker's handle on the parameter server: connecting (with the heartbeat
//! thread), declaring tables, and the public operations.

use std::collections::HashMap;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gradwire_codec::{BuildContext, Codec};

use super::conn::Conn;
use super::ClientConfig;
use crate::auth::Role;
use crate::placement::{ChunkPlace, Placement};
use crate::spec::{ChunkId, Key, PushCodec, PushMode, TableSpec};
use crate::twobit::TwoBit;
use crate::wire::{ErrorCode, Request, Response};
use crate::{Error, Result};

/// What a pull saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PullInfo {
    /// The smallest round (sync: rounds closed; async/SSP: updates applied) over the chunks.
    pub round: u64,
    /// SSP: the slowest worker's clock, smallest over the chunks.
    pub min_clock: u64,
    /// This worker's own clock on the table (its pushes so far).
    pub clock: u64,
}

pub(super) enum Enc {
    Dense,
    TwoBit(TwoBit),
    Codec(Box<dyn Codec>),
}

pub(super) struct Table {
    pub(super) spec: TableSpec,
    pub(super) len: usize,
    pub(super) places: Vec<ChunkPlace>,
    pub(super) encs: Vec<Enc>,
    /// One reusable frame buffer per chunk.
    pub(super) frames: Vec<Vec<u8>>,
    /// Sync: the round each chunk's next pull waits for.
    pub(super) wait_round: Vec<u64>,
    pub(super) pushes: u64,
}

/// A worker's handle on the parameter server (see the module doc).
pub struct KvStore {
    pub(super) cfg: ClientConfig,
    pub(super) conns: Vec<Conn>,
    pub(super) placement: Placement,
    pub(super) tables: HashMap<Key, Table>,
    pub(super) heartbeat: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    pub(super) scratch: Vec<u8>,
}

impl KvStore {
    /// Connects to every shard and registers this worker (fails if a shard is unreachable
    /// before the deadline, or this incarnation is fenced off).
    pub fn connect(cfg: ClientConfig) -> Result<KvStore> {
        let mut conns: Vec<Conn> = cfg
            .shards
            .iter()
            .enumerate()
            .map(|(i, a)| Conn::new(i, *a, &cfg))
            .collect();
        let deadline = Instant::now() + cfg.deadline;
        let mut frame = Vec::new();
        for c in conns.iter_mut() {
            Request::Heartbeat {
                worker: cfg.worker,
                incarnation: cfg.incarnation,
            }
            .encode(0, &mut frame);
            c.call(&mut frame, &cfg, deadline)?;
        }
        let heartbeat = cfg.heartbeat.map(|period| {
            let (tx, rx) = mpsc::channel::<()>();
            let hb_cfg = cfg.clone();
            let h = std::thread::spawn(move || {
                let mut conns: Vec<Conn> = hb_cfg
                    .shards
                    .iter()
                    .enumerate()
                    .map(|(i, a)| Conn::new(i, *a, &hb_cfg))
                    .collect();
                let mut frame = Vec::new();
                loop {
                    match rx.recv_timeout(period) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                    for c in conns.iter_mut() {
                        Request::Heartbeat {
                            worker: hb_cfg.worker,
                            incarnation: hb_cfg.incarnation,
                        }
                        .encode(0, &mut frame);
                        if c.attempt(&mut frame, &hb_cfg, period.max(Duration::from_millis(200)))
                            .is_err()
                        {
                            c.stream = None;
                        }
                    }
                }
            });
            (tx, h)
        });
        Ok(KvStore {
            placement: Placement::new(cfg.shards.len(), cfg.vnodes, cfg.chunk_elems, cfg.imbalance),
            conns,
            tables: HashMap::new(),
            heartbeat,
            scratch: Vec::new(),
            cfg,
        })
    }

    /// This client's configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// Where each chunk of `key` lives.
    pub fn chunks(&self, key: Key) -> Option<&[ChunkPlace]> {
        self.tables.get(&key).map(|t| &t.places[..])
    }

    /// Declares table `key` and initializes it with `values`. The coordinator's init
    /// creates the table (the first one wins); a worker's waits for the table to exist and
    /// is acknowledged when it matches. Every worker must make the same `init` calls in the
    /// same order: the placement depends on that sequence.
    pub fn init(&mut self, key: Key, spec: TableSpec, values: &[f32]) -> Result<()> {
        if let Some(t) = self.tables.get(&key) {
            if t.spec == spec && t.len == values.len() {
                return Ok(());
            }
        }
        let places = self
            .placement
            .plan(key.0, values.len(), spec.row_len as usize);
        let deadline = Instant::now() + self.cfg.deadline;
        let mut frame = Vec::new();
        for p in &places {
            Request::Init {
                chunk: ChunkId {
                    key,
                    index: p.index,
                },
                spec: spec.clone(),
                values: values[p.start..p.start + p.len].to_vec(),
            }
            .encode(0, &mut frame);
            // A worker's init waits for the coordinator's table (the shard answers
            // NotInitialized after its own wait; ask again until our deadline).
            loop {
                match self.conns[p.shard].call(&mut frame, &self.cfg, deadline) {
                    Err(Error::Remote {
                        code: ErrorCode::NotInitialized,
                        ..
                    }) if self.cfg.role == Role::Worker && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    r => {
                        r?;
                        break;
                    }
                }
            }
        }
        let encs = places
            .iter()
            .map(|p| match &spec.codec {
                PushCodec::Dense => Enc::Dense,
                PushCodec::TwoBit(c) => Enc::TwoBit(TwoBit::new(*c)),
                PushCodec::Codec(c) => Enc::Codec(c.build(&BuildContext {
                    seed: self.cfg.seed ^ key.0.rotate_left(17) ^ p.index as u64,
                    rank: self.cfg.worker.0 as usize,
                    world_size: self.cfg.shards.len().max(1),
                    layout: Vec::new(),
                    ..Default::default()
                })),
            })
            .collect();
        self.tables.insert(
            key,
            Table {
                wait_round: vec![0; places.len()],
                frames: vec![Vec::new(); places.len()],
                encs,
                places,
                len: values.len(),
                spec,
                pushes: 0,
            },
        );
        Ok(())
    }

    /// Pushes a gradient for `key` (the table's updater applies it).
    pub fn push(&mut self, key: Key, grad: &[f32]) -> Result<()> {
        self.run(key, Some((grad, PushMode::Grad)), None, None)
            .map(|_| ())
    }

    /// Pushes a precomputed update (`Add`) or value (`Assign`) for `key`.
    pub fn push_with(&mut self, key: Key, values: &[f32], mode: PushMode) -> Result<()> {
        self.run(key, Some((values, mode)), None, None).map(|_| ())
    }

    /// Reads `key` into `out` (sync: after the rounds this worker pushed to have closed;
    /// SSP: once the slowest worker is within the staleness bound).
    pub fn pull(&mut self, key: Key, out: &mut [f32]) -> Result<PullInfo> {
        self.run(key, None, Some(out), None)
    }

    /// Pushes a gradient and reads the updated values (one round trip per chunk).
    pub fn push_pull(&mut self, key: Key, grad: &[f32], out: &mut [f32]) -> Result<PullInfo> {
        self.run(key, Some((grad, PushMode::Grad)), Some(out), None)
    }

    /// [`KvStore::push_pull`] with a push mode.
    pub fn push_pull_with(
        &mut self,
        key: Key,
        values: &[f32],
        mode: PushMode,
        out: &mut [f32],
    ) -> Result<PullInfo> {
        self.run(key, Some((values, mode)), Some(out), None)
    }

    /// Row-sparse pull: reads rows `rows` (of the table's `row_len`) into `out`, in the
    /// order given (`out.len()` = `rows.len() × row_len`).
    pub fn pull_rows(&mut self, key: Key, rows: &[u32], out: &mut [f32]) -> Result<PullInfo> {
        self.run(key, None, Some(out), Some(rows))
    }

    /// Asks every shard to write a checkpoint now; returns their LSNs.
    pub fn checkpoint(&mut self) -> Result<Vec<u64>> {
        let deadline = Instant::now() + self.cfg.deadline;
        let mut frame = Vec::new();
        let mut out = Vec::new();
        for c in self.conns.iter_mut() {
            Request::Checkpoint.encode(0, &mut frame);
            match c.call(&mut frame, &self.cfg, deadline)? {
                Response::Ok { value } => out.push(value),
                _ => out.push(0),
            }
        }
        Ok(out)
    }

    /// A shard's counters.
    pub fn stats(&mut self, shard: usize) -> Result<crate::ShardStats> {
        let deadline = Instant::now() + self.cfg.deadline;
        let mut frame = Vec::new();
        Request::Stats.encode(0, &mut frame);
        match self.conns[shard].call(&mut frame, &self.cfg, deadline)? {
            Response::Stats(v) => Ok(crate::ShardStats::from_slice(&v)),
            _ => Ok(crate::ShardStats::default()),
        }
    }

    /// Sends a raw request to one shard (Sandblaster's vector ops, tools).
    pub fn call(&mut self, shard: usize, req: &Request) -> Result<Response> {
        let deadline = Instant::now() + self.cfg.deadline;
        let mut frame = Vec::new();
        req.encode(0, &mut frame);
        self.conns[shard].call(&mut frame, &self.cfg, deadline)
    }

    /// Frame bytes this client has written to and read from the shards so far (requests
    /// and replies on the data connections, headers and retries included; heartbeats,
    /// which use their own connections, excluded).
    pub fn bytes(&self) -> (u64, u64) {
        self.conns
            .iter()
            .fold((0, 0), |(s, r), c| (s + c.sent, r + c.received))
    }

    /// Number of shards.
    pub fn num_shards(&self) -> usize {
        self.conns.len()
    }

    /// Leaves for good: sync rounds and SSP reads stop waiting for this worker.
    pub fn leave(mut self) -> Result<()> {
        self.stop_heartbeat();
        let deadline = Instant::now() + self.cfg.deadline.min(Duration::from_secs(5));
        let mut frame = Vec::new();
        let mut first_err = None;
        for c in self.conns.iter_mut() {
            Request::Leave {
                worker: self.cfg.worker,
                incarnation: self.cfg.incarnation,
            }
            .encode(0, &mut frame);
            if let Err(e) = c.call(&mut frame, &self.cfg, deadline) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Drops the connections and stops heartbeats without leaving, as a crash would (for
    /// tests of dead-worker handling).
    pub fn abandon(mut self) {
        self.stop_heartbeat();
    }

    fn stop_heartbeat(&mut self) {
        if let Some((tx, h)) = self.heartbeat.take() {
            drop(tx);
            let _ = h.join();
        }
    }
}

impl Drop for KvStore {
    fn drop(&mut self) {
        self.stop_heartbeat();
    }
}
