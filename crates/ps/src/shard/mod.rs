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
//! WAL records (after the lsn u64): kind 1 = an applied request (Hello, Leave, Init, Push,
//! and Sandblaster's VecOp and SetVec) as a full encoded frame; kind 2 = a sync round
//! closed, chunk (key u64, index u32). A record is logged, under the shard's lock, before
//! its request changes anything, and a request whose record could not be made durable is
//! refused (`Durability`) and changes nothing. Replaying the records on top of the last
//! checkpoint rebuilds the exact state. Once the WAL passes `wal_rotate_bytes`, the shard
//! writes a checkpoint between requests and empties the WAL.
//!
//! Checkpoint body (format 2): lsn u64, workers u32, per worker (incarnation u64, base u64,
//! left u8, n u32 + n applied seqs u64, n u32 + n × (chunk, round u64)); chunks u32, per
//! chunk (in id order): Init frame (u32 length + frame), step u64, f32s a, f32s b, round
//! u64, n_grad u32, f32s pend_grad, f32s pend_add, n u32 + n contributor ids u32, n u32 + n
//! clocks u64; then scratch slots u32, per slot (in order): slot u64, n u32, n × (chunk,
//! f32s). Format 1 ends before the scratch slots.
//!
//! Connections reach a shard only through `server.rs`, authenticated and bound to a
//! [`Peer`]: [`Shard::handle_from`] refuses what that peer may not do (`auth.rs`), and
//! every request is held to the shard's [`Limits`] (`limits.rs`).

use crate::auth::{Peer, Role};

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::durability::{read_checkpoint_versioned, Wal, WalFaults};
use crate::spec::{ChunkId, Consistency};
use crate::wire::{ErrorCode, RemoteError, Request, Response};

mod auth;
mod durable;
mod limits;
mod pull;
mod push;
mod rounds;
mod state;
mod tables;
mod vecops;
mod workers;

#[cfg(any(test, fuzzing))]
pub use durable::{check_checkpoint_body, check_wal_bytes};
pub use limits::Limits;
use state::{Chunk, Live, State, WorkerSlot};

/// Default WAL size that triggers a checkpoint.
pub const DEFAULT_WAL_ROTATE_BYTES: u64 = 64 << 20;

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
    /// What the shard agrees to hold.
    pub limits: Limits,
    /// Take a checkpoint (which empties the WAL) once the WAL holds more than this many
    /// bytes.
    pub wal_rotate_bytes: u64,
    /// Failures to inject into WAL appends and fsyncs (tests, drills); `None` in service.
    pub wal_faults: Option<Arc<WalFaults>>,
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
            limits: Limits::default(),
            wal_rotate_bytes: DEFAULT_WAL_ROTATE_BYTES,
            wal_faults: None,
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
    /// Authenticated connections refused because the shard served its cap already.
    pub busy: u64,
    /// Requests refused for exceeding a limit (reply size, tables, elements, vectors).
    pub limited: u64,
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
            self.busy,
            self.limited,
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
            busy: g(8),
            limited: g(9),
        }
    }
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
        if cfg.num_workers > cfg.limits.max_workers {
            return Err(crate::Error::Spec {
                what: "shard",
                spec: format!("{} workers", cfg.num_workers),
                reason: format!("at most {} workers", cfg.limits.max_workers),
            });
        }
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
            if let Some((version, body)) =
                read_checkpoint_versioned(&shard.ckpt_path()).map_err(crate::Error::Durability)?
            {
                shard
                    .restore(&mut st, &body, version, now)
                    .map_err(crate::Error::CorruptCheckpoint)?;
            }
            if shard.cfg.wal {
                let path = dir.join(format!("shard-{}.wal", shard.cfg.shard_id));
                // Records are replayed as they are read: the log is never held whole.
                let wal = Wal::open_with(
                    &path,
                    shard.cfg.wal_sync,
                    shard.cfg.max_body + 64,
                    shard.cfg.wal_faults.clone(),
                    |r| shard.replay(&mut st, r, now),
                )
                .map_err(crate::Error::Durability)?;
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

    /// Counts an authenticated connection refused for the connection cap.
    pub fn note_busy(&self) {
        self.lock().stats.busy += 1;
    }

    /// Wakes every waiter (so it re-checks liveness).
    pub fn tick(&self) {
        self.cv.notify_all();
    }

    /// Handles one request from a trusted in-process caller (every operation allowed),
    /// waiting at most `max_wait` where the consistency mode says so.
    pub fn handle(&self, req: Request) -> Response {
        self.handle_from(None, req)
    }

    /// Handles one request from `peer` (`None`: a trusted in-process caller), refusing what
    /// the peer may not do (see [`crate::auth`]).
    pub fn handle_from(&self, peer: Option<&Peer>, req: Request) -> Response {
        match self.dispatch(peer, req, None) {
            Out::Resp(r) => r,
            // Only a call with a frame buffer gets an encoded answer.
            Out::Encoded => Response::Error(*invalid("internal: a response went missing")),
        }
    }

    /// Like [`Shard::handle`], but writes the response frame (request id `rid`) into `out`;
    /// values are encoded straight from the chunk, without an intermediate copy.
    pub fn handle_into(&self, req: Request, rid: u64, out: &mut Vec<u8>) {
        self.handle_into_from(None, req, rid, out)
    }

    /// [`Shard::handle_from`] writing the response frame into `out`, as
    /// [`Shard::handle_into`] does.
    pub fn handle_into_from(&self, peer: Option<&Peer>, req: Request, rid: u64, out: &mut Vec<u8>) {
        if let Out::Resp(r) = self.dispatch(peer, req, Some((rid, &mut *out))) {
            r.encode(rid, out);
        }
    }

    fn dispatch(
        &self,
        peer: Option<&Peer>,
        req: Request,
        frame: Option<(u64, &mut Vec<u8>)>,
    ) -> Out {
        let deadline = Instant::now() + self.cfg.max_wait;
        if let Some(p) = peer {
            if let Err(e) = self.authorize(p, &req) {
                return self.refused(*e);
            }
        }
        let creates = peer.is_none_or(|p| p.role == Role::Coordinator);
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
            } => self
                .init(chunk, spec, values, creates, deadline)
                .map(Out::Resp),
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
        self.maybe_rotate();
        match r {
            Ok(out) => out,
            Err(e) => self.refused(*e),
        }
    }

    /// Counts a refused request and turns it into its error response.
    fn refused(&self, e: RemoteError) -> Out {
        let mut st = self.lock();
        st.stats.request_errors += 1;
        match e.code {
            ErrorCode::Fenced => st.stats.fenced += 1,
            ErrorCode::LimitExceeded => st.stats.limited += 1,
            _ => {}
        }
        Out::Resp(Response::Error(e))
    }

    fn spec_of(&self, chunk: ChunkId) -> Option<Consistency> {
        self.lock().chunks.get(&chunk).map(|c| c.spec.consistency)
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
}

#[cfg(test)]
mod tests;
