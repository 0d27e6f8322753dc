//! The TCP front of a shard: a listener, one thread per connection, frames in and out.
//!
//! Each connection reads one frame at a time with a deadline (`frame_timeout`, which also
//! closes idle or slowloris connections), decodes it, lets the [`Shard`] handle it and
//! writes the response. A malformed frame gets a typed Error response, then that
//! connection is dropped; the other connections are untouched.

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::shard::{Shard, ShardConfig};
use crate::wire::{read_frame, ReadError, RemoteError, Request, Response};

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
}

impl ServerConfig {
    /// Listens on 127.0.0.1, any free port.
    pub fn loopback(shard: ShardConfig) -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            shard,
            frame_timeout: Duration::from_secs(60),
            checkpoint_every: None,
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
    /// Opens the shard (checkpoint, WAL replay), binds, and starts serving.
    pub fn start(cfg: ServerConfig) -> crate::Result<Server> {
        let shard = Arc::new(Shard::open(cfg.shard.clone())?);
        let listener = TcpListener::bind(cfg.listen)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, stop2) = (shard.clone(), stop.clone());
        let frame_timeout = cfg.frame_timeout;
        let accept = std::thread::Builder::new()
            .name(format!("ps-accept-{}", cfg.shard.shard_id))
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let shard = s2.clone();
                    let _ = std::thread::Builder::new()
                        .name("ps-conn".into())
                        .spawn(move || serve_connection(&shard, conn, frame_timeout));
                }
            })?;
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
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
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

fn serve_connection(shard: &Shard, mut conn: TcpStream, frame_timeout: Duration) {
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
        shard.handle_into(req, header.rid, &mut out);
        if conn.write_all(&out).is_err() {
            return;
        }
    }
}

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
