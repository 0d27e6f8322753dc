//! One server shard: the chunks it owns, their updater state, consistency bookkeeping,
//! exactly-once dedup, checkpoints and the write-ahead log. Sans-IO: [`Shard::handle`] takes
//! a decoded request and returns the response, blocking (with a deadline) where the
//! consistency mode says a request must wait. The TCP server in `server.rs` calls it from
//! one thread per connection.
//!
//! Exactly-once: each worker's pushes to a shard carry `seq`; the shard keeps, per worker
//! and incarnation, `base` (every seq below it was applied) and the applied seqs in
//! `[base, base + window)`. A repeat is acknowledged without being applied; a seq beyond
//! the window is refused (`WindowExceeded`); an older incarnation is refused (`Fenced`).
//! The dedup state is part of the checkpoint and the WAL replay, so it survives restarts.
//!
//! Sync rounds count distinct workers: a second push by a worker already in the open round
//! waits for the next round (it is never double-counted). A round closes when every worker
//! that has not left has pushed; a dead one (no message for `heartbeat_timeout`) makes the
//! waiters fail with `WorkerLost` naming it (strict) or is left out (shrink).
//!
//! WAL records (after the lsn u64): kind 1 = an applied request (Hello, Leave, Init, Push)
//! as a full encoded frame; kind 2 = a sync round closed, chunk (key u64, index u32).
//! Replaying them on top of the last checkpoint rebuilds the exact state.
//!
//! Checkpoint body: lsn u64, workers u32, per worker (incarnation u64, base u64, left u8,
//! n u32 + n applied seqs u64, n u32 + n × (chunk, round u64)); chunks u32, per chunk (in
//! id order): Init frame (u32 length + frame), step u64, f32s a, f32s b, round u64,
//! n_grad u32, f32s pend_grad, f32s pend_add, n u32 + n contributor ids u32, n u32 + n
//! clocks u64.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gradwire_codec::{BuildContext, Codec};

use crate::durability::{read_checkpoint, write_checkpoint, Wal};
use crate::spec::{ChunkId, Consistency, DeadPolicy, PushCodec, PushMode, TableSpec, WorkerId};
use crate::twobit::TwoBit;
use crate::updater::{apply, OptState};
use crate::wire::{
    read_f32s, Cursor, Encoding, ErrorCode, FrameHeader, Push, RemoteError, Request, Response,
    VecOp, WireError, HEADER_LEN,
};

/// Settings of one shard.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// This shard's index.
    pub shard_id: u32,
    /// Workers `0..num_workers` may connect.
    pub num_workers: u32,
    /// A worker silent for this long is dead.
    pub heartbeat_timeout: Duration,
    /// The longest any request waits on the server (sync round, SSP bound).
    pub max_wait: Duration,
    /// Dedup window per worker (sequence numbers).
    pub dedup_window: u64,
    /// Directory for checkpoints and the WAL (`None`: memory only).
    pub dir: Option<PathBuf>,
    /// Keep a write-ahead log in `dir`, acknowledging a push only once it is durable.
    pub wal: bool,
    /// fsync each WAL append (turn off only to measure its cost).
    pub wal_sync: bool,
    /// Largest frame body accepted.
    pub max_body: usize,
    /// Seed given to codec decoders.
    pub seed: u64,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig {
            shard_id: 0,
            num_workers: 1,
            heartbeat_timeout: Duration::from_secs(10),
            max_wait: Duration::from_secs(30),
            dedup_window: 4096,
            dir: None,
            wal: false,
            wal_sync: true,
            max_body: crate::wire::DEFAULT_MAX_BODY,
            seed: 0,
        }
    }
}

/// A shard's counters (Stats response order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Pushes applied (or joined to a round).
    pub applied: u64,
    /// Repeated pushes acknowledged without applying.
    pub duplicates: u64,
    /// Sync rounds closed.
    pub rounds: u64,
    /// Malformed frames (connection dropped).
    pub rejected_frames: u64,
    /// Well-formed requests answered with an error.
    pub request_errors: u64,
    /// WAL records appended.
    pub wal_records: u64,
    /// WAL records replayed at open.
    pub replayed: u64,
    /// Pushes refused because their incarnation was fenced.
    pub fenced: u64,
}

impl ShardStats {
    /// As the Stats response's counter list.
    pub fn to_vec(&self) -> Vec<u64> {
        vec![
            self.applied,
            self.duplicates,
            self.rounds,
            self.rejected_frames,
            self.request_errors,
            self.wal_records,
            self.replayed,
            self.fenced,
        ]
    }

    /// From a Stats response's counter list (missing counters are 0).
    pub fn from_slice(v: &[u64]) -> Self {
        let g = |i: usize| v.get(i).copied().unwrap_or(0);
        ShardStats {
            applied: g(0),
            duplicates: g(1),
            rounds: g(2),
            rejected_frames: g(3),
            request_errors: g(4),
            wal_records: g(5),
            replayed: g(6),
            fenced: g(7),
        }
    }
}

#[derive(Debug)]
struct WorkerSlot {
    incarnation: u64,
    base: u64,
    above: BTreeSet<u64>,
    last_joined: HashMap<ChunkId, u64>,
    last_seen: Instant,
    left: bool,
}

impl WorkerSlot {
    fn new(now: Instant) -> Self {
        WorkerSlot {
            incarnation: 0,
            base: 0,
            above: BTreeSet::new(),
            last_joined: HashMap::new(),
            last_seen: now,
            left: false,
        }
    }
    fn seen(&self, seq: u64) -> bool {
        seq < self.base || self.above.contains(&seq)
    }
    fn record(&mut self, seq: u64) {
        self.above.insert(seq);
        while self.above.remove(&self.base) {
            self.base += 1;
        }
    }
}

struct Chunk {
    spec: TableSpec,
    values: Vec<f32>,
    opt: OptState,
    round: u64,
    n_grad: u32,
    pend_grad: Vec<f32>,
    pend_add: Vec<f32>,
    contributors: BTreeSet<u32>,
    clocks: Vec<u64>,
    decoder: Option<Box<dyn Codec>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Live {
    Alive,
    Left,
    Dead,
}

struct State {
    chunks: BTreeMap<ChunkId, Chunk>,
    workers: Vec<WorkerSlot>,
    vecs: HashMap<u64, BTreeMap<ChunkId, Vec<f32>>>,
    lsn: u64,
    wal: Option<Wal>,
    stats: ShardStats,
    frame: Vec<u8>,
}

/// A handled request: a response to encode, or one already encoded into the caller's frame.
enum Out {
    Resp(Response),
    Encoded,
}

/// One parameter-server shard (see the module doc).
pub struct Shard {
    cfg: ShardConfig,
    state: Mutex<State>,
    cv: Condvar,
}

type Rejection = Box<RemoteError>;

fn err(code: ErrorCode, worker: Option<u32>, value: u64, message: impl Into<String>) -> Rejection {
    Box::new(RemoteError {
        code,
        worker,
        value,
        message: message.into(),
    })
}

fn invalid(message: impl Into<String>) -> Rejection {
    err(ErrorCode::InvalidArgument, None, 0, message)
}

impl Shard {
    /// Opens a shard: loads the last checkpoint from `cfg.dir` and replays the WAL.
    pub fn open(cfg: ShardConfig) -> crate::Result<Shard> {
        let now = Instant::now();
        let mut st = State {
            chunks: BTreeMap::new(),
            workers: (0..cfg.num_workers).map(|_| WorkerSlot::new(now)).collect(),
            vecs: HashMap::new(),
            lsn: 0,
            wal: None,
            stats: ShardStats::default(),
            frame: Vec::new(),
        };
        let shard = Shard {
            cfg,
            state: Mutex::new(State {
                chunks: BTreeMap::new(),
                workers: Vec::new(),
                vecs: HashMap::new(),
                lsn: 0,
                wal: None,
                stats: ShardStats::default(),
                frame: Vec::new(),
            }),
            cv: Condvar::new(),
        };
        if let Some(dir) = &shard.cfg.dir {
            std::fs::create_dir_all(dir).map_err(crate::Error::Durability)?;
            if let Some(body) =
                read_checkpoint(&shard.ckpt_path()).map_err(crate::Error::Durability)?
            {
                shard
                    .restore(&mut st, &body, now)
                    .map_err(crate::Error::CorruptCheckpoint)?;
            }
            if shard.cfg.wal {
                let path = dir.join(format!("shard-{}.wal", shard.cfg.shard_id));
                let (wal, records) = Wal::open(&path, shard.cfg.wal_sync, shard.cfg.max_body + 64)
                    .map_err(crate::Error::Durability)?;
                for r in &records {
                    shard.replay(&mut st, r, now);
                }
                st.wal = Some(wal);
            }
        }
        *shard.state.lock().expect("shard lock") = st;
        Ok(shard)
    }

    /// The configuration.
    pub fn config(&self) -> &ShardConfig {
        &self.cfg
    }

    fn ckpt_path(&self) -> PathBuf {
        self.cfg
            .dir
            .clone()
            .unwrap_or_default()
            .join(format!("shard-{}.ckpt", self.cfg.shard_id))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug; keep serving the state anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The counters.
    pub fn stats(&self) -> ShardStats {
        self.lock().stats
    }

    /// Counts a malformed frame (called by the server before dropping the connection).
    pub fn note_rejected_frame(&self) {
        self.lock().stats.rejected_frames += 1;
    }

    /// Wakes every waiter (so it re-checks liveness).
    pub fn tick(&self) {
        self.cv.notify_all();
    }

    /// Handles one request, waiting at most `max_wait` where the consistency mode says so.
    pub fn handle(&self, req: Request) -> Response {
        match self.dispatch(req, None) {
            Out::Resp(r) => r,
            Out::Encoded => unreachable!("no frame buffer was given"),
        }
    }

    /// Like [`Shard::handle`], but writes the response frame (request id `rid`) into `out`;
    /// values are encoded straight from the chunk, without an intermediate copy.
    pub fn handle_into(&self, req: Request, rid: u64, out: &mut Vec<u8>) {
        if let Out::Resp(r) = self.dispatch(req, Some((rid, &mut *out))) {
            r.encode(rid, out);
        }
    }

    fn dispatch(&self, req: Request, frame: Option<(u64, &mut Vec<u8>)>) -> Out {
        let deadline = Instant::now() + self.cfg.max_wait;
        let r = match req {
            Request::Hello {
                worker,
                incarnation,
            } => {
                let mut st = self.lock();
                self.touch(&mut st, worker, Some(incarnation), true)
                    .map(|_| {
                        Out::Resp(Response::Ok {
                            value: self.cfg.shard_id as u64,
                        })
                    })
            }
            Request::Heartbeat {
                worker,
                incarnation,
            } => {
                let mut st = self.lock();
                self.touch(&mut st, worker, Some(incarnation), false)
                    .map(|_| Out::Resp(Response::Ok { value: 0 }))
            }
            Request::Leave {
                worker,
                incarnation,
            } => {
                let mut st = self.lock();
                self.touch(&mut st, worker, Some(incarnation), false)
                    .and_then(|_| {
                        let req = Request::Leave {
                            worker,
                            incarnation,
                        };
                        self.log_request(&mut st, &req)?;
                        st.workers[worker.0 as usize].left = true;
                        self.cv.notify_all();
                        Ok(Out::Resp(Response::Ok { value: 0 }))
                    })
            }
            Request::Init {
                chunk,
                spec,
                values,
            } => self.init(chunk, spec, values).map(Out::Resp),
            Request::Push(p) => self
                .push(p, deadline)
                .map(|(round, _)| Out::Resp(Response::Ok { value: round })),
            Request::PushPull(p) => {
                let worker = p.worker;
                let chunk = p.chunk;
                let sync = matches!(self.spec_of(chunk), Some(Consistency::Sync));
                self.push(p, deadline).and_then(|(round, st)| {
                    drop(st);
                    let clock = if sync { round + 1 } else { 0 };
                    self.pull(worker, chunk, clock, None, deadline, frame)
                })
            }
            Request::Pull {
                worker,
                chunk,
                clock,
                rows,
            } => self.pull(worker, chunk, clock, rows, deadline, frame),
            Request::Checkpoint => self
                .checkpoint()
                .map(|lsn| Out::Resp(Response::Ok { value: lsn })),
            Request::Stats => Ok(Out::Resp(Response::Stats(self.stats().to_vec()))),
            Request::VecOp(op) => self.vec_op(op).map(Out::Resp),
            Request::SetVec {
                slot,
                chunk,
                values,
            } => self.set_vec(slot, chunk, values).map(Out::Resp),
        };
        match r {
            Ok(out) => out,
            Err(e) => {
                let mut st = self.lock();
                st.stats.request_errors += 1;
                if e.code == ErrorCode::Fenced {
                    st.stats.fenced += 1;
                }
                Out::Resp(Response::Error(*e))
            }
        }
    }

    fn spec_of(&self, chunk: ChunkId) -> Option<Consistency> {
        self.lock().chunks.get(&chunk).map(|c| c.spec.consistency)
    }

    /// Checks the worker id and incarnation, refreshes liveness, and (on a newer
    /// incarnation, or `hello`) registers it.
    fn touch(
        &self,
        st: &mut State,
        worker: WorkerId,
        incarnation: Option<u64>,
        hello: bool,
    ) -> Result<(), Rejection> {
        let w = worker.0;
        if w >= self.cfg.num_workers {
            return Err(err(
                ErrorCode::UnknownWorker,
                Some(w),
                self.cfg.num_workers as u64,
                format!(
                    "worker {w} is not below the shard's worker count {}",
                    self.cfg.num_workers
                ),
            ));
        }
        let slot = &mut st.workers[w as usize];
        let Some(inc) = incarnation else {
            slot.last_seen = Instant::now();
            return Ok(());
        };
        if inc < slot.incarnation {
            return Err(err(
                ErrorCode::Fenced,
                Some(w),
                slot.incarnation,
                format!(
                    "worker {w} incarnation {inc} is fenced off (current {})",
                    slot.incarnation
                ),
            ));
        }
        // Only a current (or newer) incarnation keeps the worker alive: a fenced zombie's
        // heartbeats do not.
        slot.last_seen = Instant::now();
        if inc > slot.incarnation || (hello && slot.left) {
            let req = Request::Hello {
                worker,
                incarnation: inc,
            };
            self.log_request(st, &req)?;
            Self::apply_hello(st, w, inc);
        }
        Ok(())
    }

    fn apply_hello(st: &mut State, w: u32, inc: u64) {
        let slot = &mut st.workers[w as usize];
        if inc > slot.incarnation {
            slot.incarnation = inc;
            slot.base = 0;
            slot.above.clear();
        }
        slot.left = false;
    }

    fn log_request(&self, st: &mut State, req: &Request) -> Result<(), Rejection> {
        if st.wal.is_none() {
            return Ok(());
        }
        let mut frame = std::mem::take(&mut st.frame);
        req.encode(0, &mut frame);
        let r = self.log(st, 1, &frame);
        st.frame = frame;
        r
    }

    fn log(&self, st: &mut State, kind: u8, data: &[u8]) -> Result<(), Rejection> {
        let lsn = st.lsn + 1;
        if let Some(wal) = st.wal.as_mut() {
            let mut body = Vec::with_capacity(9 + data.len());
            body.extend_from_slice(&lsn.to_le_bytes());
            body.push(kind);
            body.extend_from_slice(data);
            wal.append(&body).map_err(|e| {
                err(
                    ErrorCode::Durability,
                    None,
                    lsn,
                    format!("WAL append failed: {e}"),
                )
            })?;
            st.stats.wal_records += 1;
        }
        st.lsn = lsn;
        Ok(())
    }

    fn new_chunk(&self, spec: TableSpec, values: Vec<f32>) -> Chunk {
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

    fn init(
        &self,
        chunk: ChunkId,
        spec: TableSpec,
        values: Vec<f32>,
    ) -> Result<Response, Rejection> {
        let mut st = self.lock();
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

    /// Decodes a push's payload into a dense delta of the chunk's length.
    /// `pre`: the dense payload already decoded (outside the shard lock).
    fn decode_delta(c: &Chunk, p: &Push, pre: Option<Vec<f32>>) -> Result<Vec<f32>, Rejection> {
        let n = c.values.len();
        let delta = match p.encoding {
            Encoding::Dense => {
                if p.payload.len() != 4 * n {
                    return Err(err(
                        ErrorCode::ShapeMismatch,
                        None,
                        n as u64,
                        format!(
                            "{}: dense push of {} bytes for {n} elements",
                            p.chunk,
                            p.payload.len()
                        ),
                    ));
                }
                pre.unwrap_or_else(|| read_f32s(&p.payload))
            }
            Encoding::Codec => {
                let dec = c.decoder.as_ref().ok_or_else(|| {
                    invalid(format!(
                        "{}: codec payload for a table without a codec",
                        p.chunk
                    ))
                })?;
                let mut d = vec![0.0; n];
                dec.decode_add(&p.payload, &mut d)
                    .map_err(|e| invalid(format!("{}: {e}", p.chunk)))?;
                d
            }
            Encoding::TwoBit => {
                let mut d = vec![0.0; n];
                TwoBit::decode_add(&p.payload, &mut d)
                    .map_err(|e| invalid(format!("{}: {e}", p.chunk)))?;
                d
            }
        };
        if !delta.iter().all(|v| v.is_finite()) {
            return Err(invalid(format!("{}: non-finite values pushed", p.chunk)));
        }
        Ok(delta)
    }

    fn liveness(&self, st: &State, w: u32, now: Instant) -> Live {
        let s = &st.workers[w as usize];
        if s.left {
            Live::Left
        } else if now.saturating_duration_since(s.last_seen) > self.cfg.heartbeat_timeout {
            Live::Dead
        } else {
            Live::Alive
        }
    }

    /// Sync: whether the open round of `id` may close now.
    fn round_ready(&self, st: &State, id: ChunkId, now: Instant) -> Result<bool, Rejection> {
        let c = &st.chunks[&id];
        if c.contributors.is_empty() {
            return Ok(false);
        }
        let mut waiting = false;
        for w in 0..self.cfg.num_workers {
            if c.contributors.contains(&w) {
                continue;
            }
            match self.liveness(st, w, now) {
                Live::Left => {}
                Live::Dead if c.spec.dead_policy == DeadPolicy::Strict => {
                    return Err(err(
                        ErrorCode::WorkerLost,
                        Some(w),
                        c.round,
                        format!(
                            "worker {w} is dead; sync round {} of {id} cannot close",
                            c.round
                        ),
                    ))
                }
                Live::Dead => {}
                Live::Alive => waiting = true,
            }
        }
        Ok(!waiting)
    }

    /// Sync: closes the round of `id` if it may, logging the close first.
    fn try_close(&self, st: &mut State, id: ChunkId, now: Instant) -> Result<(), Rejection> {
        if self.round_ready(st, id, now)? {
            let mut data = Vec::with_capacity(12);
            data.extend_from_slice(&id.key.0.to_le_bytes());
            data.extend_from_slice(&id.index.to_le_bytes());
            self.log(st, 2, &data)?;
            Self::close(st, id);
            self.cv.notify_all();
        }
        Ok(())
    }

    fn close(st: &mut State, id: ChunkId) {
        let Some(c) = st.chunks.get_mut(&id) else {
            return;
        };
        if c.n_grad > 0 {
            let inv = 1.0 / c.n_grad as f32;
            for g in c.pend_grad.iter_mut() {
                *g *= inv;
            }
            apply(&c.spec.updater, &mut c.opt, &mut c.values, &c.pend_grad);
        }
        if !c.pend_add.is_empty() {
            for (v, a) in c.values.iter_mut().zip(&c.pend_add) {
                *v += a;
            }
        }
        c.n_grad = 0;
        c.pend_grad.clear();
        c.pend_add.clear();
        c.contributors.clear();
        c.round += 1;
        st.stats.rounds += 1;
    }

    /// Applies (async, SSP) or joins to the open round (sync) an accepted push.
    fn apply_push(st: &mut State, p: &Push, delta: Vec<f32>) -> u64 {
        let w = p.worker.0;
        st.stats.applied += 1;
        let c = st.chunks.get_mut(&p.chunk).expect("checked by caller");
        let round;
        if c.spec.consistency == Consistency::Sync {
            round = c.round;
            match p.mode {
                PushMode::Grad => {
                    if c.pend_grad.is_empty() {
                        c.pend_grad = delta;
                    } else {
                        for (a, d) in c.pend_grad.iter_mut().zip(&delta) {
                            *a += d;
                        }
                    }
                    c.n_grad += 1;
                }
                PushMode::Add | PushMode::Assign => {
                    if c.pend_add.is_empty() {
                        c.pend_add = delta;
                    } else {
                        for (a, d) in c.pend_add.iter_mut().zip(&delta) {
                            *a += d;
                        }
                    }
                }
            }
            c.contributors.insert(w);
        } else {
            match p.mode {
                PushMode::Grad => apply(&c.spec.updater, &mut c.opt, &mut c.values, &delta),
                PushMode::Add => {
                    for (v, d) in c.values.iter_mut().zip(&delta) {
                        *v += d;
                    }
                }
                PushMode::Assign => c.values.copy_from_slice(&delta),
            }
            c.round += 1;
            round = c.round;
        }
        if let Some(clk) = c.clocks.get_mut(w as usize) {
            *clk += 1;
        }
        let slot = &mut st.workers[w as usize];
        slot.record(p.seq);
        slot.last_joined.insert(p.chunk, round);
        round
    }

    fn push(&self, p: Push, deadline: Instant) -> Result<(u64, MutexGuard<'_, State>), Rejection> {
        // Decode a dense payload before taking the lock (other connections keep going).
        let pre = (p.encoding == Encoding::Dense).then(|| read_f32s(&p.payload));
        let mut st = self.lock();
        self.touch(&mut st, p.worker, Some(p.incarnation), false)?;
        let w = p.worker.0;
        let Some(c) = st.chunks.get(&p.chunk) else {
            return Err(err(
                ErrorCode::NotInitialized,
                None,
                0,
                format!("{} was never initialized on this shard", p.chunk),
            ));
        };
        let sync = c.spec.consistency == Consistency::Sync;
        if sync && p.mode == PushMode::Assign {
            return Err(invalid("assign pushes need an async or SSP table"));
        }
        let dup = |st: &State| {
            let slot = &st.workers[w as usize];
            slot.seen(p.seq).then(|| {
                slot.last_joined
                    .get(&p.chunk)
                    .copied()
                    .unwrap_or(st.chunks[&p.chunk].round)
            })
        };
        if let Some(r) = dup(&st) {
            st.stats.duplicates += 1;
            return Ok((r, st));
        }
        let slot = &st.workers[w as usize];
        if p.seq >= slot.base.saturating_add(self.cfg.dedup_window) {
            return Err(err(
                ErrorCode::WindowExceeded,
                Some(w),
                slot.base,
                format!(
                    "seq {} is beyond the dedup window (base {})",
                    p.seq, slot.base
                ),
            ));
        }
        let delta = Self::decode_delta(c, &p, pre)?;
        if sync {
            // A worker already in the open round waits for the next one.
            st = self.wait(
                st,
                deadline,
                |this, st, now| {
                    if !st.chunks[&p.chunk].contributors.contains(&w) {
                        return Ok(true);
                    }
                    this.try_close(st, p.chunk, now)?;
                    Ok(!st.chunks[&p.chunk].contributors.contains(&w))
                },
                |st| self.missing_sync(st, p.chunk),
            )?;
            if let Some(r) = dup(&st) {
                st.stats.duplicates += 1;
                return Ok((r, st));
            }
            // The incarnation may have moved on while we waited.
            self.touch(&mut st, p.worker, Some(p.incarnation), false)?;
        }
        let p = Push {
            payload: p.payload,
            ..p
        };
        self.log_request(&mut st, &Request::Push(p.clone()))?;
        let round = Self::apply_push(&mut st, &p, delta);
        if sync {
            self.try_close(&mut st, p.chunk, Instant::now())?;
        }
        self.cv.notify_all();
        Ok((round, st))
    }

    fn missing_sync(&self, st: &State, id: ChunkId) -> (Option<u32>, String) {
        let c = &st.chunks[&id];
        let missing: Vec<u32> = (0..self.cfg.num_workers)
            .filter(|w| !c.contributors.contains(w) && !st.workers[*w as usize].left)
            .collect();
        (
            missing.first().copied(),
            format!(
                "sync round {} of {id} still waits for workers {missing:?}",
                c.round
            ),
        )
    }

    /// SSP: whether worker `w` may read `id` now; the slowest considered clock.
    fn ssp_ready(
        &self,
        st: &State,
        id: ChunkId,
        w: u32,
        s: u64,
        now: Instant,
    ) -> Result<(bool, u64), Rejection> {
        let c = &st.chunks[&id];
        let mine = c.clocks[w as usize];
        let mut ready = true;
        let mut min = mine;
        for v in 0..self.cfg.num_workers {
            let live = self.liveness(st, v, now);
            if live == Live::Left
                || (live == Live::Dead && c.spec.dead_policy == DeadPolicy::Shrink)
            {
                continue;
            }
            let cv = c.clocks[v as usize];
            min = min.min(cv);
            if cv + s < mine {
                if live == Live::Dead {
                    return Err(err(
                        ErrorCode::WorkerLost,
                        Some(v),
                        cv,
                        format!("worker {v} is dead at clock {cv}; worker {w} at clock {mine} cannot read {id} within staleness {s}"),
                    ));
                }
                ready = false;
            }
        }
        Ok((ready, min))
    }

    fn pull(
        &self,
        worker: WorkerId,
        id: ChunkId,
        clock: u64,
        rows: Option<Vec<u32>>,
        deadline: Instant,
        frame: Option<(u64, &mut Vec<u8>)>,
    ) -> Result<Out, Rejection> {
        let mut st = self.lock();
        self.touch(&mut st, worker, None, false)?;
        let w = worker.0;
        let Some(c) = st.chunks.get(&id) else {
            return Err(err(
                ErrorCode::NotInitialized,
                None,
                0,
                format!("{id} was never initialized on this shard"),
            ));
        };
        let mut min_clock = 0;
        match c.spec.consistency {
            Consistency::Sync => {
                st = self.wait(
                    st,
                    deadline,
                    |this, st, now| {
                        if st.chunks[&id].round >= clock {
                            return Ok(true);
                        }
                        this.try_close(st, id, now)?;
                        Ok(st.chunks[&id].round >= clock)
                    },
                    |st| self.missing_sync(st, id),
                )?;
            }
            Consistency::Async => {
                min_clock = c.clocks.iter().copied().min().unwrap_or(0);
            }
            Consistency::Ssp { staleness } => {
                let s = staleness as u64;
                let mut seen_min = 0;
                st = self.wait(st, deadline, |this, st, now| {
                    let (ok, m) = this.ssp_ready(st, id, w, s, now)?;
                    seen_min = m;
                    Ok(ok)
                }, |st| {
                    let c = &st.chunks[&id];
                    let mine = c.clocks[w as usize];
                    let behind: Vec<u32> = (0..self.cfg.num_workers)
                        .filter(|v| c.clocks[*v as usize] + s < mine && !st.workers[*v as usize].left)
                        .collect();
                    (behind.first().copied(), format!("worker {w} at clock {mine} waits for workers {behind:?} (staleness {s})"))
                })?;
                min_clock = seen_min;
            }
        }
        let c = &st.chunks[&id];
        if let (None, Some((rid, out))) = (&rows, frame) {
            crate::wire::encode_values(c.round, min_clock, &c.values, rid, out);
            return Ok(Out::Encoded);
        }
        let values = match rows {
            None => c.values.clone(),
            Some(rows) => {
                let rl = c.spec.row_len as usize;
                let nrows = c.values.len() / rl;
                let mut out = Vec::with_capacity(rows.len().min(nrows) * rl);
                for r in rows {
                    let r = r as usize;
                    if r >= nrows {
                        return Err(invalid(format!(
                            "{id}: row {r} out of range ({nrows} rows)"
                        )));
                    }
                    out.extend_from_slice(&c.values[r * rl..(r + 1) * rl]);
                }
                out
            }
        };
        Ok(Out::Resp(Response::Values {
            round: c.round,
            min_clock,
            values,
        }))
    }

    /// Waits on the condvar until `ready` says so, the deadline passes (a `Timeout` naming
    /// what is missing), or `ready` fails.
    fn wait<'a, F, M>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        deadline: Instant,
        mut ready: F,
        missing: M,
    ) -> Result<MutexGuard<'a, State>, Rejection>
    where
        F: FnMut(&Self, &mut State, Instant) -> Result<bool, Rejection>,
        M: Fn(&State) -> (Option<u32>, String),
    {
        let tick = (self.cfg.heartbeat_timeout / 4)
            .clamp(Duration::from_millis(5), Duration::from_millis(250));
        loop {
            let now = Instant::now();
            if ready(self, &mut st, now)? {
                return Ok(st);
            }
            if now >= deadline {
                let (w, msg) = missing(&st);
                return Err(err(
                    ErrorCode::Timeout,
                    w,
                    self.cfg.max_wait.as_millis() as u64,
                    msg,
                ));
            }
            let d = (deadline - now).min(tick);
            st = self
                .cv
                .wait_timeout(st, d)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Writes a checkpoint (parameters, optimizer state, rounds, clocks, dedup state) and
    /// empties the WAL. Returns the checkpoint's lsn.
    pub fn checkpoint(&self) -> Result<u64, Rejection> {
        if self.cfg.dir.is_none() {
            return Err(invalid("this shard has no checkpoint directory"));
        }
        let mut st = self.lock();
        let body = self.snapshot(&st);
        write_checkpoint(&self.ckpt_path(), &body).map_err(|e| {
            err(
                ErrorCode::Durability,
                None,
                st.lsn,
                format!("checkpoint write failed: {e}"),
            )
        })?;
        if let Some(w) = st.wal.as_mut() {
            w.truncate().map_err(|e| {
                err(
                    ErrorCode::Durability,
                    None,
                    0,
                    format!("WAL truncate failed: {e}"),
                )
            })?;
        }
        Ok(st.lsn)
    }

    fn snapshot(&self, st: &State) -> Vec<u8> {
        let mut b = Vec::new();
        let put_f32s = |b: &mut Vec<u8>, v: &[f32]| {
            b.extend_from_slice(&(v.len() as u32).to_le_bytes());
            crate::wire::put_raw_f32s(b, v);
        };
        b.extend_from_slice(&st.lsn.to_le_bytes());
        b.extend_from_slice(&(st.workers.len() as u32).to_le_bytes());
        for s in &st.workers {
            b.extend_from_slice(&s.incarnation.to_le_bytes());
            b.extend_from_slice(&s.base.to_le_bytes());
            b.push(s.left as u8);
            b.extend_from_slice(&(s.above.len() as u32).to_le_bytes());
            for q in &s.above {
                b.extend_from_slice(&q.to_le_bytes());
            }
            let mut lj: Vec<_> = s.last_joined.iter().collect();
            lj.sort();
            b.extend_from_slice(&(lj.len() as u32).to_le_bytes());
            for (c, r) in lj {
                b.extend_from_slice(&c.key.0.to_le_bytes());
                b.extend_from_slice(&c.index.to_le_bytes());
                b.extend_from_slice(&r.to_le_bytes());
            }
        }
        b.extend_from_slice(&(st.chunks.len() as u32).to_le_bytes());
        let mut frame = Vec::new();
        for (id, c) in &st.chunks {
            Request::Init {
                chunk: *id,
                spec: c.spec.clone(),
                values: c.values.clone(),
            }
            .encode(0, &mut frame);
            b.extend_from_slice(&(frame.len() as u32).to_le_bytes());
            b.extend_from_slice(&frame);
            b.extend_from_slice(&c.opt.step.to_le_bytes());
            put_f32s(&mut b, &c.opt.a);
            put_f32s(&mut b, &c.opt.b);
            b.extend_from_slice(&c.round.to_le_bytes());
            b.extend_from_slice(&c.n_grad.to_le_bytes());
            put_f32s(&mut b, &c.pend_grad);
            put_f32s(&mut b, &c.pend_add);
            b.extend_from_slice(&(c.contributors.len() as u32).to_le_bytes());
            for w in &c.contributors {
                b.extend_from_slice(&w.to_le_bytes());
            }
            b.extend_from_slice(&(c.clocks.len() as u32).to_le_bytes());
            for k in &c.clocks {
                b.extend_from_slice(&k.to_le_bytes());
            }
        }
        b
    }

    fn restore(&self, st: &mut State, body: &[u8], now: Instant) -> Result<(), WireError> {
        let nw = self.cfg.num_workers as usize;
        let mut c = Cursor::new(body);
        st.lsn = c.u64()?;
        let workers = c.u32()? as usize;
        if workers != nw {
            return Err(WireError::BadField {
                field: "checkpoint worker count",
            });
        }
        for slot in st.workers.iter_mut() {
            *slot = WorkerSlot::new(now);
            slot.incarnation = c.u64()?;
            slot.base = c.u64()?;
            slot.left = c.u8()? != 0;
            let n = c.u32()? as usize;
            for _ in 0..n {
                slot.above.insert(c.u64()?);
            }
            let n = c.u32()? as usize;
            for _ in 0..n {
                let id = ChunkId {
                    key: crate::spec::Key(c.u64()?),
                    index: c.u32()?,
                };
                let r = c.u64()?;
                slot.last_joined.insert(id, r);
            }
        }
        let n = c.u32()? as usize;
        for _ in 0..n {
            let len = c.u32()? as usize;
            let frame = c.bytes(len, "init frame")?;
            let h = FrameHeader::decode(frame, usize::MAX)?;
            let Request::Init {
                chunk,
                spec,
                values,
            } = Request::decode(&h, &frame[HEADER_LEN.min(frame.len())..])?
            else {
                return Err(WireError::BadField {
                    field: "checkpoint chunk",
                });
            };
            let mut ch = self.new_chunk(spec, values);
            ch.opt.step = c.u64()?;
            ch.opt.a = c.f32s("opt a")?;
            ch.opt.b = c.f32s("opt b")?;
            ch.round = c.u64()?;
            ch.n_grad = c.u32()?;
            ch.pend_grad = c.f32s("pend_grad")?;
            ch.pend_add = c.f32s("pend_add")?;
            let n = ch.values.len();
            for v in [&ch.opt.a, &ch.opt.b, &ch.pend_grad, &ch.pend_add] {
                if !v.is_empty() && v.len() != n {
                    return Err(WireError::BadLength {
                        field: "checkpoint state vector",
                    });
                }
            }
            let k = c.u32()? as usize;
            for _ in 0..k {
                let w = c.u32()?;
                if w as usize >= nw {
                    return Err(WireError::BadField {
                        field: "contributor",
                    });
                }
                ch.contributors.insert(w);
            }
            let k = c.u32()? as usize;
            if k != nw {
                return Err(WireError::BadLength { field: "clocks" });
            }
            for clk in ch.clocks.iter_mut() {
                *clk = c.u64()?;
            }
            st.chunks.insert(chunk, ch);
        }
        c.finish()
    }

    /// Re-applies one WAL record (skipping those the checkpoint already holds).
    fn replay(&self, st: &mut State, record: &[u8], _now: Instant) {
        let r = (|| -> Result<(), WireError> {
            let mut c = Cursor::new(record);
            let lsn = c.u64()?;
            let kind = c.u8()?;
            if lsn <= st.lsn {
                return Ok(());
            }
            st.lsn = lsn;
            st.stats.replayed += 1;
            let rest = c.bytes(record.len() - 9, "record")?;
            match kind {
                1 => {
                    let h = FrameHeader::decode(rest, usize::MAX)?;
                    let req = Request::decode(&h, rest.get(HEADER_LEN..).unwrap_or(&[]))?;
                    match req {
                        Request::Hello {
                            worker,
                            incarnation,
                        } if worker.0 < self.cfg.num_workers => {
                            Self::apply_hello(st, worker.0, incarnation)
                        }
                        Request::Leave { worker, .. } if worker.0 < self.cfg.num_workers => {
                            st.workers[worker.0 as usize].left = true
                        }
                        Request::Init {
                            chunk,
                            spec,
                            values,
                        } => {
                            let ch = self.new_chunk(spec, values);
                            st.chunks.entry(chunk).or_insert(ch);
                        }
                        Request::Push(p) if p.worker.0 < self.cfg.num_workers => {
                            if let Some(c) = st.chunks.get(&p.chunk) {
                                if let Ok(delta) = Self::decode_delta(c, &p, None) {
                                    Self::apply_push(st, &p, delta);
                                }
                            }
                        }
                        _ => {
                            return Err(WireError::BadField {
                                field: "WAL request",
                            })
                        }
                    }
                }
                2 => {
                    let mut c = Cursor::new(rest);
                    let id = ChunkId {
                        key: crate::spec::Key(c.u64()?),
                        index: c.u32()?,
                    };
                    c.finish()?;
                    Self::close(st, id);
                }
                _ => return Err(WireError::BadField { field: "WAL kind" }),
            }
            Ok(())
        })();
        if let Err(e) = r {
            tracing::warn!(error = %e, "skipping a bad WAL record");
        }
    }

    fn slot_vecs(st: &State, slot: u64) -> Vec<(ChunkId, &[f32])> {
        if slot < 1 << 32 {
            st.chunks
                .iter()
                .filter(|(id, _)| id.key.0 == slot)
                .map(|(id, c)| (*id, &c.values[..]))
                .collect()
        } else {
            st.vecs
                .get(&slot)
                .map(|m| m.iter().map(|(id, v)| (*id, &v[..])).collect())
                .unwrap_or_default()
        }
    }

    fn vec_op(&self, op: VecOp) -> Result<Response, Rejection> {
        let mut st = self.lock();
        let get = |st: &State, slot: u64, id: ChunkId, n: usize| -> Result<Vec<f32>, Rejection> {
            Self::slot_vecs(st, slot)
                .into_iter()
                .find(|(i, _)| *i == id)
                .map(|(_, v)| v.to_vec())
                .filter(|v| v.len() == n)
                .ok_or_else(|| invalid(format!("slot {slot} has no {id} of {n} elements")))
        };
        match op {
            VecOp::Dot { a, b } => {
                let mut sum = 0f64;
                for (id, va) in Self::slot_vecs(&st, a) {
                    let vb = get(&st, b, id, va.len())?;
                    sum += va
                        .iter()
                        .zip(&vb)
                        .map(|(x, y)| *x as f64 * *y as f64)
                        .sum::<f64>();
                }
                Ok(Response::Ok {
                    value: sum.to_bits(),
                })
            }
            VecOp::Axpy { .. } | VecOp::Scale { .. } => {
                let (a, b, c, alpha, is_axpy) = match op {
                    VecOp::Axpy { a, b, c, alpha } => (a, b, c, alpha, true),
                    VecOp::Scale { a, c, alpha } => (a, 0, c, alpha, false),
                    VecOp::Dot { .. } => unreachable!("matched above"),
                };
                let srcs: Vec<(ChunkId, Vec<f32>)> = Self::slot_vecs(&st, a)
                    .into_iter()
                    .map(|(id, v)| (id, v.to_vec()))
                    .collect();
                let mut outs = Vec::with_capacity(srcs.len());
                for (id, va) in srcs {
                    let out: Vec<f32> = if is_axpy {
                        let vb = get(&st, b, id, va.len())?;
                        va.iter().zip(&vb).map(|(x, y)| x + alpha * y).collect()
                    } else {
                        va.iter().map(|x| alpha * x).collect()
                    };
                    outs.push((id, out));
                }
                for (id, out) in outs {
                    if c < 1 << 32 {
                        match st.chunks.get_mut(&id) {
                            Some(ch) if id.key.0 == c => ch.values = out,
                            _ => return Err(invalid(format!("table {c} has no {id}"))),
                        }
                    } else {
                        st.vecs.entry(c).or_default().insert(id, out);
                    }
                }
                Ok(Response::Ok { value: 0 })
            }
        }
    }

    fn set_vec(&self, slot: u64, chunk: ChunkId, values: Vec<f32>) -> Result<Response, Rejection> {
        if slot < 1 << 32 {
            return Err(invalid(
                "SetVec slots start at 2^32 (lower slots are tables)",
            ));
        }
        let mut st = self.lock();
        st.vecs.entry(slot).or_default().insert(chunk, values);
        Ok(Response::Ok { value: 0 })
    }
}

/// Decodes a checkpoint body into a throw-away shard state (for the fuzz target): never
/// panics, whatever the bytes.
pub fn check_checkpoint_body(num_workers: u32, body: &[u8]) -> Result<(), WireError> {
    let shard = Shard::open(ShardConfig {
        num_workers,
        ..ShardConfig::default()
    })
    .map_err(|_| WireError::BadField { field: "config" })?;
    let now = Instant::now();
    let mut st = shard.lock();
    let mut fresh = State {
        chunks: BTreeMap::new(),
        workers: (0..num_workers).map(|_| WorkerSlot::new(now)).collect(),
        vecs: HashMap::new(),
        lsn: 0,
        wal: None,
        stats: ShardStats::default(),
        frame: Vec::new(),
    };
    let r = shard.restore(&mut fresh, body, now);
    *st = fresh;
    r
}

/// Replays WAL bytes into a throw-away shard state (for the fuzz target).
pub fn check_wal_bytes(num_workers: u32, bytes: &[u8]) {
    let Ok(shard) = Shard::open(ShardConfig {
        num_workers,
        ..ShardConfig::default()
    }) else {
        return;
    };
    let (records, _) = crate::durability::decode_wal(bytes, 1 << 20);
    let now = Instant::now();
    let mut st = shard.lock();
    for r in records {
        shard.replay(&mut st, r, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Key;

    fn sample_checkpoint() -> Vec<u8> {
        let shard = Shard::open(ShardConfig {
            num_workers: 2,
            ..ShardConfig::default()
        })
        .unwrap();
        let chunk = ChunkId {
            key: Key(3),
            index: 0,
        };
        shard.handle(Request::Init {
            chunk,
            spec: TableSpec::new(Consistency::Sync, "adam:lr=0.1".parse().unwrap()),
            values: vec![1.0, 2.0],
        });
        shard.handle(Request::Push(Push {
            worker: WorkerId(1),
            incarnation: 3,
            seq: 0,
            chunk,
            clock: 0,
            mode: PushMode::Grad,
            encoding: Encoding::Dense,
            payload: [0.5f32, -0.5]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
        }));
        let st = shard.lock();
        shard.snapshot(&st)
    }

    #[test]
    fn dedup_state_stays_within_the_window() {
        let shard = Shard::open(ShardConfig {
            num_workers: 1,
            dedup_window: 64,
            ..ShardConfig::default()
        })
        .unwrap();
        let chunk = ChunkId {
            key: Key(1),
            index: 0,
        };
        shard.handle(Request::Init {
            chunk,
            spec: TableSpec::new(Consistency::Async, crate::UpdaterSpec::Sum),
            values: vec![0.0],
        });
        let push = |seq: u64| {
            Request::Push(Push {
                worker: WorkerId(0),
                incarnation: 1,
                seq,
                chunk,
                clock: 0,
                mode: PushMode::Add,
                encoding: Encoding::Dense,
                payload: 1f32.to_le_bytes().to_vec(),
            })
        };
        // 10,000 pushes, each block of 50 in scrambled order, each sent twice.
        for block in 0..200u64 {
            for i in 0..50u64 {
                let seq = block * 50 + (i * 37) % 50;
                shard.handle(push(seq));
                shard.handle(push(seq));
                let st = shard.lock();
                assert!(st.workers[0].above.len() <= 64);
            }
        }
        let st = shard.lock();
        assert_eq!((st.workers[0].base, st.workers[0].above.len()), (10_000, 0));
        assert_eq!(st.chunks[&chunk].values, vec![10_000.0]);
        assert_eq!(st.stats.duplicates, 10_000);
        drop(st);
        match shard.handle(push(10_000 + 64)) {
            Response::Error(e) => assert_eq!(e.code, ErrorCode::WindowExceeded),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn checkpoint_body_round_trips_and_every_truncation_is_refused() {
        let body = sample_checkpoint();
        check_checkpoint_body(2, &body).unwrap();
        for cut in 0..body.len() {
            assert!(check_checkpoint_body(2, &body[..cut]).is_err(), "cut {cut}");
        }
        assert!(
            check_checkpoint_body(3, &body).is_err(),
            "worker count differs"
        );
    }

    proptest::proptest! {
        #[test]
        fn checkpoint_and_wal_decoders_never_panic(
            flips in proptest::collection::vec((0usize..400, proptest::num::u8::ANY), 0..6),
            noise in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        ) {
            let mut body = sample_checkpoint();
            for (i, x) in flips {
                let n = body.len();
                body[i % n] ^= x;
            }
            let _ = check_checkpoint_body(2, &body);
            let _ = check_checkpoint_body(2, &noise);
            check_wal_bytes(2, &noise);
            // A WAL of well-framed records with random bodies.
            let mut wal = Vec::new();
            for rec in [&body[..], &noise[..]] {
                wal.extend_from_slice(&(rec.len() as u32).to_le_bytes());
                wal.extend_from_slice(&crc32fast::hash(rec).to_le_bytes());
                wal.extend_from_slice(rec);
            }
            check_wal_bytes(2, &wal);
        }
    }
}
