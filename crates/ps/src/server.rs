//! The TCP front of a shard: a listener, the handshake gate, one thread per admitted
//! connection, frames in and out.
//!
//! The accept thread runs every pending handshake at once (the transport's gate: one
//! `poll(2)` loop, a deadline per connection), so strangers that connect and stay silent
//! cost a real client nothing; a connection that fails the handshake is closed without a
//! PS byte. An admitted connection is bound to the [`Peer`] it proved to be and gets its
//! own thread, up to [`ServerConfig::max_connections`]: beyond, it gets a `Busy` error and
//! is closed (the client retries). Out of file descriptors, the gate stops accepting for a
//! moment (the waiting connections stay in the kernel's backlog) instead of spinning; any
//! other failure of the listener makes the loop back off, 5 ms doubling to 1 s, logging one
//! line a second at most.
//!
//! Per connection: one frame body of at most `shard.max_body` bytes, committed as its bytes
//! arrive; each whole frame within `frame_timeout` (a stalled frame gets a `Truncated`
//! error and the connection is closed; an idle connection is closed); buffers above 1 MiB
//! are released after each frame.
//!
//! Each connection reads one frame at a time with a deadline (`frame_timeout`, which also
//! closes idle or slowloris connections), decodes it, lets the [`Shard`] handle it and
//! writes the response. A malformed frame gets a typed Error response, then that
//! connection is dropped; the other connections are untouched.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gradwire_transport::tcp::service::{IdentityRefusal, ServiceGate};

use crate::auth::{may_listen, token_from_env, Peer, SERVICE_ID};
use crate::shard::{Shard, ShardConfig};
use crate::wire::{read_frame, ErrorCode, ReadError, RemoteError, Request, Response};

/// Default deadline of one connection's whole handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default cap on authenticated connections served at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// Settings of a shard server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen (port 0: any free port).
    pub listen: SocketAddr,
    /// The shard.
    pub shard: ShardConfig,
    /// A connection must deliver each whole frame within this (idle connections close).
    pub frame_timeout: Duration,
    /// Write a checkpoint this often (needs `shard.dir`; `None`: only on request).
    pub checkpoint_every: Option<Duration>,
    /// The token every connection must prove it knows (default:
    /// [`crate::auth::token_from_env`]).
    pub token: String,
    /// Listen off loopback with an empty token anyway (anyone who can reach the port can
    /// then act as any worker).
    pub insecure: bool,
    /// Deadline of one connection's whole handshake.
    pub handshake_timeout: Duration,
    /// Most authenticated connections served at once.
    pub max_connections: usize,
}

impl ServerConfig {
    /// Listens on 127.0.0.1, any free port, with the token from the environment.
    pub fn loopback(shard: ShardConfig) -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            shard,
            frame_timeout: Duration::from_secs(60),
            checkpoint_every: None,
            token: token_from_env(),
            insecure: false,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// A running shard server; dropping it stops accepting (open connections end when their
/// peers close or time out).
pub struct Server {
    addr: SocketAddr,
    shard: Arc<Shard>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    checkpointer: Option<(std::sync::mpsc::Sender<()>, JoinHandle<()>)>,
}

impl Server {
    /// Opens the shard (checkpoint, WAL replay), binds, and starts serving. Refuses
    /// ([`crate::Error::Insecure`]) to listen off loopback without a token unless
    /// `insecure` is set.
    pub fn start(cfg: ServerConfig) -> crate::Result<Server> {
        if !may_listen(cfg.listen.ip(), &cfg.token, cfg.insecure) {
            return Err(crate::Error::Insecure { listen: cfg.listen });
        }
        let shard = Arc::new(Shard::open(cfg.shard.clone())?);
        let listener = TcpListener::bind(cfg.listen)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (shard, stop, cfg) = (shard.clone(), stop.clone(), cfg.clone());
            std::thread::Builder::new()
                .name(format!("ps-accept-{}", cfg.shard.shard_id))
                .spawn(move || accept_loop(&listener, &shard, &stop, &cfg))?
        };
        let checkpointer = match (cfg.checkpoint_every, &cfg.shard.dir) {
            (Some(every), Some(_)) => {
                let (tx, rx) = std::sync::mpsc::channel::<()>();
                let s3 = shard.clone();
                let h = std::thread::spawn(move || {
                    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                        rx.recv_timeout(every)
                    {
                        if let Err(e) = s3.checkpoint() {
                            tracing::warn!(error = %e.message, "periodic checkpoint failed");
                        }
                    }
                });
                Some((tx, h))
            }
            _ => None,
        };
        tracing::info!(%addr, shard = cfg.shard.shard_id, "ps shard serving");
        Ok(Server {
            addr,
            shard,
            stop,
            accept: Some(accept),
            checkpointer,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shard (for checkpoints, stats, tests).
    pub fn shard(&self) -> &Arc<Shard> {
        &self.shard
    }

    /// Stops accepting and joins the accept thread.
    pub fn shutdown(mut self) {
        self.stop_accepting();
    }

    fn stop_accepting(&mut self) {
        if let Some((tx, h)) = self.checkpointer.take() {
            drop(tx);
            let _ = h.join();
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_accepting();
    }
}

/// How often the accept loop looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Admits connections until `stop`: handshakes through the gate, then one thread each.
fn accept_loop(listener: &TcpListener, shard: &Arc<Shard>, stop: &AtomicBool, cfg: &ServerConfig) {
    let num_workers = cfg.shard.num_workers;
    let mut gate = match ServiceGate::new(
        listener,
        cfg.token.as_bytes(),
        SERVICE_ID,
        cfg.handshake_timeout,
    ) {
        Ok(g) => g,
        Err(e) => {
            tracing::error!(error = %e, "ps shard: the listener cannot be polled; not serving");
            return;
        }
    };
    let live = Arc::new(AtomicUsize::new(0));
    let mut backoff = AcceptBackoff::default();
    while !stop.load(Ordering::SeqCst) {
        let admitted = gate.next(Instant::now() + STOP_POLL, |i| {
            match Peer::from_identity(i) {
                Some(p) if p.worker.0 < num_workers => Ok(()),
                Some(p) => Err(IdentityRefusal::Id {
                    id: p.worker.0,
                    count: num_workers,
                }),
                None => Err(IdentityRefusal::Role { role: i.role }),
            }
        });
        let conn = match admitted {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                backoff.failed(&e);
                continue;
            }
        };
        backoff.reset();
        let Some(peer) = Peer::from_identity(conn.identity) else {
            continue; // checked by the gate
        };
        let mut stream = conn.stream;
        if live.load(Ordering::SeqCst) >= cfg.max_connections {
            shard.note_busy();
            busy(&mut stream, cfg.max_connections);
            continue;
        }
        let guard = LiveGuard::new(&live);
        let (shard, frame_timeout) = (shard.clone(), cfg.frame_timeout);
        let spawned = std::thread::Builder::new()
            .name("ps-conn".into())
            .spawn(move || {
                let _guard = guard;
                serve_connection(&shard, stream, &peer, frame_timeout)
            });
        if let Err(e) = spawned {
            // The closure (and with it the stream and the guard) was dropped.
            tracing::warn!(error = %e, "ps shard: no thread for a connection; closed it");
        }
    }
}

/// Answers an admitted connection beyond the cap with `Busy` (request id 0) and closes it.
fn busy(stream: &mut TcpStream, max: usize) {
    let mut out = Vec::new();
    Response::Error(RemoteError {
        code: ErrorCode::Busy,
        worker: None,
        value: max as u64,
        message: format!("the shard serves {max} connections already; try again"),
    })
    .encode(0, &mut out);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let _ = stream.write_all(&out);
    let _ = stream.shutdown(Shutdown::Both);
}

/// Counts a live connection while it exists.
struct LiveGuard(Arc<AtomicUsize>);

impl LiveGuard {
    fn new(live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        LiveGuard(live.clone())
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Backs off after `accept(2)` fails (EMFILE and the like), logging at most once a second.
struct AcceptBackoff {
    pause: Duration,
    failures: u64,
    last_log: Option<Instant>,
}

impl Default for AcceptBackoff {
    fn default() -> Self {
        AcceptBackoff {
            pause: Duration::from_millis(5),
            failures: 0,
            last_log: None,
        }
    }
}

impl AcceptBackoff {
    fn failed(&mut self, e: &std::io::Error) {
        self.failures += 1;
        if self
            .last_log
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            tracing::warn!(error = %e, failures = self.failures, pause_ms = self.pause.as_millis() as u64, "ps shard: accept failed; backing off");
            self.last_log = Some(Instant::now());
        }
        std::thread::sleep(self.pause);
        self.pause = (self.pause * 2).min(Duration::from_secs(1));
    }

    fn reset(&mut self) {
        self.pause = Duration::from_millis(5);
        self.failures = 0;
    }
}

fn serve_connection(shard: &Shard, mut conn: TcpStream, peer: &Peer, frame_timeout: Duration) {
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(frame_timeout));
    let _ = conn.set_write_timeout(Some(frame_timeout));
    let max = shard.config().max_body;
    let mut body = Vec::new();
    let mut out = Vec::new();
    loop {
        let mut reader = DeadlineReader::new(&conn, frame_timeout);
        let header = match read_frame(&mut reader, max, &mut body) {
            Ok(h) => h,
            Err(ReadError::Closed) | Err(ReadError::Io(_)) => return,
            Err(ReadError::Wire(e)) => {
                reject(shard, &mut conn, 0, &e, &mut out);
                return;
            }
        };
        let req = match Request::decode(&header, &body) {
            Ok(r) => r,
            Err(e) => {
                reject(shard, &mut conn, header.rid, &e, &mut out);
                return;
            }
        };
        shard.handle_into_from(Some(peer), req, header.rid, &mut out);
        if conn.write_all(&out).is_err() {
            return;
        }
        // An idle connection keeps small buffers, whatever its largest frame was.
        for buf in [&mut body, &mut out] {
            if buf.capacity() > KEEP_BUFFER {
                *buf = Vec::new();
            }
        }
    }
}

/// Buffer capacity a connection keeps between frames.
const KEEP_BUFFER: usize = 1 << 20;

fn reject(
    shard: &Shard,
    conn: &mut TcpStream,
    rid: u64,
    e: &crate::wire::WireError,
    out: &mut Vec<u8>,
) {
    tracing::warn!(error = %e, peer = ?conn.peer_addr().ok(), "malformed frame; dropping connection");
    shard.note_rejected_frame();
    Response::Error(RemoteError {
        code: e.code(),
        worker: None,
        value: 0,
        message: e.to_string(),
    })
    .encode(rid, out);
    let _ = conn.write_all(out);
    let _ = conn.shutdown(Shutdown::Both);
}

/// Reads with one deadline for the whole frame (a stalled or slowloris peer times out).
struct DeadlineReader<'a> {
    conn: &'a TcpStream,
    timeout: Duration,
    deadline: Option<std::time::Instant>,
}

impl<'a> DeadlineReader<'a> {
    fn new(conn: &'a TcpStream, timeout: Duration) -> Self {
        DeadlineReader {
            conn,
            timeout,
            deadline: None,
        }
    }
}

impl std::io::Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // The deadline starts at the frame's first byte; before that the idle timeout runs.
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            self.conn.set_read_timeout(Some(left))?;
        } else {
            self.conn.set_read_timeout(Some(self.timeout))?;
        }
        let mut c = self.conn;
        let n = std::io::Read::read(&mut c, buf)?;
        if self.deadline.is_none() && n > 0 {
            self.deadline = Some(std::time::Instant::now() + self.timeout);
        }
        Ok(n)
    }
}
