//! The worker side: [`KvStore`] talks to every shard over one TCP connection each.
//!
//! Every new connection first proves the token with the transport's handshake
//! ([`crate::auth`]), as this worker and role; a shard that does not prove it back is
//! treated as unreachable (the attempt fails and is retried).
//!
//! Every request is retried (reconnecting, with backoff) until the operation's deadline on
//! I/O errors, timeouts, corrupt replies, "your frame was malformed", "busy" and "could not
//! make it durable" answers; a push
//! keeps its sequence number across retries, so the shard applies it once. Replies carry
//! the request id, so a late or duplicated reply to an earlier attempt is skipped.
//! Chunks on different shards are sent in parallel (one scoped thread per shard).

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gradwire_codec::{BuildContext, Codec};

use crate::auth::{token_from_env, Peer, Role};
use crate::placement::{ChunkPlace, Placement};
use crate::spec::{ChunkId, Consistency, Key, PushCodec, PushMode, TableSpec, WorkerId};
use crate::twobit::TwoBit;
use crate::wire::{
    encode_push, read_frame, Encoding, ErrorCode, Payload, Push, ReadError, RemoteError, Request,
    Response, DEFAULT_MAX_BODY,
};
use crate::{Error, Result};

/// Why one attempt at a request failed (the client retries until its deadline, then reports
/// the last of these in [`Error::Timeout`]).
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    /// The TCP connection could not be made.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The token handshake failed.
    #[error("handshake: {0}")]
    Handshake(gradwire_transport::tcp::service::ServiceAuthError),
    /// The shard refused this worker's registration.
    #[error("hello refused: {0}")]
    HelloRefused(String),
    /// The socket's timeouts could not be set.
    #[error("socket: {0}")]
    Socket(std::io::Error),
    /// The request could not be written.
    #[error("send: {0}")]
    Send(std::io::Error),
    /// The shard closed the connection.
    #[error("connection closed by the shard")]
    Closed,
    /// The reply did not arrive or could not be read.
    #[error("reply: {0}")]
    Reply(ReadError),
}

/// Settings of a worker's client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// This worker's rank.
    pub worker: WorkerId,
    /// This process's incarnation; a restarted worker must use a larger one (the default,
    /// nanoseconds since the epoch, does).
    pub incarnation: u64,
    /// The shards' addresses, in shard order.
    pub shards: Vec<SocketAddr>,
    /// How long one attempt waits for its reply (must exceed the shards' `max_wait`).
    pub attempt_timeout: Duration,
    /// How long an operation may take in all, retries included.
    pub deadline: Duration,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// Heartbeat period (`None`: off; the default is on, every 500 ms).
    pub heartbeat: Option<Duration>,
    /// Largest chunk, in elements (BytePS uses 4 MB = 1 Mi f32).
    pub chunk_elems: usize,
    /// Virtual nodes per shard on the hash ring.
    pub vnodes: u32,
    /// Load bound of the placement (× average).
    pub imbalance: f64,
    /// Largest reply body accepted.
    pub max_body: usize,
    /// Seed of stochastic codecs.
    pub seed: u64,
    /// The token to prove to the shards (default: [`crate::auth::token_from_env`]).
    pub token: String,
    /// This client's role (default: the coordinator for worker 0, a worker otherwise).
    pub role: Role,
}

impl ClientConfig {
    /// Defaults for `worker` talking to `shards`.
    pub fn new(worker: WorkerId, shards: Vec<SocketAddr>) -> Self {
        ClientConfig {
            worker,
            incarnation: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                .max(1),
            shards,
            attempt_timeout: Duration::from_secs(40),
            deadline: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(2),
            heartbeat: Some(Duration::from_millis(500)),
            chunk_elems: 1 << 20,
            vnodes: 64,
            imbalance: 1.25,
            max_body: DEFAULT_MAX_BODY,
            seed: 0,
            token: token_from_env(),
            role: if worker.0 == 0 {
                Role::Coordinator
            } else {
                Role::Worker
            },
        }
    }
}

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

struct Conn {
    shard: usize,
    addr: SocketAddr,
    stream: Option<TcpStream>,
    next_rid: u64,
    next_seq: u64,
    body: Vec<u8>,
    hello: Vec<u8>,
    /// Frame bytes written to the shard (every attempt, hellos included).
    sent: u64,
    /// Frame bytes read from the shard (headers included).
    received: u64,
}

enum Enc {
    Dense,
    TwoBit(TwoBit),
    Codec(Box<dyn Codec>),
}

struct Table {
    spec: TableSpec,
    len: usize,
    places: Vec<ChunkPlace>,
    encs: Vec<Enc>,
    /// One reusable frame buffer per chunk.
    frames: Vec<Vec<u8>>,
    /// Sync: the round each chunk's next pull waits for.
    wait_round: Vec<u64>,
    pushes: u64,
}

/// A worker's handle on the parameter server (see the module doc).
pub struct KvStore {
    cfg: ClientConfig,
    conns: Vec<Conn>,
    placement: Placement,
    tables: HashMap<Key, Table>,
    heartbeat: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    scratch: Vec<u8>,
}

fn remote_to_error(shard: usize, e: RemoteError) -> Error {
    match e.code {
        ErrorCode::WorkerLost => Error::WorkerLost {
            worker: e.worker.unwrap_or(u32::MAX),
            message: e.message,
        },
        ErrorCode::Fenced => Error::Fenced {
            worker: e.worker.unwrap_or(u32::MAX),
            current: e.value,
        },
        code => Error::Remote {
            shard,
            code,
            worker: e.worker,
            message: e.message,
        },
    }
}

impl Conn {
    fn new(shard: usize, addr: SocketAddr, cfg: &ClientConfig) -> Self {
        let mut hello = Vec::new();
        Request::Hello {
            worker: cfg.worker,
            incarnation: cfg.incarnation,
        }
        .encode(0, &mut hello);
        Conn {
            shard,
            addr,
            stream: None,
            next_rid: 1,
            next_seq: 0,
            body: Vec::new(),
            hello,
            sent: 0,
            received: 0,
        }
    }

    /// One attempt: send `frame` (its rid patched) and read the matching reply.
    fn attempt(
        &mut self,
        frame: &mut [u8],
        cfg: &ClientConfig,
        timeout: Duration,
    ) -> std::result::Result<Response, AttemptError> {
        if self.stream.is_none() {
            let mut s = TcpStream::connect_timeout(&self.addr, cfg.connect_timeout)
                .map_err(AttemptError::Connect)?;
            let _ = s.set_nodelay(true);
            let peer = Peer {
                worker: cfg.worker,
                role: cfg.role,
            };
            let limit = timeout.min(crate::server::DEFAULT_HANDSHAKE_TIMEOUT);
            crate::auth::connect(&mut s, &cfg.token, peer, Instant::now() + limit)
                .map_err(AttemptError::Handshake)?;
            self.stream = Some(s);
            // Register on every new connection (a restarted shard learns us again).
            let mut hello = std::mem::take(&mut self.hello);
            let r = self.exchange(&mut hello, timeout, cfg);
            self.hello = hello;
            match r? {
                Response::Error(e) if !e.code.is_protocol() => return Ok(Response::Error(e)),
                Response::Error(e) => return Err(AttemptError::HelloRefused(e.message)),
                _ => {}
            }
        }
        self.exchange(frame, timeout, cfg)
    }

    fn exchange(
        &mut self,
        frame: &mut [u8],
        timeout: Duration,
        cfg: &ClientConfig,
    ) -> std::result::Result<Response, AttemptError> {
        let rid = self.next_rid;
        self.next_rid += 1;
        frame[16..24].copy_from_slice(&rid.to_le_bytes());
        let stream = self.stream.as_mut().expect("connected");
        stream
            .set_write_timeout(Some(timeout))
            .map_err(AttemptError::Socket)?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(AttemptError::Socket)?;
        stream.write_all(frame).map_err(AttemptError::Send)?;
        self.sent += frame.len() as u64;
        loop {
            let h = match read_frame(stream, cfg.max_body, &mut self.body) {
                Ok(h) => h,
                Err(ReadError::Closed) => return Err(AttemptError::Closed),
                Err(e) => return Err(AttemptError::Reply(e)),
            };
            self.received += (crate::wire::HEADER_LEN + self.body.len()) as u64;
            if h.rid != rid && h.rid != 0 {
                continue; // a late reply to an earlier attempt
            }
            if h.rid == 0 {
                // Request id 0: the shard's word on the connection itself (busy, or our
                // frame could not be read), never a reply to an earlier attempt.
                match Response::decode(&h, &self.body) {
                    Ok(r @ Response::Error(_)) => return Ok(r),
                    _ => continue,
                }
            }
            return Response::decode(&h, &self.body)
                .map_err(|e| AttemptError::Reply(ReadError::Wire(e)));
        }
    }

    /// Sends `frame` until a reply comes or `deadline` passes.
    fn call(
        &mut self,
        frame: &mut [u8],
        cfg: &ClientConfig,
        deadline: Instant,
    ) -> Result<Response> {
        let mut backoff = Duration::from_millis(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let last = match self.attempt(
                frame,
                cfg,
                cfg.attempt_timeout.min(left.max(Duration::from_millis(1))),
            ) {
                Ok(Response::Error(e)) if e.code.is_protocol() => {
                    // Our frame arrived damaged; the shard dropped the connection.
                    format!("shard saw a malformed frame: {}", e.message)
                }
                Ok(Response::Error(e)) if e.code == ErrorCode::Busy => {
                    format!("shard busy: {}", e.message)
                }
                Ok(Response::Error(e)) if e.code == ErrorCode::Durability => {
                    // Not acknowledged; the shard repairs its log before the next append,
                    // and a resent push keeps its sequence number (applied once).
                    format!("shard could not make it durable: {}", e.message)
                }
                Ok(Response::Error(e)) => return Err(remote_to_error(self.shard, e)),
                Ok(r) => return Ok(r),
                Err(e) => e.to_string(),
            };
            self.stream = None;
            if Instant::now() + backoff >= deadline {
                return Err(Error::Timeout {
                    shard: self.shard,
                    addr: self.addr,
                    last,
                });
            }
            tracing::debug!(shard = self.shard, %last, "retrying");
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
    }
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

    fn run(
        &mut self,
        key: Key,
        push: Option<(&[f32], PushMode)>,
        out: Option<&mut [f32]>,
        rows: Option<&[u32]>,
    ) -> Result<PullInfo> {
        let deadline = Instant::now() + self.cfg.deadline;
        let cfg = &self.cfg;
        let table = self.tables.get_mut(&key).ok_or(Error::UnknownKey(key.0))?;
        if let Some((g, _)) = push {
            if g.len() != table.len {
                return Err(Error::Length {
                    key: key.0,
                    expected: table.len,
                    got: g.len(),
                });
            }
        }
        let row_len = table.spec.row_len as usize;
        // Which rows of the request fall into which chunk (row-sparse pull).
        let mut chunk_rows: Vec<Vec<(usize, u32)>> = vec![Vec::new(); table.places.len()];
        if let Some(rows) = rows {
            let want = rows.len() * row_len;
            if out.as_ref().map(|o| o.len()) != Some(want) {
                return Err(Error::Length {
                    key: key.0,
                    expected: want,
                    got: out.as_ref().map_or(0, |o| o.len()),
                });
            }
            for (pos, &r) in rows.iter().enumerate() {
                let start = r as usize * row_len;
                let ci = table
                    .places
                    .iter()
                    .position(|p| start >= p.start && start < p.start + p.len)
                    .ok_or(Error::Remote {
                        shard: 0,
                        code: ErrorCode::InvalidArgument,
                        worker: None,
                        message: format!("row {r} out of range"),
                    })?;
                chunk_rows[ci].push((pos, ((start - table.places[ci].start) / row_len) as u32));
            }
        } else if let Some(o) = out.as_ref() {
            if o.len() != table.len {
                return Err(Error::Length {
                    key: key.0,
                    expected: table.len,
                    got: o.len(),
                });
            }
        }
        let pulling = out.is_some();
        // Build one frame per chunk that has work.
        let mut frames: Vec<Option<Vec<u8>>> = Vec::with_capacity(table.places.len());
        for (i, p) in table.places.iter().enumerate() {
            let chunk = ChunkId {
                key,
                index: p.index,
            };
            // Frame buffers are kept per chunk and reused across calls.
            let mut f = std::mem::take(&mut table.frames[i]);
            let frame = if let Some((g, mode)) = push {
                let g = &g[p.start..p.start + p.len];
                let payload = &mut self.scratch;
                let encoding = match (&mut table.encs[i], mode) {
                    (Enc::TwoBit(q), PushMode::Grad) => {
                        q.encode(g, payload);
                        Encoding::TwoBit
                    }
                    (Enc::Codec(c), PushMode::Grad) => {
                        c.encode(g, payload);
                        Encoding::Codec
                    }
                    _ => Encoding::Dense,
                };
                let conn = &mut self.conns[p.shard];
                let seq = conn.next_seq;
                conn.next_seq += 1;
                let push = Push {
                    worker: cfg.worker,
                    incarnation: cfg.incarnation,
                    seq,
                    chunk,
                    clock: table.pushes,
                    mode,
                    encoding,
                    payload: Vec::new(),
                };
                let body = match encoding {
                    Encoding::Dense => Payload::F32(g),
                    _ => Payload::Bytes(payload),
                };
                encode_push(&push, body, pulling, 0, &mut f);
                Some(f)
            } else if rows.is_some() && chunk_rows[i].is_empty() {
                table.frames[i] = f;
                None
            } else {
                Request::Pull {
                    worker: cfg.worker,
                    chunk,
                    clock: table.wait_round[i],
                    rows: rows.map(|_| chunk_rows[i].iter().map(|x| x.1).collect()),
                }
                .encode(0, &mut f);
                Some(f)
            };
            frames.push(frame);
        }
        // Send, per shard in parallel.
        let mut by_shard: Vec<Vec<(usize, Vec<u8>)>> =
            (0..self.conns.len()).map(|_| Vec::new()).collect();
        for (i, f) in frames.into_iter().enumerate() {
            if let Some(f) = f {
                by_shard[table.places[i].shard].push((i, f));
            }
        }
        let busy = by_shard.iter().filter(|v| !v.is_empty()).count();
        type Done = (usize, Result<Response>, Vec<u8>);
        let mut results: Vec<Done> = Vec::new();
        let work = |conn: &mut Conn, jobs: Vec<(usize, Vec<u8>)>| -> Vec<Done> {
            jobs.into_iter()
                .map(|(i, mut f)| {
                    let r = conn.call(&mut f, cfg, deadline);
                    (i, r, f)
                })
                .collect()
        };
        if busy <= 1 {
            for (conn, jobs) in self.conns.iter_mut().zip(by_shard) {
                if !jobs.is_empty() {
                    results.extend(work(conn, jobs));
                }
            }
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = self
                    .conns
                    .iter_mut()
                    .zip(by_shard)
                    .filter(|(_, j)| !j.is_empty())
                    .map(|(conn, jobs)| s.spawn(move || work(conn, jobs)))
                    .collect();
                for h in handles {
                    results.extend(h.join().expect("shard thread does not panic"));
                }
            });
        }
        let mut info = PullInfo {
            round: u64::MAX,
            min_clock: u64::MAX,
            clock: 0,
        };
        let mut out = out;
        let mut first_err = None;
        let sync = table.spec.consistency == Consistency::Sync;
        for (i, r, f) in results {
            table.frames[i] = f;
            match r {
                Err(e) => {
                    first_err.get_or_insert(e);
                }
                Ok(Response::Ok { value }) => {
                    if sync && push.is_some() {
                        table.wait_round[i] = value + 1;
                    }
                }
                Ok(Response::Values {
                    round,
                    min_clock,
                    values,
                }) => {
                    if sync {
                        table.wait_round[i] = table.wait_round[i].max(round);
                    }
                    info.round = info.round.min(round);
                    info.min_clock = info.min_clock.min(min_clock);
                    let p = table.places[i];
                    let o = out.as_deref_mut().expect("values only for pulls");
                    if rows.is_some() {
                        if values.len() != chunk_rows[i].len() * row_len {
                            first_err.get_or_insert(Error::Length {
                                key: key.0,
                                expected: chunk_rows[i].len() * row_len,
                                got: values.len(),
                            });
                            continue;
                        }
                        for (j, &(pos, _)) in chunk_rows[i].iter().enumerate() {
                            o[pos * row_len..(pos + 1) * row_len]
                                .copy_from_slice(&values[j * row_len..(j + 1) * row_len]);
                        }
                    } else if values.len() == p.len {
                        o[p.start..p.start + p.len].copy_from_slice(&values);
                    } else {
                        first_err.get_or_insert(Error::Length {
                            key: key.0,
                            expected: p.len,
                            got: values.len(),
                        });
                    }
                }
                Ok(_) => {}
            }
        }
        if push.is_some() {
            table.pushes += 1;
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if info.round == u64::MAX {
            info.round = 0;
            info.min_clock = 0;
        }
        info.clock = table.pushes;
        Ok(info)
    }
}

impl Drop for KvStore {
    fn drop(&mut self) {
        self.stop_heartbeat();
    }
}
