//! `tcp`: a full mesh of TCP connections between the ranks of a job.
//!
//! Rendezvous goes through rank 0 at the master address (like a TCP store): every rank binds
//! its own listener on port 0 (no fixed port ranges, so parallel jobs never collide), sends
//! rank 0 a handshake with the shared token (`GRADWIRE_TOKEN`), and gets back the table of
//! listening addresses; then each rank connects to the lower ranks and accepts the higher
//! ones. A connection with a wrong token, or one that sends garbage, is dropped with a log
//! line while the job goes on.
//!
//! Data moves in frames ([`frame`]) whose length is checked against [`TcpConfig::max_frame`]
//! before anything is allocated. All sockets are non-blocking and driven by `poll(2)`, so
//! [`Transport::send_recv`] is full duplex (a ring step never deadlocks, whatever the message
//! size) and every call has a deadline: no progress for [`TcpConfig::timeout`] gives
//! [`Error::Timeout`] naming the peer. When a call fails because of a peer, this rank tells
//! every other rank (an abort frame), so the whole job learns which rank failed within one
//! deadline instead of timing out one after another.

pub mod frame;

use std::io::{self, IoSlice, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use frame::{
    FrameError, FrameHeader, Hello, HelloKind, FRAME_HEADER_LEN, HELLO_FIXED_LEN, MAGIC_TABLE,
    TABLE_ENTRY_LEN,
};

use crate::{Error, Op, Result, Transport, DEFAULT_TIMEOUT};

/// Largest message accepted by default (1 GiB).
pub const DEFAULT_MAX_FRAME: u64 = 1 << 30;

/// How a rank joins a TCP job.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Where rank 0 listens for the rendezvous.
    pub master: SocketAddr,
    /// The shared secret every rank presents.
    pub token: String,
    /// Deadline of every blocking call (no progress for this long is an error).
    pub timeout: Duration,
    /// Largest accepted message in bytes.
    pub max_frame: u64,
    /// Socket send/receive buffer size in bytes; `None` keeps the kernel's autotuning.
    pub socket_buffer: Option<usize>,
}

impl TcpConfig {
    /// A config with default deadline, frame limit and buffers.
    pub fn new(
        rank: usize,
        world_size: usize,
        master: SocketAddr,
        token: impl Into<String>,
    ) -> Self {
        TcpConfig {
            rank,
            world_size,
            master,
            token: token.into(),
            timeout: DEFAULT_TIMEOUT,
            max_frame: DEFAULT_MAX_FRAME,
            socket_buffer: None,
        }
    }
}

/// Where a receive puts its payload.
enum Sink<'a> {
    Vec(&'a mut Vec<u8>),
    Slice(&'a mut [u8]),
}

/// One rank's end of the full mesh.
pub struct Tcp {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    max_frame: u64,
    bytes_sent: u64,
    /// `peers[p]`: the connection to rank p (`None` for ourselves).
    peers: Vec<Option<TcpStream>>,
    /// Set once we have told the others about a failure.
    aborted: bool,
    /// A peer we stopped writing to in the middle of a frame (an abort notice would corrupt it).
    partial_send: Option<usize>,
}

impl Tcp {
    /// Joins the job described by `cfg`: rank 0 binds the master address, the others connect
    /// to it. Returns when the full mesh is up.
    pub fn connect(cfg: &TcpConfig) -> Result<Tcp> {
        if cfg.rank == 0 {
            let listener = TcpListener::bind(cfg.master).map_err(|e| Error::Rendezvous {
                reason: format!("rank 0 cannot listen on {}: {e}", cfg.master),
            })?;
            Self::connect_rank0(listener, cfg)
        } else {
            Self::connect_other(cfg)
        }
    }

    /// Rank 0's side of the rendezvous on an already-bound listener (lets tests bind port 0).
    pub fn connect_rank0(listener: TcpListener, cfg: &TcpConfig) -> Result<Tcp> {
        check_cfg(cfg)?;
        let n = cfg.world_size;
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        let mut addrs: Vec<Option<SocketAddr>> = vec![None; n];
        addrs[0] = Some(
            listener
                .local_addr()
                .map_err(|e| rendezvous(format!("listener address: {e}")))?,
        );
        let deadline = Instant::now() + cfg.timeout;
        let mut missing = n - 1;
        while missing > 0 {
            let (mut stream, from) = accept_before(&listener, deadline, || {
                let absent: Vec<String> = (1..n)
                    .filter(|&r| peers[r].is_none())
                    .map(|r| r.to_string())
                    .collect();
                format!(
                    "rank(s) {} did not join within {:?}",
                    absent.join(", "),
                    cfg.timeout
                )
            })?;
            match read_hello(&mut stream, cfg, HelloKind::Hello) {
                Ok(h) => {
                    let r = h.rank as usize;
                    if peers[r].is_some() {
                        tracing::warn!(%from, rank = r, "refused a second connection claiming rank {r}");
                        continue;
                    }
                    addrs[r] = Some(SocketAddr::new(from.ip(), h.port));
                    peers[r] = Some(stream);
                    missing -= 1;
                }
                Err(why) => tracing::warn!(%from, "refused a connection at rendezvous: {why}"),
            }
        }
        // Everyone is here: send the table of listening addresses.
        let mut table = MAGIC_TABLE.to_le_bytes().to_vec();
        for a in &addrs {
            encode_addr(&mut table, a.expect("all ranks joined"));
        }
        for (r, p) in peers.iter_mut().enumerate() {
            if let Some(s) = p {
                s.write_all(&table).map_err(|e| Error::Io {
                    peer: r,
                    op: Op::Connect,
                    source: e,
                })?;
            }
        }
        Self::finish(cfg, peers)
    }

    fn connect_other(cfg: &TcpConfig) -> Result<Tcp> {
        check_cfg(cfg)?;
        let n = cfg.world_size;
        let deadline = Instant::now() + cfg.timeout;
        // Our own listener, on the interface that reaches rank 0, port 0.
        let mut master = connect_before(cfg.master, deadline, 0)?;
        let local_ip = master
            .local_addr()
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let listener = TcpListener::bind(SocketAddr::new(local_ip, 0))
            .map_err(|e| rendezvous(format!("cannot listen on {local_ip}: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| rendezvous(format!("listener address: {e}")))?
            .port();
        let hello = Hello {
            kind: HelloKind::Hello,
            rank: cfg.rank as u32,
            world_size: n as u32,
            port,
            token: cfg.token.as_bytes().to_vec(),
        };
        master.write_all(&hello.encode()).map_err(|e| Error::Io {
            peer: 0,
            op: Op::Connect,
            source: e,
        })?;
        // Wait for the table (rank 0 sends it once all ranks are in).
        master.set_read_timeout(Some(remaining(deadline))).ok();
        let mut table = vec![0u8; 4 + n * TABLE_ENTRY_LEN];
        master.read_exact(&mut table).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Rendezvous {
                reason: format!(
                    "rank 0 did not complete the rendezvous within {:?} (a rank missing?)",
                    cfg.timeout
                ),
            },
            io::ErrorKind::UnexpectedEof => Error::Rendezvous {
                reason: "rank 0 closed the connection (wrong token or world size?)".into(),
            },
            _ => Error::Io {
                peer: 0,
                op: Op::Connect,
                source: e,
            },
        })?;
        if u32::from_le_bytes([table[0], table[1], table[2], table[3]]) != MAGIC_TABLE {
            return Err(rendezvous("rank 0 sent a malformed address table".into()));
        }
        let addrs: Vec<SocketAddr> = table[4..]
            .chunks_exact(TABLE_ENTRY_LEN)
            .map(decode_addr)
            .collect();
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        peers[0] = Some(master);
        // Connect to lower ranks > 0.
        for (r, addr) in addrs.iter().enumerate().take(cfg.rank).skip(1) {
            let mut s = connect_before(*addr, deadline, r)?;
            let join = Hello {
                kind: HelloKind::Join,
                port: 0,
                ..hello.clone()
            };
            s.write_all(&join.encode()).map_err(|e| Error::Io {
                peer: r,
                op: Op::Connect,
                source: e,
            })?;
            peers[r] = Some(s);
        }
        // Accept higher ranks.
        let mut missing = n - 1 - cfg.rank;
        while missing > 0 {
            let (mut stream, from) = accept_before(&listener, deadline, || {
                let absent: Vec<String> = (cfg.rank + 1..n)
                    .filter(|&r| peers[r].is_none())
                    .map(|r| r.to_string())
                    .collect();
                format!(
                    "rank(s) {} did not connect to rank {} within {:?}",
                    absent.join(", "),
                    cfg.rank,
                    cfg.timeout
                )
            })?;
            match read_hello(&mut stream, cfg, HelloKind::Join) {
                Ok(h) if (h.rank as usize) > cfg.rank && peers[h.rank as usize].is_none() => {
                    peers[h.rank as usize] = Some(stream);
                    missing -= 1;
                }
                Ok(h) => tracing::warn!(%from, "refused an unexpected join from rank {}", h.rank),
                Err(why) => tracing::warn!(%from, "refused a connection: {why}"),
            }
        }
        Self::finish(cfg, peers)
    }

    fn finish(cfg: &TcpConfig, peers: Vec<Option<TcpStream>>) -> Result<Tcp> {
        for (r, p) in peers.iter().enumerate() {
            if let Some(s) = p {
                let io = |e| Error::Io {
                    peer: r,
                    op: Op::Connect,
                    source: e,
                };
                s.set_nodelay(true).map_err(io)?;
                s.set_read_timeout(None).map_err(io)?;
                s.set_nonblocking(true).map_err(io)?;
                if let Some(size) = cfg.socket_buffer {
                    set_buffers(s, size);
                }
            }
        }
        tracing::debug!(rank = cfg.rank, world_size = cfg.world_size, "tcp mesh up");
        Ok(Tcp {
            rank: cfg.rank,
            world_size: cfg.world_size,
            timeout: cfg.timeout,
            max_frame: cfg.max_frame,
            bytes_sent: 0,
            peers,
            aborted: false,
            partial_send: None,
        })
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.world_size || peer == self.rank {
            return Err(Error::InvalidRank {
                rank: peer,
                world_size: self.world_size,
            });
        }
        Ok(())
    }

    /// Drives one send and/or one receive to completion with `poll(2)`.
    fn transfer(
        &mut self,
        send: Option<(usize, &[u8])>,
        recv: Option<(usize, Sink<'_>)>,
    ) -> Result<()> {
        let res = self.transfer_inner(send, recv);
        if let Err(e) = &res {
            if let Some(failed) = failed_rank(e) {
                self.abort(failed);
            }
        }
        res
    }

    fn transfer_inner(
        &mut self,
        send: Option<(usize, &[u8])>,
        recv: Option<(usize, Sink<'_>)>,
    ) -> Result<()> {
        if let Some((to, msg)) = send {
            self.check_peer(to)?;
            if msg.len() as u64 > self.max_frame {
                return Err(Error::FrameTooLarge {
                    peer: to,
                    len: msg.len() as u64,
                    max: self.max_frame,
                });
            }
        }
        if let Some((from, _)) = &recv {
            self.check_peer(*from)?;
        }
        let header = send.map(|(_, m)| FrameHeader::Data(m.len() as u32).encode());
        let mut sent = 0usize; // bytes of header + payload written
        let send_total = send.map_or(0, |(_, m)| FRAME_HEADER_LEN + m.len());

        let mut rhead = [0u8; FRAME_HEADER_LEN];
        let mut rgot = 0usize; // header bytes, then header + payload bytes
        let mut rtotal: Option<usize> = None; // header + payload, once the header is known
        let (recv_from, mut sink) = match recv {
            Some((f, s)) => (Some(f), Some(s)),
            None => (None, None),
        };
        let mut last_progress = Instant::now();
        self.partial_send = send.map(|(to, _)| to);

        loop {
            let mut progressed = false;
            let mut want_out = false;
            let mut want_in = false;
            // Send side.
            if let (Some((to, msg)), Some(h)) = (send, header.as_ref()) {
                while sent < send_total {
                    let stream = self.peers[to].as_mut().expect("checked peer");
                    let r = if sent < FRAME_HEADER_LEN {
                        stream.write_vectored(&[IoSlice::new(&h[sent..]), IoSlice::new(msg)])
                    } else {
                        stream.write(&msg[sent - FRAME_HEADER_LEN..])
                    };
                    match r {
                        Ok(0) => {
                            return Err(Error::PeerClosed {
                                peer: to,
                                op: Op::Send,
                            })
                        }
                        Ok(k) => {
                            sent += k;
                            progressed = true;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            want_out = true;
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(io_error(to, Op::Send, e)),
                    }
                }
            }
            // Receive side.
            if let (Some(from), Some(sink)) = (recv_from, sink.as_mut()) {
                loop {
                    if rtotal == Some(rgot) {
                        break;
                    }
                    let stream = self.peers[from].as_mut().expect("checked peer");
                    let r = if rgot < FRAME_HEADER_LEN {
                        stream.read(&mut rhead[rgot..])
                    } else {
                        let off = rgot - FRAME_HEADER_LEN;
                        let end = rtotal.expect("header parsed") - FRAME_HEADER_LEN;
                        match sink {
                            Sink::Vec(v) => stream.read(&mut v[off..end]),
                            Sink::Slice(s) => stream.read(&mut s[off..end]),
                        }
                    };
                    match r {
                        Ok(0) => {
                            return Err(Error::PeerClosed {
                                peer: from,
                                op: Op::Recv,
                            })
                        }
                        Ok(k) => {
                            rgot += k;
                            progressed = true;
                            if rgot == FRAME_HEADER_LEN && rtotal.is_none() {
                                let len = self.parse_header(from, &rhead)?;
                                match sink {
                                    Sink::Vec(v) => {
                                        v.clear();
                                        v.resize(len, 0);
                                    }
                                    Sink::Slice(s) if s.len() != len => {
                                        return Err(Error::SizeMismatch {
                                            peer: from,
                                            expected: s.len(),
                                            got: len,
                                        });
                                    }
                                    Sink::Slice(_) => {}
                                }
                                rtotal = Some(FRAME_HEADER_LEN + len);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            want_in = true;
                            break;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(io_error(from, Op::Recv, e)),
                    }
                }
            }
            if !want_in && !want_out {
                break;
            }
            let now = Instant::now();
            if progressed {
                last_progress = now;
            }
            let left = self
                .timeout
                .saturating_sub(now.duration_since(last_progress));
            if left.is_zero() {
                return Err(
                    self.stall_error(want_in.then_some(recv_from).flatten(), send.map(|s| s.0))
                );
            }
            let mut fds = Vec::with_capacity(2);
            if want_out {
                let (to, _) = send.expect("sending");
                fds.push(libc::pollfd {
                    fd: self.fd(to),
                    events: libc::POLLOUT,
                    revents: 0,
                });
            }
            if want_in {
                let from = recv_from.expect("receiving");
                fds.push(libc::pollfd {
                    fd: self.fd(from),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: `fds` is a valid, initialised array of `fds.len()` pollfd structs that
            // lives across the call; poll only writes their `revents` fields.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    let peer = recv_from.or(send.map(|s| s.0)).unwrap_or(self.rank);
                    return Err(Error::Io {
                        peer,
                        op: Op::Recv,
                        source: e,
                    });
                }
            }
        }
        if let Some((_, msg)) = send {
            self.bytes_sent += msg.len() as u64;
        }
        self.partial_send = None;
        Ok(())
    }

    fn parse_header(&self, from: usize, h: &[u8; FRAME_HEADER_LEN]) -> Result<usize> {
        match FrameHeader::decode(h, self.max_frame) {
            Ok(FrameHeader::Data(len)) => Ok(len as usize),
            Ok(FrameHeader::Abort(failed)) => {
                let failed = failed as usize;
                if failed < self.world_size {
                    Err(Error::PeerFailed {
                        peer: failed,
                        reported_by: from,
                    })
                } else {
                    Err(Error::BadFrame {
                        peer: from,
                        what: "abort names no rank of this job",
                    })
                }
            }
            Err(FrameError::TooLarge(len)) => Err(Error::FrameTooLarge {
                peer: from,
                len,
                max: self.max_frame,
            }),
            Err(_) => Err(Error::BadFrame {
                peer: from,
                what: "bad magic",
            }),
        }
    }

    fn stall_error(&self, recv_from: Option<usize>, send_to: Option<usize>) -> Error {
        match (recv_from, send_to) {
            (Some(from), _) => Error::Timeout {
                peer: from,
                op: Op::Recv,
                after: self.timeout,
            },
            (None, Some(to)) => Error::Timeout {
                peer: to,
                op: Op::Send,
                after: self.timeout,
            },
            (None, None) => Error::Timeout {
                peer: self.rank,
                op: Op::Recv,
                after: self.timeout,
            },
        }
    }

    fn fd(&self, peer: usize) -> i32 {
        self.peers[peer].as_ref().expect("checked peer").as_raw_fd()
    }

    /// Tells every other rank that `failed` failed (best effort, never blocks), then stops
    /// using the connections. Called automatically when a call fails because of a peer.
    pub fn abort(&mut self, failed: usize) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        let frame = FrameHeader::Abort(failed as u32).encode();
        for (r, p) in self.peers.iter_mut().enumerate() {
            if let Some(s) = p {
                if r != failed && Some(r) != self.partial_send {
                    // Non-blocking: a full buffer simply loses the notice; the peer then
                    // learns of the failure from its own deadline.
                    let _ = s.write(&frame);
                }
                let _ = s.shutdown(Shutdown::Write);
            }
        }
    }
}

impl Transport for Tcp {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn send(&mut self, to: usize, msg: &[u8]) -> Result<()> {
        self.transfer(Some((to, msg)), None)
    }

    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.transfer(None, Some((from, Sink::Vec(buf))))
    }

    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.transfer(Some((to, msg)), Some((from, Sink::Vec(buf))))
    }

    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        self.transfer(None, Some((from, Sink::Slice(out))))
    }

    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        self.transfer(Some((to, msg)), Some((from, Sink::Slice(out))))
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }
}

/// Builds a whole world on 127.0.0.1 in this process (one thread per rank during the
/// rendezvous), for tests and benchmarks. Rank 0's listener binds port 0.
pub fn loopback_world(n: usize) -> Result<Vec<Tcp>> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| rendezvous(format!("bind: {e}")))?;
    let master = listener
        .local_addr()
        .map_err(|e| rendezvous(format!("bind: {e}")))?;
    let token = format!("loopback-{:016x}", rand::random::<u64>());
    let handles: Vec<_> = (1..n)
        .map(|r| {
            let cfg = TcpConfig::new(r, n, master, token.clone());
            std::thread::spawn(move || Tcp::connect(&cfg))
        })
        .collect();
    let mut world = vec![Tcp::connect_rank0(
        listener,
        &TcpConfig::new(0, n, master, token),
    )?];
    for h in handles {
        world.push(
            h.join()
                .map_err(|_| rendezvous("a rank's thread panicked".into()))??,
        );
    }
    Ok(world)
}

/// The rank whose failure an error reports, if the error is about a peer's health.
fn failed_rank(e: &Error) -> Option<usize> {
    match e {
        Error::Timeout { peer, .. }
        | Error::PeerClosed { peer, .. }
        | Error::Io { peer, .. }
        | Error::BadFrame { peer, .. }
        | Error::FrameTooLarge { peer, .. }
        | Error::PeerFailed { peer, .. } => Some(*peer),
        _ => None,
    }
}

fn io_error(peer: usize, op: Op, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionAborted => Error::PeerClosed { peer, op },
        _ => Error::Io {
            peer,
            op,
            source: e,
        },
    }
}

fn rendezvous(reason: String) -> Error {
    Error::Rendezvous { reason }
}

fn check_cfg(cfg: &TcpConfig) -> Result<()> {
    if cfg.world_size == 0 || cfg.rank >= cfg.world_size {
        return Err(Error::InvalidRank {
            rank: cfg.rank,
            world_size: cfg.world_size,
        });
    }
    if cfg.world_size > u32::MAX as usize {
        return Err(rendezvous("world size too large".into()));
    }
    if cfg.token.len() > frame::MAX_TOKEN {
        return Err(rendezvous(format!(
            "token longer than {} bytes",
            frame::MAX_TOKEN
        )));
    }
    Ok(())
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Connects to `addr`, retrying while it refuses (its listener may not be up yet).
fn connect_before(addr: SocketAddr, deadline: Instant, peer: usize) -> Result<TcpStream> {
    loop {
        match TcpStream::connect_timeout(&addr, remaining(deadline)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::Rendezvous {
                    reason: format!("cannot reach rank {peer} at {addr}: {e}"),
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Accepts one connection before the deadline (the listener is polled, never blocks past it).
fn accept_before(
    listener: &TcpListener,
    deadline: Instant,
    why_late: impl Fn() -> String,
) -> Result<(TcpStream, SocketAddr)> {
    listener
        .set_nonblocking(true)
        .map_err(|e| rendezvous(format!("listener: {e}")))?;
    loop {
        match listener.accept() {
            Ok((s, a)) => {
                s.set_nonblocking(false)
                    .map_err(|e| rendezvous(format!("accepted socket: {e}")))?;
                return Ok((s, a));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(rendezvous(why_late()));
                }
                let mut fd = libc::pollfd {
                    fd: listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ms = remaining(deadline).as_millis().clamp(1, 100) as i32;
                // SAFETY: one valid pollfd that outlives the call.
                unsafe { libc::poll(&mut fd, 1, ms) };
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(rendezvous(format!("accept: {e}"))),
        }
    }
}

/// Reads and checks a handshake; a stranger gets at most a short deadline.
fn read_hello(
    stream: &mut TcpStream,
    cfg: &TcpConfig,
    want: HelloKind,
) -> std::result::Result<Hello, String> {
    let limit = cfg.timeout.min(Duration::from_secs(5));
    stream
        .set_read_timeout(Some(limit))
        .map_err(|e| e.to_string())?;
    let mut fixed = [0u8; HELLO_FIXED_LEN];
    stream
        .read_exact(&mut fixed)
        .map_err(|e| format!("handshake unreadable ({e})"))?;
    let (mut hello, token_len) =
        Hello::decode_fixed(&fixed).map_err(|e| format!("malformed handshake ({e:?})"))?;
    let mut token = vec![0u8; token_len];
    stream
        .read_exact(&mut token)
        .map_err(|e| format!("handshake token unreadable ({e})"))?;
    if !constant_time_eq(&token, cfg.token.as_bytes()) {
        return Err("wrong token".into());
    }
    hello.token = token;
    if hello.kind != want {
        return Err(format!("unexpected handshake kind {:?}", hello.kind));
    }
    if hello.world_size as usize != cfg.world_size {
        return Err(format!(
            "world size {} differs from ours ({})",
            hello.world_size, cfg.world_size
        ));
    }
    if hello.rank == 0 || hello.rank as usize >= cfg.world_size {
        return Err(format!("rank {} out of range", hello.rank));
    }
    Ok(hello)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn encode_addr(out: &mut Vec<u8>, a: SocketAddr) {
    let (tag, bytes) = match a.ip() {
        IpAddr::V4(v4) => (4u8, v4.to_ipv6_mapped().octets()),
        IpAddr::V6(v6) => (6u8, v6.octets()),
    };
    out.push(tag);
    out.extend_from_slice(&bytes);
    out.extend_from_slice(&a.port().to_le_bytes());
}

fn decode_addr(b: &[u8]) -> SocketAddr {
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&b[1..17]);
    let v6 = Ipv6Addr::from(octets);
    let ip = match (b[0], v6.to_ipv4_mapped()) {
        (4, Some(v4)) => IpAddr::V4(v4),
        _ => IpAddr::V6(v6),
    };
    SocketAddr::new(ip, u16::from_le_bytes([b[17], b[18]]))
}

fn set_buffers(s: &TcpStream, size: usize) {
    let v = size.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: a valid socket fd, a pointer to a live c_int and its exact size.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<F, R>(world: Vec<Tcp>, f: F) -> Vec<R>
    where
        F: Fn(Tcp) -> R + Send + Sync + Copy + 'static,
        R: Send + 'static,
    {
        let hs: Vec<_> = world
            .into_iter()
            .map(|t| std::thread::spawn(move || f(t)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn mesh_exchanges_large_messages_full_duplex() {
        // 8 MiB each way in one ring step: far beyond socket buffers.
        let n = 3;
        let got = run(loopback_world(n).unwrap(), |mut t| {
            let me = t.rank();
            let n = t.world_size();
            let msg = vec![me as u8; 8 << 20];
            let mut buf = Vec::new();
            t.send_recv((me + 1) % n, &msg, (me + n - 1) % n, &mut buf)
                .unwrap();
            let mut out = vec![0u8; 8 << 20];
            t.send_recv_into((me + n - 1) % n, &msg, (me + 1) % n, &mut out)
                .unwrap();
            (buf.len(), buf[0], out[0], t.bytes_sent())
        });
        for (me, (len, left, right, sent)) in got.into_iter().enumerate() {
            assert_eq!(len, 8 << 20);
            assert_eq!(left as usize, (me + n - 1) % n);
            assert_eq!(right as usize, (me + 1) % n);
            assert_eq!(sent, 16 << 20);
        }
    }

    #[test]
    fn every_pair_talks_and_empty_messages_work() {
        let n = 4;
        let got = run(loopback_world(n).unwrap(), |mut t| {
            let me = t.rank();
            let mut sum = 0usize;
            for p in 0..t.world_size() {
                if p != me {
                    let mut buf = Vec::new();
                    t.send_recv(p, &[me as u8; 3], p, &mut buf).unwrap();
                    sum += buf[0] as usize;
                    t.send_recv(p, &[], p, &mut buf).unwrap();
                    assert!(buf.is_empty());
                }
            }
            sum
        });
        for (me, s) in got.into_iter().enumerate() {
            assert_eq!(s, (0..n).sum::<usize>() - me);
        }
    }

    #[test]
    fn dead_peer_is_named_and_others_learn_it() {
        let world = loopback_world(3).unwrap();
        let got = run(world, |mut t| {
            t.set_timeout(Duration::from_secs(10));
            match t.rank() {
                2 => {
                    drop(t); // rank 2 dies
                    None
                }
                1 => Some(t.recv(2, &mut Vec::new()).unwrap_err()),
                _ => Some(t.recv(1, &mut Vec::new()).unwrap_err()),
            }
        });
        let e1 = got[1].as_ref().unwrap();
        assert_eq!(e1.peer(), Some(2), "{e1}");
        let e0 = got[0].as_ref().unwrap();
        assert_eq!(
            e0.peer(),
            Some(2),
            "rank 0 should learn rank 2 failed: {e0}"
        );
    }

    #[test]
    fn stalled_peer_times_out() {
        let mut world = loopback_world(2).unwrap();
        let mut a = world.remove(0);
        a.set_timeout(Duration::from_millis(100));
        let err = a.recv(1, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, Error::Timeout { peer: 1, .. }), "{err}");
        drop(world);
    }

    #[test]
    fn oversized_and_garbage_frames_are_typed_errors() {
        let mut world = loopback_world(2).unwrap();
        let mut b = world.pop().unwrap();
        let mut a = world.pop().unwrap();
        b.max_frame = 16;
        a.send(1, &[0u8; 17]).unwrap();
        let err = b.recv(0, &mut Vec::new()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::FrameTooLarge {
                    peer: 0,
                    len: 17,
                    max: 16
                }
            ),
            "{err}"
        );

        let mut world = loopback_world(2).unwrap();
        let mut b = world.pop().unwrap();
        let a = world.pop().unwrap();
        a.peers[1].as_ref().unwrap().write_all(b"garbage!").unwrap();
        let err = b.recv(0, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, Error::BadFrame { peer: 0, .. }), "{err}");
    }

    #[test]
    fn strangers_are_refused_and_the_job_goes_on() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let master = listener.local_addr().unwrap();
        // A wrong token and random bytes arrive first.
        let mut wrong = TcpStream::connect(master).unwrap();
        let bad = Hello {
            kind: HelloKind::Hello,
            rank: 1,
            world_size: 2,
            port: 1,
            token: b"nope".to_vec(),
        };
        wrong.write_all(&bad.encode()).unwrap();
        let mut junk = TcpStream::connect(master).unwrap();
        junk.write_all(&[0xAB; 64]).unwrap();
        let cfg1 = TcpConfig::new(1, 2, master, "right");
        let h = std::thread::spawn(move || Tcp::connect(&cfg1));
        let mut a = Tcp::connect_rank0(listener, &TcpConfig::new(0, 2, master, "right")).unwrap();
        let mut b = h.join().unwrap().unwrap();
        a.send(1, b"hi").unwrap();
        let mut buf = Vec::new();
        b.recv(0, &mut buf).unwrap();
        assert_eq!(buf, b"hi");
    }

    #[test]
    fn addr_table_round_trip() {
        for a in ["127.0.0.1:5", "[::1]:65535", "10.1.2.3:29500"] {
            let a: SocketAddr = a.parse().unwrap();
            let mut v = Vec::new();
            encode_addr(&mut v, a);
            assert_eq!(decode_addr(&v), a);
        }
    }
}
