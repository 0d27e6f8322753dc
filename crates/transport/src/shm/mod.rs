//! `shm`: ranks on one host talking through shared memory.
//!
//! Every ordered pair of ranks `(src, dst)` has one single-producer single-consumer byte ring
//! in a file `<dir>/gradwire-<job>-<src>-<dst>` (`dir` is `/dev/shm`, `job` a hash of the job
//! token, so the secret never shows in a file name). Messages are framed in the ring as an
//! 8-byte length and the payload; a message larger than the ring streams through it in
//! pieces, so any size works with a fixed ring. [`Transport::send_recv`] moves pieces of both
//! directions in turn and never deadlocks.
//!
//! Setup: rank 0 creates every ring file (under a temporary name, renamed into place, mode
//! 0600); each rank maps the rings it writes and reads, claims its end in the header with its
//! pid, and waits (until the deadline) for the peer at the other end. Once both ends are in,
//! the files are unlinked: the mappings stay, nothing is left in `/dev/shm` even if a rank is
//! killed later. Every ring is mapped with its pages faulted in (`MAP_POPULATE`), so no
//! message pays for first touches (they made a 4 KiB all-reduce 3-4x slower for the first
//! megabyte through each ring), unless the job's rings would take more than half the room
//! left in `dir`. Job tokens must be unique per job on a host (`gradwire launch` makes one).
//!
//! Waiting ([`WaitPolicy`]): a rank polls its rings for [`WaitPolicy::spin`], then polls and
//! yields the CPU for [`WaitPolicy::yield_for`], then sleeps on a futex in the ring header
//! until the peer publishes (the peer wakes it; see `ring`). The default does not spin: a
//! rank that shares a core with the peer it waits for would hold that core (measured: see
//! [`WaitPolicy::new`]); yielding at once is what Open MPI does when oversubscribed. While waiting, a rank
//! checks its peer: a peer that dropped its transport gives [`Error::PeerClosed`], a peer
//! process that died (pid gone or a zombie) [`Error::PeerDied`], and no progress for the
//! deadline [`Error::Timeout`] — all naming the peer. A rank that fails that way writes the
//! failed rank into the headers of its outgoing rings, so the rest of the job reports
//! [`Error::PeerFailed`] naming the same rank instead of blaming the messenger. Pids are
//! only meaningful within one pid namespace: ranks in different containers sharing
//! `/dev/shm` still get clean closes and deadlines, but not the death check. The header is shared with another
//! process and checked as untrusted input ([`header::decode`], positions on every access):
//! a bad one is [`Error::BadRing`], never a panic or an out-of-bounds access.

pub mod header;
mod ring;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use header::{HeaderError, RingHeader};
use ring::{OpenError, Ring, Role, STATE_CLOSED, STATE_EMPTY};

use crate::{Error, Op, Result, Transport, DEFAULT_TIMEOUT};

/// Default data bytes per ring (each ordered pair of ranks has one).
pub const DEFAULT_RING_BYTES: u64 = 1 << 20;

/// How a rank joins a shared-memory job.
#[derive(Debug, Clone)]
pub struct ShmConfig {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// The job's token: every rank of a job gives the same, unique on the host.
    pub job: String,
    /// Deadline of every blocking call (no progress for this long is an error), and of setup.
    pub timeout: Duration,
    /// Data bytes per ring: a power of two in 4 KiB..=1 GiB.
    pub ring_bytes: u64,
    /// Largest accepted message in bytes.
    pub max_frame: u64,
    /// Where the ring files live.
    pub dir: PathBuf,
    /// How a rank waits for its peers.
    pub wait: WaitPolicy,
}

/// How a rank waits for a peer: poll, then poll and yield, then sleep (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// How long to poll without giving up the CPU.
    pub spin: Duration,
    /// How long to poll and yield the CPU between polls, after spinning, before sleeping.
    pub yield_for: Duration,
}

impl WaitPolicy {
    /// The default: no spinning, yield for 1 ms, then sleep.
    ///
    /// Measured (`examples/allreduce_procs.rs` of gradwire-collective, 4 KiB all-reduce, two
    /// processes, a 2-core VM under load average 11-12): without pinning the ranks to cores,
    /// spinning 5 us before yielding took 23-27 us per all-reduce and spinning 50 us took
    /// 113-118 us, against 8-13 us for yielding at once: the ranks often share a core, where
    /// a spinning rank holds off the peer it waits for. Pinned to different cores (as
    /// `mpirun` does), spinning and yielding were within 1 us of each other (7.2-8.2 us).
    /// (Those runs predate the rings' pages being faulted in at setup, which every figure
    /// here included; with them faulted in, pinned and spinning took 1.8-2.7 us.)
    pub fn new() -> WaitPolicy {
        WaitPolicy {
            spin: Duration::ZERO,
            yield_for: Duration::from_millis(1),
        }
    }
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy::new()
    }
}

impl ShmConfig {
    /// A config with default deadline, ring size, frame limit and waiting, in `/dev/shm`.
    pub fn new(rank: usize, world_size: usize, job: impl Into<String>) -> ShmConfig {
        ShmConfig {
            rank,
            world_size,
            job: job.into(),
            timeout: DEFAULT_TIMEOUT,
            ring_bytes: DEFAULT_RING_BYTES,
            max_frame: crate::tcp::DEFAULT_MAX_FRAME,
            dir: PathBuf::from("/dev/shm"),
            wait: WaitPolicy::new(),
        }
    }

    fn job_key(&self) -> u64 {
        // FNV-1a: stable across builds, so every rank derives the same file names.
        self.job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    fn path(&self, src: usize, dst: usize) -> PathBuf {
        self.dir
            .join(format!("gradwire-{:016x}-{src}-{dst}", self.job_key()))
    }

    fn header(&self, src: usize, dst: usize) -> RingHeader {
        RingHeader {
            capacity: self.ring_bytes,
            src: src as u32,
            dst: dst as u32,
            world_size: self.world_size as u32,
            job: self.job_key(),
        }
    }
}

/// Reads a shared-memory config from the process environment (the launcher variables of
/// [`crate::env`]; the job token is `GRADWIRE_TOKEN` plus the master address plus the
/// launcher's job id ([`crate::env::job_id_from`]), so two `mpirun` or `srun` jobs on one
/// host without a token still get different rings), with
/// `GRADWIRE_SHM_RING_BYTES` and `GRADWIRE_SHM_DIR` as options. `Ok(None)` when no launcher
/// set a rank.
pub fn config_from_env() -> Result<Option<ShmConfig>> {
    config_from(|k| std::env::var(k).ok())
}

/// [`config_from_env`] over any variable lookup.
pub fn config_from(get: impl Fn(&str) -> Option<String>) -> Result<Option<ShmConfig>> {
    let Some((tcp, _)) = crate::env::tcp_config_from(&get)? else {
        return Ok(None);
    };
    let mut job = format!("{}@{}", tcp.token, tcp.master);
    if let Some(id) = crate::env::job_id_from(&get) {
        job = format!("{job}#{id}");
    }
    let mut cfg = ShmConfig::new(tcp.rank, tcp.world_size, job);
    cfg.timeout = tcp.timeout;
    if let Some(b) = get("GRADWIRE_SHM_RING_BYTES") {
        cfg.ring_bytes = b
            .trim()
            .parse()
            .ok()
            .filter(|n: &u64| ring_size_ok(*n))
            .ok_or_else(|| Error::Env {
                reason: format!(
                    "GRADWIRE_SHM_RING_BYTES={b} is not a power of two from 4096 to 2^30"
                ),
            })?;
    }
    if let Some(d) = get("GRADWIRE_SHM_DIR") {
        cfg.dir = PathBuf::from(d);
    }
    for (var, field) in [
        ("GRADWIRE_SHM_SPIN_US", &mut cfg.wait.spin),
        ("GRADWIRE_SHM_YIELD_US", &mut cfg.wait.yield_for),
    ] {
        if let Some(v) = get(var) {
            let us: u64 = v.trim().parse().map_err(|_| Error::Env {
                reason: format!("{var}={v} is not a number of microseconds"),
            })?;
            *field = Duration::from_micros(us.min(10_000_000));
        }
    }
    Ok(Some(cfg))
}

/// Whether to fault the rings in at setup: when all `n (n-1)` rings of the job take at most
/// half the room left in their file system (`free`, None: unknown, then no). Rings no
/// algorithm uses (most pairs of a big job) would otherwise take room from the ones in use.
fn should_populate(cfg: &ShmConfig, free: Option<u64>) -> bool {
    let n = cfg.world_size as u64;
    let total = n
        .saturating_mul(n.saturating_sub(1))
        .saturating_mul(cfg.ring_bytes + header::HEADER_LEN as u64);
    free.is_some_and(|f| total <= f / 2)
}

/// Bytes available to us in the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: a zeroed statvfs is a valid out-parameter; `c` is a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; statvfs only writes `st`.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

fn ring_size_ok(n: u64) -> bool {
    n.is_power_of_two() && (header::MIN_CAPACITY..=header::MAX_CAPACITY).contains(&n)
}

/// Removes files on drop unless disarmed (setup that fails leaves nothing behind).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// One rank of a shared-memory job (see the module doc).
pub struct Shm {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    max_frame: u64,
    bytes_sent: u64,
    /// `tx[p]`: the ring we write to rank p (None for ourselves).
    tx: Vec<Option<Ring>>,
    /// `rx[p]`: the ring we read from rank p.
    rx: Vec<Option<Ring>>,
    /// Messages to ourselves.
    loopback: VecDeque<Vec<u8>>,
    /// How we wait for peers.
    wait: WaitPolicy,
}

impl Shm {
    /// Joins the job described by `cfg`: rank 0 creates the rings, every rank waits for its
    /// peers until `cfg.timeout`.
    pub fn connect(cfg: &ShmConfig) -> Result<Shm> {
        let (me, n) = (cfg.rank, cfg.world_size);
        if me >= n {
            return Err(Error::InvalidRank {
                rank: me,
                world_size: n,
            });
        }
        if !ring_size_ok(cfg.ring_bytes) {
            return Err(Error::Rendezvous {
                reason: format!(
                    "ring size {} is not a power of two from 4096 to 2^30",
                    cfg.ring_bytes
                ),
            });
        }
        // Rank 0 removes every ring again if it fails; once it is in, each pair's files
        // are the business of that pair.
        let mut created = Cleanup(Vec::new());
        let mut cleanup = Cleanup(Vec::new());
        if me == 0 {
            for s in 0..n {
                for d in (0..n).filter(|&d| d != s) {
                    let path = cfg.path(s, d);
                    created.0.push(path.clone());
                    Ring::create(&path, &cfg.header(s, d)).map_err(|e| Error::Rendezvous {
                        reason: format!("cannot create {}: {e}", path.display()),
                    })?;
                }
            }
        }
        let populate = should_populate(cfg, free_bytes(&cfg.dir));
        let deadline = Instant::now() + cfg.timeout;
        let mut tx: Vec<Option<Ring>> = (0..n).map(|_| None).collect();
        let mut rx: Vec<Option<Ring>> = (0..n).map(|_| None).collect();
        for p in (0..n).filter(|&p| p != me) {
            cleanup.0.push(cfg.path(me, p));
            cleanup.0.push(cfg.path(p, me));
            tx[p] = Some(open_wait(cfg, me, p, Role::Producer, deadline, populate)?);
            rx[p] = Some(open_wait(cfg, p, me, Role::Consumer, deadline, populate)?);
        }
        // Wait for every peer to claim its ends, then forget the files.
        for p in (0..n).filter(|&p| p != me) {
            for ring in [&tx[p], &rx[p]].into_iter().flatten() {
                loop {
                    match ring.peer().0 {
                        STATE_EMPTY if Instant::now() >= deadline => {
                            return Err(Error::Timeout {
                                peer: p,
                                op: Op::Connect,
                                after: cfg.timeout,
                            })
                        }
                        STATE_EMPTY => std::thread::sleep(Duration::from_micros(200)),
                        STATE_CLOSED => {
                            return Err(Error::PeerClosed {
                                peer: p,
                                op: Op::Connect,
                            })
                        }
                        _ => break,
                    }
                }
            }
        }
        created.0.clear();
        drop(cleanup); // both ends of each of our rings are mapped: unlink their files
        Ok(Shm {
            rank: me,
            world_size: n,
            timeout: cfg.timeout,
            max_frame: cfg.max_frame,
            bytes_sent: 0,
            tx,
            rx,
            loopback: VecDeque::new(),
            wait: cfg.wait,
        })
    }

    fn check(&self, peer: usize) -> Result<()> {
        if peer >= self.world_size {
            return Err(Error::InvalidRank {
                rank: peer,
                world_size: self.world_size,
            });
        }
        Ok(())
    }

    fn pop_loopback(&mut self) -> Result<Vec<u8>> {
        // Nobody else can send us a message to ourselves: waiting would only hang.
        self.loopback.pop_front().ok_or(Error::Timeout {
            peer: self.rank,
            op: Op::Recv,
            after: Duration::ZERO,
        })
    }

    /// Moves the pieces of one outgoing and/or one incoming message until both are done.
    fn drive(
        &mut self,
        mut out: Option<Outgoing<'_>>,
        mut inc: Option<Incoming<'_>>,
    ) -> Result<()> {
        let mut waiter = Waiter::new(self.wait);
        let mut last_progress = Instant::now();
        loop {
            let mut progress = false;
            if let Some(o) = &mut out {
                let ring = self.tx[o.to].as_mut().expect("ring to every peer");
                progress |= o.step(ring)?;
                if o.done() {
                    out = None;
                }
            }
            if let Some(i) = &mut inc {
                let ring = self.rx[i.from].as_mut().expect("ring from every peer");
                progress |= i.step(ring, self.max_frame)?;
                if i.done() {
                    let i = inc.take().expect("just checked");
                    i.finish()?;
                }
            }
            if out.is_none() && inc.is_none() {
                return Ok(());
            }
            if progress {
                waiter = Waiter::new(self.wait);
                continue;
            }
            let ring = match (&inc, &out) {
                (Some(i), _) => self.rx[i.from].as_ref(),
                (None, Some(o)) => self.tx[o.to].as_ref(),
                (None, None) => unreachable!("returned above"),
            };
            // Waiting on both sides, we sleep on the incoming ring only: a short nap, as
            // room freed in the outgoing one does not wake us.
            let nap = if inc.is_some() && out.is_some() {
                Duration::from_micros(100)
            } else {
                Duration::from_millis(2)
            };
            if !waiter.pause(ring.expect("ring to every peer"), nap) {
                continue;
            }
            last_progress = last_progress.max(waiter.start);
            // A check is due. Has any peer died (the whole job is over then, so name it even
            // when we wait for another), or has the peer we wait for left?
            let (peer, op, ring) = match (&inc, &out) {
                (Some(i), _) => (i.from, Op::Recv, self.rx[i.from].as_ref()),
                (None, Some(o)) => (o.to, Op::Send, self.tx[o.to].as_ref()),
                (None, None) => unreachable!("returned above"),
            };
            let (state, _) = ring.expect("ring to every peer").peer();
            let gone = if let Some((dead, pid)) = self.dead_peer() {
                Some(Error::PeerDied {
                    peer: dead,
                    pid,
                    op,
                })
            } else if let Some((failed, by)) = self.reported_failure() {
                Some(Error::PeerFailed {
                    peer: failed,
                    reported_by: by,
                })
            } else if state == STATE_CLOSED {
                Some(Error::PeerClosed { peer, op })
            } else if last_progress.elapsed() >= self.timeout {
                Some(Error::Timeout {
                    peer,
                    op,
                    after: self.timeout,
                })
            } else {
                None
            };
            if let Some(e) = gone {
                // One last look: data written just before the peer left is still delivered.
                let mut again = false;
                if let Some(o) = &mut out {
                    again |= o.step(self.tx[o.to].as_mut().expect("ring"))?;
                }
                if let Some(i) = &mut inc {
                    again |= i.step(self.rx[i.from].as_mut().expect("ring"), self.max_frame)?;
                }
                if !again {
                    // Tell every peer which rank failed, so they name it too (not us, when
                    // we leave in turn).
                    let failed = match &e {
                        Error::PeerFailed { .. } => None,
                        e => e.peer(),
                    };
                    if let Some(f) = failed {
                        for ring in self.tx.iter().flatten() {
                            ring.report_failure(f);
                        }
                    }
                    return Err(e);
                }
                waiter = Waiter::new(self.wait);
                last_progress = Instant::now();
            }
        }
    }

    /// A peer whose process is gone without closing its end, with its pid.
    fn dead_peer(&self) -> Option<(usize, u32)> {
        self.rx.iter().enumerate().find_map(|(p, ring)| {
            let (state, pid) = ring.as_ref()?.peer();
            (state != STATE_CLOSED && !process_alive(pid)).then_some((p, pid))
        })
    }

    /// A failure some peer reported: (failed rank, reporting rank).
    fn reported_failure(&self) -> Option<(usize, usize)> {
        self.rx
            .iter()
            .enumerate()
            .find_map(|(p, ring)| Some((ring.as_ref()?.reported_failure()?, p)))
    }

    fn outgoing<'a>(&self, to: usize, msg: &'a [u8]) -> Outgoing<'a> {
        Outgoing {
            to,
            hdr: (msg.len() as u64).to_le_bytes(),
            msg,
            sent: 0,
        }
    }
}

/// Checks a peer's pid: gone, or a zombie, is dead. Pid 0 (not yet written) counts as alive.
fn process_alive(pid: u32) -> bool {
    if pid == 0 || pid == std::process::id() {
        return true;
    }
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; it delivers nothing.
    let r = unsafe { libc::kill(p, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
        return false;
    }
    // A killed child that its parent has not reaped yet still exists, as a zombie.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => true,
    }
}

/// One wait for progress: spin, then yield, then sleep on the ring (see [`WaitPolicy`]);
/// `pause` answers whether a liveness check is due.
struct Waiter {
    policy: WaitPolicy,
    /// When the wait began (the last progress).
    start: Instant,
    /// Polls so far.
    n: u32,
    /// The time as last read (read every few polls while spinning).
    now: Instant,
    /// When the peers were last checked.
    checked: Instant,
}

impl Waiter {
    /// How often the peers are checked once asleep.
    const CHECK_EVERY: Duration = Duration::from_millis(2);

    fn new(policy: WaitPolicy) -> Waiter {
        let now = Instant::now();
        Waiter {
            policy,
            start: now,
            n: 0,
            now,
            checked: now,
        }
    }

    fn pause(&mut self, ring: &Ring, nap: Duration) -> bool {
        self.n = self.n.wrapping_add(1);
        if self.n.is_multiple_of(16) || self.policy.spin.is_zero() {
            self.now = Instant::now();
        }
        let waited = self.now.duration_since(self.start);
        if waited < self.policy.spin {
            std::hint::spin_loop();
            return false;
        }
        if waited < self.policy.spin + self.policy.yield_for {
            std::thread::yield_now();
            self.now = Instant::now();
            return false;
        }
        ring.sleep(nap);
        self.now = Instant::now();
        if self.now.duration_since(self.checked) >= Self::CHECK_EVERY {
            self.checked = self.now;
            return true;
        }
        false
    }
}

/// An outgoing message: its 8-byte length, then its bytes.
struct Outgoing<'a> {
    to: usize,
    hdr: [u8; 8],
    msg: &'a [u8],
    sent: usize,
}

impl Outgoing<'_> {
    fn step(&mut self, ring: &mut Ring) -> Result<bool> {
        let before = self.sent;
        let bad = |e| Error::BadRing {
            peer: self.to,
            source: e,
        };
        let (hdr, msg) = if self.sent < 8 {
            (&self.hdr[self.sent..], self.msg)
        } else {
            (&[][..], &self.msg[self.sent - 8..])
        };
        self.sent += ring.write_parts(hdr, msg).map_err(bad)?;
        Ok(self.sent > before)
    }

    fn done(&self) -> bool {
        self.sent == 8 + self.msg.len()
    }
}

/// Where an incoming message goes.
enum Sink<'a> {
    /// A growable buffer (cleared first).
    Vec(&'a mut Vec<u8>),
    /// An exact-size buffer.
    Exact(&'a mut [u8]),
    /// Read and dropped: an exact-size receive got another size.
    Discard { expected: usize },
}

/// An incoming message: its 8-byte length, then its bytes.
struct Incoming<'a> {
    from: usize,
    hdr: [u8; 8],
    hdr_got: usize,
    len: Option<usize>,
    got: usize,
    sink: Sink<'a>,
}

impl<'a> Incoming<'a> {
    fn new(from: usize, sink: Sink<'a>) -> Incoming<'a> {
        Incoming {
            from,
            hdr: [0; 8],
            hdr_got: 0,
            len: None,
            got: 0,
            sink,
        }
    }

    fn step(&mut self, ring: &mut Ring, max_frame: u64) -> Result<bool> {
        let from = self.from;
        let bad = |e| Error::BadRing {
            peer: from,
            source: e,
        };
        let mut progress = false;
        if self.len.is_none() {
            let want = 8 - self.hdr_got;
            // SAFETY: the destination is the unread rest of `hdr`.
            let k = unsafe { ring.read_some(self.hdr.as_mut_ptr().add(self.hdr_got), want) }
                .map_err(bad)?;
            self.hdr_got += k;
            progress |= k > 0;
            if self.hdr_got < 8 {
                return Ok(progress);
            }
            let len = u64::from_le_bytes(self.hdr);
            if len > max_frame {
                return Err(Error::FrameTooLarge {
                    peer: from,
                    len,
                    max: max_frame,
                });
            }
            let len = len as usize;
            self.len = Some(len);
            match &mut self.sink {
                Sink::Vec(v) => {
                    v.clear();
                    v.reserve(len);
                }
                Sink::Exact(out) if out.len() != len => {
                    self.sink = Sink::Discard {
                        expected: out.len(),
                    }
                }
                _ => {}
            }
        }
        let len = self.len.expect("set above");
        let want = len - self.got;
        if want == 0 {
            return Ok(progress);
        }
        let k = match &mut self.sink {
            Sink::Vec(v) => {
                // SAFETY: `reserve(len)` made room for `len` bytes; `v.len() == self.got`
                // bytes are initialised, and `read_some` initialises the next `k` before
                // `set_len` covers them.
                unsafe {
                    let k = ring
                        .read_some(v.as_mut_ptr().add(self.got), want)
                        .map_err(bad)?;
                    v.set_len(self.got + k);
                    k
                }
            }
            Sink::Exact(out) => {
                // SAFETY: `out[got..len]` is valid for writes (its length is `len`).
                unsafe { ring.read_some(out.as_mut_ptr().add(self.got), want) }.map_err(bad)?
            }
            Sink::Discard { .. } => {
                let mut scratch = [0u8; 4096];
                // SAFETY: `scratch` is valid for writes of its length.
                unsafe { ring.read_some(scratch.as_mut_ptr(), want.min(scratch.len())) }
                    .map_err(bad)?
            }
        };
        self.got += k;
        Ok(progress || k > 0)
    }

    fn done(&self) -> bool {
        self.len == Some(self.got)
    }

    fn finish(self) -> Result<()> {
        match self.sink {
            Sink::Discard { expected } => Err(Error::SizeMismatch {
                peer: self.from,
                expected,
                got: self.got,
            }),
            _ => Ok(()),
        }
    }
}

/// Opens one ring, waiting for rank 0 to create it; a stale file (an earlier job's, its end
/// already claimed or of another shape) is retried until the deadline.
fn open_wait(
    cfg: &ShmConfig,
    src: usize,
    dst: usize,
    role: Role,
    deadline: Instant,
    populate: bool,
) -> Result<Ring> {
    let peer = if src == cfg.rank { dst } else { src };
    let path = cfg.path(src, dst);
    let mut last: Option<HeaderError> = None;
    loop {
        match Ring::open(&path, role, &cfg.header(src, dst), populate) {
            Ok(Some(r)) => return Ok(r),
            Ok(None) => {}
            Err(OpenError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(OpenError::Io(e)) => {
                return Err(Error::Io {
                    peer,
                    op: Op::Connect,
                    source: e,
                })
            }
            Err(OpenError::Header(e)) => last = Some(e),
        }
        if Instant::now() >= deadline {
            return Err(match last {
                Some(source) => Error::BadRing { peer, source },
                None => Error::Timeout {
                    peer,
                    op: Op::Connect,
                    after: cfg.timeout,
                },
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Transport for Shm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn send(&mut self, to: usize, msg: &[u8]) -> Result<()> {
        self.check(to)?;
        if to == self.rank {
            self.loopback.push_back(msg.to_vec());
        } else {
            let o = self.outgoing(to, msg);
            self.drive(Some(o), None)?;
        }
        self.bytes_sent += msg.len() as u64;
        Ok(())
    }

    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.check(from)?;
        if from == self.rank {
            *buf = self.pop_loopback()?;
            return Ok(());
        }
        self.drive(None, Some(Incoming::new(from, Sink::Vec(buf))))
    }

    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        self.check(from)?;
        if from == self.rank {
            let m = self.pop_loopback()?;
            return crate::copy_exact(from, &m, out);
        }
        self.drive(None, Some(Incoming::new(from, Sink::Exact(out))))
    }

    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.check(to)?;
        self.check(from)?;
        if to == self.rank || from == self.rank {
            self.send(to, msg)?;
            return self.recv(from, buf);
        }
        let o = self.outgoing(to, msg);
        self.drive(Some(o), Some(Incoming::new(from, Sink::Vec(buf))))?;
        self.bytes_sent += msg.len() as u64;
        Ok(())
    }

    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        self.check(to)?;
        self.check(from)?;
        if to == self.rank || from == self.rank {
            self.send(to, msg)?;
            return self.recv_into(from, out);
        }
        let o = self.outgoing(to, msg);
        self.drive(Some(o), Some(Incoming::new(from, Sink::Exact(out))))?;
        self.bytes_sent += msg.len() as u64;
        Ok(())
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

/// A world of `n` ranks in this process (one thread each joins), for tests and benches:
/// a fresh random job token, rings of `ring_bytes`, files in `/dev/shm`.
pub fn local_world(n: usize, ring_bytes: u64) -> Result<Vec<Shm>> {
    local_world_in(n, ring_bytes, Path::new("/dev/shm"))
}

/// [`local_world`] with the ring files in `dir`.
pub fn local_world_in(n: usize, ring_bytes: u64, dir: &Path) -> Result<Vec<Shm>> {
    let job = format!(
        "local-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    );
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let mut cfg = ShmConfig::new(rank, n, job.clone());
                cfg.ring_bytes = ring_bytes;
                cfg.dir = dir.to_path_buf();
                cfg.timeout = Duration::from_secs(20);
                s.spawn(move || {
                    let mut t = Shm::connect(&cfg)?;
                    t.set_timeout(DEFAULT_TIMEOUT);
                    Ok(t)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("shm rank setup panicked"))
            .collect()
    })
}

#[cfg(test)]
mod tests;
