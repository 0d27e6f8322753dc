//! `shm`: ranks on one host talking through shared memory.
//!
//! Every ordered pair of ranks `(src, dst)` has one single-producer single-consumer byte ring
//! in a file `<dir>/gradwire-<group>-<job>-<src>-<dst>` (`dir` is `/dev/shm`; `group` and
//! `job` are keys of the job's name, which holds the token and the job's random identity:
//! see `config`). Messages are framed in the ring as an 8-byte length and the payload; a
//! message larger than the ring streams through it in pieces, so any size works with a fixed
//! ring. [`Transport::send_recv`] moves pieces of both directions in turn and never
//! deadlocks.
//!
//! Setup: rank 0 creates every ring file (under a temporary name, renamed into place, mode
//! 0600); each rank maps the rings it writes and reads (only files this user owns with mode
//! 0600, never through a symbolic link), claims its end in the header with its pid, and
//! waits (until the deadline) for the peer at the other end. Once both ends are in, the
//! files are unlinked: the mappings stay, nothing is left in `/dev/shm` even if a rank is
//! killed later. Before that, a SIGTERM or SIGINT makes the rank remove the files it made or
//! owns, and a launcher removes the files of its ranks once they have exited
//! ([`remove_files_of`]; see `cleanup`). Every ring is mapped with its pages faulted in (`MAP_POPULATE`), so no
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
//!
//! Modules: `config` (settings and file names), `setup` (joining), `cleanup` (the files of a
//! stopped rank or job), `ring` (one mapped ring), [`cursor`] (its position arithmetic, pure
//! and fuzzed), `message` (a message through a ring), [`header`] (the ring file's header).

mod cleanup;
mod config;
pub mod cursor;
pub mod header;
mod message;
mod ring;
mod setup;

pub use cleanup::remove_files_of;
pub use config::{config_from, config_from_env, ShmConfig, WaitPolicy, DEFAULT_RING_BYTES};
pub use setup::{local_world, local_world_in};

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use message::{Incoming, Outgoing, Sink};
use ring::{Ring, STATE_CLOSED};

use crate::{Error, Op, Result, Transport};

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
    fn check(&self, peer: usize) -> Result<()> {
        crate::check_rank(peer, self.world_size)
    }

    fn pop_loopback(&mut self) -> Result<Vec<u8>> {
        // Nobody else can send us a message to ourselves: waiting would only hang.
        self.loopback.pop_front().ok_or(Error::Timeout {
            peer: self.rank,
            op: Op::Recv,
            after: Duration::ZERO,
        })
    }

    /// Receives the next message from `from` into `sink`; a message to ourselves comes off
    /// the loopback queue.
    fn take(&mut self, from: usize, sink: Sink<'_>) -> Result<()> {
        self.check(from)?;
        if from != self.rank {
            return self.drive(None, Some(Incoming::new(from, sink)));
        }
        let m = self.pop_loopback()?;
        match sink {
            Sink::Vec(buf) => *buf = m,
            Sink::Exact(out) => return crate::copy_exact(from, &m, out),
            Sink::Discard { expected } => {
                return Err(Error::SizeMismatch {
                    peer: from,
                    expected,
                    got: m.len(),
                })
            }
        }
        Ok(())
    }

    /// Sends `msg` to `to` while receiving the next message from `from` into `sink`, both
    /// directions in turn; with ourselves at either end, the send and then the receive.
    fn exchange(&mut self, to: usize, msg: &[u8], from: usize, sink: Sink<'_>) -> Result<()> {
        self.check(to)?;
        self.check(from)?;
        if to == self.rank || from == self.rank {
            self.send(to, msg)?;
            return self.take(from, sink);
        }
        let o = self.outgoing(to, msg);
        self.drive(Some(o), Some(Incoming::new(from, sink)))?;
        self.bytes_sent += msg.len() as u64;
        Ok(())
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
        self.rx.iter().enumerate().find_map(|(p, ring)| {
            // The peer's word: a rank outside the job is no report.
            let failed = ring.as_ref()?.reported_failure()?;
            (failed < self.world_size).then_some((failed, p))
        })
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
        self.take(from, Sink::Vec(buf))
    }

    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        self.take(from, Sink::Exact(out))
    }

    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.exchange(to, msg, from, Sink::Vec(buf))
    }

    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        self.exchange(to, msg, from, Sink::Exact(out))
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

    fn splitter(&mut self) -> Option<&mut dyn crate::split::Split> {
        Some(self)
    }
}

/// Shared memory does not split: its rings are made once for the whole job at setup. A
/// group of ranks on one host can use [`crate::local`] (threads) or a TCP group instead.
impl crate::split::Split for Shm {
    fn split(&mut self, _color: u32, _key: u32) -> Result<crate::split::Group> {
        Err(Error::SplitUnsupported {
            transport: "shared-memory (shm)",
        })
    }
}

#[cfg(test)]
mod kill_tests;
#[cfg(test)]
mod tests;
