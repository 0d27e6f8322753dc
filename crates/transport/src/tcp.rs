//! `tcp`: a full mesh of TCP connections between the ranks of a job.
//!
//! Rendezvous goes through rank 0 at the master address (like a TCP store): every rank binds
//! its own listener on port 0 (no fixed port ranges, so parallel jobs never collide), joins
//! rank 0 and gets back the table of listening addresses; then each
//! rank connects to the lower ranks and accepts the higher ones. Every connection opens with
//! a mutual challenge-response on the shared token (`GRADWIRE_TOKEN`; HMAC-SHA256, the token
//! never crosses the wire, the connecting side proves first so a stranger who connects learns
//! nothing derived from it), bound to the job's identity ([`TcpConfig::job`]; rank 0 adds a
//! random identity of the mesh for the connections between the other ranks), so a stranger
//! can neither join nor pose as rank 0, and a rank of an earlier job cannot join this one. A
//! connection that fails it, sends garbage or stays silent is dropped while the job goes on:
//! the accepting rank runs all pending handshakes at once, each with its own deadline
//! ([`TcpConfig::handshake_timeout`]), keeps connections that sent a valid hello ahead of
//! those that did not, and logs what it drops as counts, at most a line per interval. A
//! connecting rank whose handshake fails (an impostor answered, or rank 0 closed the
//! connection) tries again until its deadline.
//!
//! An empty token is refused when the master address is not loopback ([`Error::NoToken`])
//! unless [`TcpConfig::insecure`] (`GRADWIRE_INSECURE=1`); on loopback it runs with one
//! warning line.
//!
//! A mesh splits into groups with meshes of their own ([`crate::split`]; `tcp::split`).
//!
//! Modules: `rendezvous` (address table exchange), `split` (a group's mesh), [`auth`] (the handshake's messages and
//! proofs as state machines), `handshake` (them over sockets, and the concurrent accepting
//! gate), `refusals` (the rate-limited log of dropped connections), `duplex` (the data path),
//! `sys` (system calls and socket options), [`frame`] (every wire format, pure and fuzzed).
//!
//! Data moves in frames ([`frame`]) whose length is checked against [`TcpConfig::max_frame`]
//! before anything is allocated. All sockets are non-blocking and driven by `poll(2)`, so
//! [`Transport::send_recv`] is full duplex (a ring step never deadlocks, whatever the message
//! size) and every call has a deadline: no progress for [`TcpConfig::timeout`] gives
//! [`Error::Timeout`] naming the peer. When a call fails because of a peer, this rank tells
//! every other rank (an abort frame), so the whole job learns which rank failed within one
//! deadline instead of timing out one after another.
//!
//! Waiting: a receive with nothing to read may poll its socket again without sleeping for
//! [`TcpConfig::spin`] (`GRADWIRE_TCP_SPIN_US`) before it sleeps in `poll(2)`, which saves the
//! scheduler round trip of a wake-up when the peer runs on another core (what Open MPI's
//! busy polling buys). The default ([`default_spin`]) spins 20 us when the job's ranks fit
//! on this machine's cores (world size at most the available parallelism), and not at all
//! otherwise: a spinning rank holds off the peer it waits for whenever the two share a core.
//! Measured (2-core VM, `scripts/bench-openmpi.sh`, 4 KiB all-reduce, Open MPI's time over
//! ours, three runs each back to back, 2026-12-01): P = 2 idle, no spin 1.11x, 1.41x, 0.87x; 20 us
//! 1.81x, 2.66x, 3.15x. P = 2 loaded (load average 10, `examples/allreduce_procs.rs`): 50 us
//! took 4 KiB from 17-19 us to 11-127 us, which is why the default never spins when the
//! ranks outnumber the cores (P = 4 here), and why `GRADWIRE_TCP_SPIN_US=0` turns it off.

pub mod auth;
#[cfg(test)]
mod capture;
mod duplex;
pub mod frame;
mod handshake;
mod refusals;
mod rendezvous;
pub mod service;
mod split;
mod sys;

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use crate::{Error, Op, Result, SplitStep, Transport, DEFAULT_TIMEOUT};

use duplex::Sink;
use sys::set_buffers;

/// Largest message accepted by default (1 GiB).
pub const DEFAULT_MAX_FRAME: u64 = 1 << 30;
/// Default deadline of one connection's whole handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// How a rank joins a TCP job.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Where rank 0 listens for the rendezvous.
    pub master: SocketAddr,
    /// The shared secret every rank presents. Empty: refused unless the master address is
    /// loopback or [`TcpConfig::insecure`] is set.
    pub token: String,
    /// The job's identity, the same on every rank and different for every job (`gradwire
    /// launch` sets a random one, `GRADWIRE_JOB_ID`; other launchers name their jobs, see
    /// [`crate::env::job_identity_from`]): a rank with another identity is refused at the
    /// handshake. Empty when no launcher named the job (rank 0's random mesh identity still
    /// binds the connections between the other ranks).
    pub job: String,
    /// Run with an empty token although the master address is not loopback
    /// (`GRADWIRE_INSECURE=1`): any host that reaches the job's ports can then join it.
    pub insecure: bool,
    /// Deadline of every blocking call (no progress for this long is an error).
    pub timeout: Duration,
    /// Largest accepted message in bytes.
    pub max_frame: u64,
    /// Socket send/receive buffer size in bytes; `None` keeps the kernel's autotuning.
    pub socket_buffer: Option<usize>,
    /// Deadline of one connection's whole handshake (capped by `timeout`); a stranger that
    /// has not proved the token by then is dropped.
    pub handshake_timeout: Duration,
    /// How long a waiting receive polls its socket without sleeping (module doc; by default
    /// [`default_spin`] of the world size and this machine's cores).
    pub spin: Duration,
}

/// The default receive spin: 20 us when `world_size` ranks fit on `cores` cores (so no
/// rank ever spins on a core its peer needs, whatever the placement), zero otherwise (and for
/// one rank, which never waits).
pub fn default_spin(world_size: usize, cores: usize) -> Duration {
    if world_size >= 2 && world_size <= cores {
        Duration::from_micros(20)
    } else {
        Duration::ZERO
    }
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
            job: String::new(),
            insecure: false,
            timeout: DEFAULT_TIMEOUT,
            max_frame: DEFAULT_MAX_FRAME,
            socket_buffer: None,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            spin: default_spin(
                world_size,
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            ),
        }
    }

    /// The deadline of one connection's handshake.
    fn handshake_limit(&self) -> Duration {
        self.handshake_timeout.min(self.timeout)
    }
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
    /// The ring step in flight between [`SplitStep::post`] and [`SplitStep::complete_into`].
    posted: Option<duplex::Posted>,
    /// How long a waiting receive spins before `poll(2)`.
    spin: Duration,
    /// What a split needs to form a group's mesh (see [`crate::split`]).
    split: split::SplitBase,
}

impl Tcp {
    /// Joins the job described by `cfg`: rank 0 binds the master address, the others connect
    /// to it. Returns when the full mesh is up.
    pub fn connect(cfg: &TcpConfig) -> Result<Tcp> {
        if cfg.rank == 0 {
            refuse_no_token(cfg)?;
            let listener = TcpListener::bind(cfg.master).map_err(|e| Error::Rendezvous {
                reason: format!("rank 0 cannot listen on {}: {e}", cfg.master),
            })?;
            Self::connect_rank0(listener, cfg)
        } else {
            Self::connect_other(cfg)
        }
    }

    /// The transport over a formed mesh; `identity` binds its connections (the job's and
    /// the mesh's digests; a group's derives from it).
    fn finish(
        cfg: &TcpConfig,
        peers: Vec<Option<TcpStream>>,
        identity: [u8; frame::JOB_LEN],
    ) -> Result<Tcp> {
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
            posted: None,
            spin: cfg.spin,
            split: split::SplitBase::new(cfg, identity),
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
}

impl Transport for Tcp {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn send(&mut self, to: usize, msg: &[u8]) -> Result<()> {
        self.transfer(Some((to, &[msg])), None)
    }

    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.transfer(None, Some((from, Sink::Vec(buf))))
    }

    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.transfer(Some((to, &[msg])), Some((from, Sink::Vec(buf))))
    }

    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        self.transfer(None, Some((from, Sink::Slice(out))))
    }

    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        self.transfer(Some((to, &[msg])), Some((from, Sink::Slice(out))))
    }

    /// One frame, its header and every piece written with vectored writes (no assembly).
    fn send_recv_parts(
        &mut self,
        to: usize,
        parts: &[&[u8]],
        from: usize,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.transfer(Some((to, parts)), Some((from, Sink::Vec(buf))))
    }

    /// Vectored writes out, reads straight into the pieces.
    fn send_recv_parts_into(
        &mut self,
        to: usize,
        parts: &[&[u8]],
        from: usize,
        out: &mut [&mut [u8]],
    ) -> Result<()> {
        self.transfer(Some((to, parts)), Some((from, Sink::Pieces(out))))
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

    fn split_step(&mut self) -> Option<&mut dyn SplitStep> {
        Some(self)
    }

    fn splitter(&mut self) -> Option<&mut dyn crate::split::Split> {
        Some(self)
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
    let job = format!("loopback-{:032x}", rand::random::<u128>());
    let config = |r: usize| TcpConfig {
        job: job.clone(),
        ..TcpConfig::new(r, n, master, token.clone())
    };
    let handles: Vec<_> = (1..n)
        .map(|r| {
            let cfg = config(r);
            std::thread::spawn(move || Tcp::connect(&cfg))
        })
        .collect();
    let mut world = vec![Tcp::connect_rank0(listener, &config(0))?];
    for h in handles {
        world.push(
            h.join()
                .map_err(|_| rendezvous("a rank's thread panicked".into()))??,
        );
    }
    Ok(world)
}

fn rendezvous(reason: String) -> Error {
    Error::Rendezvous { reason }
}

/// An empty token with a master address off loopback: refused unless `insecure`.
fn refuse_no_token(cfg: &TcpConfig) -> Result<()> {
    if cfg.token.is_empty() && !cfg.master.ip().is_loopback() && !cfg.insecure {
        return Err(Error::NoToken { master: cfg.master });
    }
    Ok(())
}

/// Checks a config before the rendezvous; an empty token (allowed) is one warning line.
fn check_cfg(cfg: &TcpConfig) -> Result<()> {
    crate::check_rank(cfg.rank, cfg.world_size)?;
    if cfg.world_size > u32::MAX as usize {
        return Err(rendezvous("world size too large".into()));
    }
    if cfg.max_frame > frame::MAX_FRAME_LIMIT {
        return Err(rendezvous(format!(
            "max_frame {} exceeds what a frame header can carry ({} bytes)",
            cfg.max_frame,
            frame::MAX_FRAME_LIMIT
        )));
    }
    refuse_no_token(cfg)?;
    if cfg.token.is_empty() {
        let reach = if cfg.master.ip().is_loopback() {
            "any local user"
        } else {
            "any host that reaches it (GRADWIRE_INSECURE=1)"
        };
        tracing::warn!(
            master = %cfg.master,
            "GRADWIRE_TOKEN is not set: {reach} can join this job"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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

    /// A message sent in pieces arrives as their concatenation: more pieces than one
    /// `writev` takes, empty pieces, and pieces of several MiB (partial writes mid-piece);
    /// bytes_sent counts the payload; a reused receive buffer that shrinks and grows again
    /// holds exactly each message, and so do receive pieces cut differently from the sent
    /// ones; pieces of the wrong total and an oversized message are typed errors.
    #[test]
    fn pieces_arrive_as_their_concatenation() {
        let n = 3;
        let got = run(loopback_world(n).unwrap(), move |mut t| {
            let me = t.rank();
            let (to, from) = ((me + 1) % n, (me + n - 1) % n);
            // Piece i of sender r: i*7 + r bytes of value (r * 40 + i) (piece 0 empty for r 0).
            let pieces_of = |r: usize, count: usize, big: bool| -> Vec<Vec<u8>> {
                (0..count)
                    .map(|i| {
                        let len = if big && i % 5 == 2 {
                            (3 << 20) + i
                        } else {
                            i * 7 + r
                        };
                        vec![(r * 40 + i) as u8; len]
                    })
                    .collect()
            };
            let mut buf = Vec::new();
            let mut checked = 0;
            for (count, big) in [(40, false), (1, false), (0, false), (23, true), (3, false)] {
                let mine = pieces_of(me, count, big);
                let refs: Vec<&[u8]> = mine.iter().map(Vec::as_slice).collect();
                let before = t.bytes_sent();
                t.send_recv_parts(to, &refs, from, &mut buf).unwrap();
                let sent: usize = mine.iter().map(Vec::len).sum();
                assert_eq!(t.bytes_sent() - before, sent as u64);
                let want: Vec<u8> = pieces_of(from, count, big).concat();
                assert_eq!(buf.len(), want.len(), "count {count} big {big}");
                assert!(buf == want, "count {count} big {big}: bytes differ");
                // The same message read straight into pieces of other sizes (empty ones
                // included), as the receiver cuts them.
                let mut cuts: Vec<Vec<u8>> = Vec::new();
                let mut left = want.len();
                for i in 0.. {
                    let n = [0usize, 1, 5, 4096, 3 << 20][i % 5].min(left);
                    cuts.push(vec![0xEE; n]);
                    left -= n;
                    if left == 0 {
                        break;
                    }
                }
                let mut outs: Vec<&mut [u8]> = cuts.iter_mut().map(Vec::as_mut_slice).collect();
                t.send_recv_parts_into(to, &refs, from, &mut outs).unwrap();
                assert!(
                    cuts.concat() == want,
                    "count {count} big {big}: pieces differ"
                );
                checked += 1;
            }
            // Pieces that do not add up to the message: a typed error naming the sender.
            let mut short = [0u8; 3];
            let err = t
                .send_recv_parts_into(to, &[&[1u8; 4][..]], from, &mut [&mut short[..]])
                .unwrap_err();
            assert!(
                matches!(err, Error::SizeMismatch { peer, expected: 3, got: 4 } if peer == from),
                "{err}"
            );
            t.max_frame = 1000;
            let err = t
                .send_recv_parts(to, &[&[0u8; 600][..], &[0u8; 600][..]], from, &mut buf)
                .unwrap_err();
            assert!(
                matches!(err, Error::FrameTooLarge { len: 1200, .. }),
                "{err}"
            );
            checked
        });
        assert_eq!(got, vec![5; n]);
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

    /// A rank whose send completed and whose receive then met a dead peer still tells the
    /// peer it sent to which rank died: rank 0 sends to rank 1 and receives from the dead
    /// rank 2 in one call; rank 1, receiving from rank 0, learns that rank 2 failed (not that
    /// rank 0 closed).
    #[test]
    fn failure_after_a_whole_send_is_reported_to_its_receiver() {
        let world = loopback_world(3).unwrap();
        let got = run(world, |mut t| {
            t.set_timeout(Duration::from_secs(10));
            let (me, n) = (t.rank(), t.world_size());
            let mut buf = Vec::new();
            for i in 0..3u8 {
                t.send_recv((me + 1) % n, &[me as u8, i], (me + n - 1) % n, &mut buf)
                    .unwrap();
                assert_eq!(buf, [((me + n - 1) % n) as u8, i]);
            }
            match me {
                2 => {
                    drop(t); // rank 2 dies
                    None
                }
                0 => Some(t.send_recv(1, &[7; 100], 2, &mut buf).unwrap_err()),
                _ => {
                    t.recv(0, &mut buf).unwrap();
                    assert_eq!(buf, [7; 100]);
                    Some(t.recv(0, &mut buf).unwrap_err())
                }
            }
        });
        let e0 = got[0].as_ref().unwrap();
        assert_eq!(e0.peer(), Some(2), "{e0}");
        let e1 = got[1].as_ref().unwrap();
        assert!(
            matches!(
                e1,
                Error::PeerFailed {
                    peer: 2,
                    reported_by: 0
                }
            ),
            "rank 1 should learn from rank 0 that rank 2 failed: {e1}"
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

    /// The default spins only when the ranks fit on the cores.
    #[test]
    fn default_spin_only_when_the_ranks_fit_on_the_cores() {
        assert_eq!(default_spin(1, 8), Duration::ZERO);
        assert_eq!(default_spin(2, 2), Duration::from_micros(20));
        assert_eq!(default_spin(4, 16), Duration::from_micros(20));
        assert_eq!(default_spin(3, 2), Duration::ZERO);
        assert_eq!(default_spin(4, 2), Duration::ZERO);
    }

    /// A spinning receive delivers what arrives, and a spin longer than the deadline still
    /// ends in the deadline's error, naming the stalled peer, in bounded time.
    #[test]
    fn spinning_receive_delivers_and_keeps_the_deadline() {
        let mut world = loopback_world(2).unwrap();
        for t in &mut world {
            t.spin = Duration::from_millis(2);
        }
        let got = run(world, |mut t| {
            let peer = 1 - t.rank();
            let mut buf = Vec::new();
            for len in [0usize, 1, 4096, 300_000] {
                let msg: Vec<u8> = (0..len).map(|k| (k * 7 + t.rank()) as u8).collect();
                t.send_recv(peer, &msg, peer, &mut buf).unwrap();
                let want: Vec<u8> = (0..len).map(|k| (k * 7 + peer) as u8).collect();
                assert_eq!(buf, want, "rank {} len {len}", t.rank());
            }
            t
        });
        let mut world = got;
        let mut a = world.remove(0);
        a.spin = Duration::from_secs(30);
        a.set_timeout(Duration::from_millis(100));
        let t0 = std::time::Instant::now();
        let err = a.recv(1, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, Error::Timeout { peer: 1, .. }), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
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
    fn split_steps_move_large_messages_and_refuse_misuse() {
        let n = 3;
        let got = run(loopback_world(n).unwrap(), |mut t| {
            let me = t.rank();
            let n = t.world_size();
            let (to, from) = ((me + 1) % n, (me + n - 1) % n);
            let mut outs = vec![vec![0u8; 4 << 20]; 3];
            for (i, out) in outs.iter_mut().enumerate() {
                let msg = vec![(me * 10 + i) as u8; 4 << 20];
                let ss = t.split_step().unwrap();
                ss.post(to, &msg, from).unwrap();
                if i == 0 {
                    let e = ss.post(to, &msg, from).unwrap_err();
                    assert!(matches!(e, Error::Misuse { .. }), "{e}");
                }
                ss.complete_into(&msg, out).unwrap();
            }
            let e = t
                .split_step()
                .unwrap()
                .complete_into(&[], &mut [])
                .unwrap_err();
            assert!(matches!(e, Error::Misuse { .. }), "{e}");
            (
                outs.iter().map(|o| o[0]).collect::<Vec<_>>(),
                t.bytes_sent(),
            )
        });
        for (me, (firsts, sent)) in got.into_iter().enumerate() {
            let from = (me + n - 1) % n;
            assert_eq!(
                firsts,
                vec![
                    (from * 10) as u8,
                    (from * 10 + 1) as u8,
                    (from * 10 + 2) as u8
                ]
            );
            assert_eq!(sent, 12 << 20);
        }
    }
}
