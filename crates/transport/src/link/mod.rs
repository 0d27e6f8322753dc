//! `link`: emulates a network link over any transport — bandwidth, latency, jitter — so a
//! job on one host behaves like one on a 100 Mbit/s or 10 Gbit/s cluster, and one rank can be
//! made the slow one.
//!
//! [`Throttled<T>`] wraps any [`Transport`]. Each ordered pair of ranks is one direction of a
//! full-duplex link with its own schedule (a token bucket with no burst):
//!
//! * **sender**: a message of `len` bytes occupies the link `me → to` for
//!   `(len + overhead) * 8 / bandwidth` after the link is free; `send` returns when it is on
//!   the wire (the end of that slot), so back-to-back sends stream at exactly the bandwidth;
//! * **receiver**: the sender stamps each message with its arrival time (end of its slot plus
//!   latency ± seeded jitter, never earlier than the previous arrival on that link), sent as a
//!   separate 8-byte message ahead of the payload; `recv` returns no earlier than that time.
//!   Receive-side pacing is what limits the second direction of a duplex `send_recv`, and it
//!   charges latency once per message, not once per call, so streams pipeline like a real link.
//!
//! All times are absolute (`CLOCK_MONOTONIC`, shared by the processes of one host, or any
//! [`Clock`] given to [`Throttled::with_clock`], e.g. a simulated one in tests) and every
//! slot starts where the previous one ended, so sleep overshoot never accumulates: how late a
//! call returns past its scheduled end (oversleep, a descheduled thread, the inner transport's
//! copy) is credited to the caller's next call (up to 20 ms; a stream on one link still never
//! beats the bandwidth, since its slots never overlap). Ranks on
//! different hosts have different clocks: a receiver never waits longer than the link's own
//! time for the message, so skew can only shorten latency, never stall a job.
//!
//! Every wait of the emulator honours the inner transport's deadline ([`Transport::timeout`]):
//! a message whose slot or arrival lies further away than the deadline (a message far too
//! large for the emulated bandwidth, or a peer's link booked up that long) waits out the
//! deadline and fails with [`Error::Timeout`] naming the peer, like a real link that makes no
//! progress; the link stays booked for the message, so the job is over, as after any timeout.
//!
//! Bytes charged per message are the payload plus [`LinkSpec::overhead`] (0 unless set; set
//! e.g. `overhead=66` to model TCP/IP over Ethernet per 1448-byte segment coarsely). The 8-byte
//! stamp is emulator bookkeeping, not charged, and not counted in [`Transport::bytes_sent`].
//! Messages to oneself bypass the emulation.
//!
//! Settings: [`LinkConfig`] parsed from a spec string (grammar in [`spec`]), from
//! `GRADWIRE_LINK` and `GRADWIRE_LINK_RANK_<r>` through [`config_from_env`].
//!
//! ```
//! use gradwire_transport::{link::{LinkConfig, Throttled}, local::Local, Transport};
//! let cfg: LinkConfig = "100mbit,1ms".parse().unwrap();
//! let mut world: Vec<_> = Local::world(2).into_iter().map(|t| Throttled::new(t, &cfg)).collect();
//! let (mut b, mut a) = (world.pop().unwrap(), world.pop().unwrap());
//! let start = std::time::Instant::now();
//! a.send(1, &[0u8; 12_500]).unwrap(); // 1 ms on the wire at 100 Mbit/s
//! let mut buf = Vec::new();
//! b.recv(0, &mut buf).unwrap(); // + 1 ms latency
//! assert!(start.elapsed() >= std::time::Duration::from_millis(2));
//! ```

pub mod clock;
pub mod spec;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use clock::{Clock, Monotonic};
pub use spec::{Bandwidth, LinkConfig, LinkSpec, LinkSpecError};

use crate::{Error, Op, Result, Transport};

/// Reads the link emulation settings from the process environment for a job of
/// `world_size` ranks; `Ok(None)` when `GRADWIRE_LINK` is unset (no emulation).
///
/// * `GRADWIRE_LINK`: a [`LinkConfig`] string, e.g. `1gbit,50us,jitter=10us;rank3=100mbit`;
/// * `GRADWIRE_LINK_RANK_<r>`: items overriding rank r's interface, e.g. `100mbit` or
///   `100mbit,2ms` (applied after the overrides inside `GRADWIRE_LINK`).
pub fn config_from_env(world_size: usize) -> Result<Option<LinkConfig>> {
    config_from(|k| std::env::var(k).ok(), world_size)
}

/// [`config_from_env`] over any variable lookup (testable without touching the process).
pub fn config_from(
    get: impl Fn(&str) -> Option<String>,
    world_size: usize,
) -> Result<Option<LinkConfig>> {
    let per_rank: Vec<(usize, String)> = (0..world_size)
        .filter_map(|r| get(&format!("GRADWIRE_LINK_RANK_{r}")).map(|v| (r, v)))
        .collect();
    let Some(base) = get("GRADWIRE_LINK") else {
        if let Some((r, _)) = per_rank.first() {
            return Err(Error::Env {
                reason: format!("GRADWIRE_LINK_RANK_{r} is set but GRADWIRE_LINK is not"),
            });
        }
        return Ok(None);
    };
    let mut cfg: LinkConfig = base.parse().map_err(|e| Error::Env {
        reason: format!("GRADWIRE_LINK={base}: {e}"),
    })?;
    if let Some(&r) = cfg.ranks.keys().find(|&&r| r >= world_size) {
        return Err(Error::Env {
            reason: format!("GRADWIRE_LINK names rank {r}, outside a world of {world_size}"),
        });
    }
    for (r, items) in per_rank {
        cfg.override_rank(r, &items).map_err(|e| Error::Env {
            reason: format!("GRADWIRE_LINK_RANK_{r}={items}: {e}"),
        })?;
    }
    Ok(Some(cfg))
}

/// Time this rank spent inside the emulator, for finding the slow link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Waiting for messages to go on the wire (sender side).
    pub send_wait: Duration,
    /// Waiting for messages to arrive (latency and the peer's serialization).
    pub recv_wait: Duration,
    /// Messages sent through emulated links.
    pub messages: u64,
}

/// Per-peer state of one rank's links.
struct Peer {
    spec: LinkSpec,
    /// When the link `me → peer` is free again (ns, shared clock).
    tx_free: u64,
    /// Arrival time of our last message to the peer (keeps jitter from reordering).
    tx_last_arrival: u64,
    rng: StdRng,
}

/// A transport whose links behave like the configured network (see the module doc), on the
/// host's monotonic clock unless built [`with_clock`](Throttled::with_clock).
pub struct Throttled<T, C = Monotonic> {
    inner: T,
    clock: C,
    peers: Vec<Peer>,
    /// Oversleep of the emulator's last wait, credited back to the next call (ns).
    lag: u64,
    bytes_sent: u64,
    stats: LinkStats,
    stamp_in: [u8; 8],
}

/// The most lateness credited back. Consecutive messages on one link never overlap whatever
/// the credit (each slot starts where the previous one ended), so a stream never beats the
/// bandwidth; the credit only lets a message after an idle gap start up to this much before
/// its call, which absorbs a descheduled thread on a loaded machine.
const MAX_LAG_NS: u64 = 20_000_000;

impl<T: Transport> Throttled<T> {
    /// Wraps `inner`; every rank of the job must wrap with the same `config`.
    pub fn new(inner: T, config: &LinkConfig) -> Throttled<T> {
        Throttled::with_clock(inner, config, Monotonic)
    }

    /// Wraps every rank of a world.
    pub fn wrap_all(ranks: Vec<T>, config: &LinkConfig) -> Vec<Throttled<T>> {
        ranks
            .into_iter()
            .map(|t| Throttled::new(t, config))
            .collect()
    }
}

impl<T: Transport, C: Clock> Throttled<T, C> {
    /// [`Throttled::new`] on `clock` instead of the host's monotonic clock (every rank of the
    /// job must read the same time, or one skewed as between hosts).
    pub fn with_clock(inner: T, config: &LinkConfig, clock: C) -> Throttled<T, C> {
        let me = inner.rank();
        let peers = (0..inner.world_size())
            .map(|p| Peer {
                spec: config.link(me, p),
                tx_free: 0,
                tx_last_arrival: 0,
                rng: StdRng::seed_from_u64(
                    config.seed
                        ^ ((me as u64) << 32 | p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                ),
            })
            .collect();
        Throttled {
            inner,
            clock,
            peers,
            lag: 0,
            bytes_sent: 0,
            stats: LinkStats::default(),
            stamp_in: [0; 8],
        }
    }

    /// The clock the emulator reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The link to (and from) `peer`.
    pub fn link(&self, peer: usize) -> Option<LinkSpec> {
        self.peers.get(peer).map(|p| p.spec)
    }

    /// Time spent in the emulator so far.
    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    /// The wrapped transport.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// Unwraps the transport.
    pub fn into_inner(self) -> T {
        self.inner
    }

    fn check(&self, peer: usize) -> Result<()> {
        crate::check_rank(peer, self.peers.len())
    }

    /// Books the link to `to` for `len` bytes: returns (end of the slot, arrival time).
    fn book(&mut self, to: usize, len: usize) -> (u64, u64) {
        let now = self.clock.now_ns().saturating_sub(self.lag);
        let p = &mut self.peers[to];
        let start = p.tx_free.max(now);
        let end = start + p.spec.wire_ns(len);
        p.tx_free = end;
        let lat = p.spec.latency.as_nanos() as i128;
        let j = p.spec.jitter.as_nanos() as i128;
        let lat = if j > 0 {
            (lat + p.rng.gen_range(-j..=j)).max(0)
        } else {
            lat
        };
        let arrival = (end + lat as u64).max(p.tx_last_arrival);
        p.tx_last_arrival = arrival;
        self.stats.messages += 1;
        (end, arrival)
    }

    /// The arrival time to honour for a message of `len` bytes from `from` stamped `stamp`:
    /// never later than the link's own time for it from now (clock skew cannot stall us).
    fn arrival(&self, from: usize, stamp: u64, len: usize) -> u64 {
        let s = &self.peers[from].spec;
        let bound = self.clock.now_ns() + s.wire_ns(len) + (s.latency + s.jitter).as_nanos() as u64;
        stamp.min(bound)
    }

    /// Sleeps until the clock reads `target`; records how late we return (oversleep,
    /// or the inner transport overrunning the slot) as lag, credited to the next call. A
    /// target past the inner transport's deadline waits out the deadline and fails with
    /// [`Error::Timeout`] naming `peer`.
    fn wait_until(&mut self, target: u64, peer: usize, op: Op) -> Result<Duration> {
        let start = self.clock.now_ns();
        let deadline = self.inner.timeout();
        let limit = u64::try_from(deadline.as_nanos()).unwrap_or(u64::MAX);
        if target.saturating_sub(start) > limit {
            let end = self.clock.sleep_until(start.saturating_add(limit));
            self.lag = 0;
            let waited = Duration::from_nanos(end - start);
            match op {
                Op::Recv => self.stats.recv_wait += waited,
                _ => self.stats.send_wait += waited,
            }
            return Err(Error::Timeout {
                peer,
                op,
                after: deadline,
            });
        }
        let end = if target > start {
            self.clock.sleep_until(target)
        } else {
            start
        };
        self.lag = end.saturating_sub(target).min(MAX_LAG_NS);
        Ok(Duration::from_nanos(end - start))
    }

    fn recv_stamp(&mut self, from: usize) -> Result<u64> {
        let mut s = self.stamp_in;
        self.inner.recv_into(from, &mut s)?;
        Ok(u64::from_le_bytes(s))
    }

    fn finish_recv(&mut self, from: usize, stamp: u64, len: usize) -> Result<()> {
        let target = self.arrival(from, stamp, len);
        let waited = self.wait_until(target, from, Op::Recv)?;
        self.stats.recv_wait += waited;
        Ok(())
    }
}

impl<T: Transport, C: Clock> Transport for Throttled<T, C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn send(&mut self, to: usize, msg: &[u8]) -> Result<()> {
        self.check(to)?;
        if to == self.rank() {
            self.inner.send(to, msg)?;
        } else {
            let (end, arrival) = self.book(to, msg.len());
            self.inner.send(to, &arrival.to_le_bytes())?;
            self.inner.send(to, msg)?;
            let waited = self.wait_until(end, to, Op::Send)?;
            self.stats.send_wait += waited;
        }
        self.bytes_sent += msg.len() as u64;
        Ok(())
    }

    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.throttled_recv(from, |t| t.recv(from, buf).map(|()| buf.len()))
    }

    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        let len = out.len();
        self.throttled_recv(from, |t| t.recv_into(from, out).map(|()| len))
    }

    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.throttled_exchange(to, msg.len(), from, |t| {
            t.send_recv(to, msg, from, buf).map(|()| buf.len())
        })
    }

    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        let len = out.len();
        self.throttled_exchange(to, msg.len(), from, |t| {
            t.send_recv_into(to, msg, from, out).map(|()| len)
        })
    }

    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }
}

/// What a duplex step still has to wait for once the payloads have moved.
struct Pending {
    send_end: Option<u64>,
    recv_stamp: Option<u64>,
}

impl<T: Transport, C: Clock> Throttled<T, C> {
    /// Books our direction and swaps arrival stamps with the peers of a duplex step.
    fn exchange_stamps(&mut self, to: usize, len: usize, from: usize) -> Result<Pending> {
        self.check(to)?;
        self.check(from)?;
        let me = self.rank();
        let booked = (to != me).then(|| self.book(to, len));
        let out = booked.map(|(_, a)| a.to_le_bytes());
        let recv_stamp = match (out, from != me) {
            (Some(out), true) => {
                let mut s = self.stamp_in;
                self.inner.send_recv_into(to, &out, from, &mut s)?;
                Some(u64::from_le_bytes(s))
            }
            (Some(out), false) => {
                self.inner.send(to, &out)?;
                None
            }
            (None, true) => Some(self.recv_stamp(from)?),
            (None, false) => None,
        };
        Ok(Pending {
            send_end: booked.map(|(e, _)| e),
            recv_stamp,
        })
    }

    /// A receive from `from` through the link: `recv` receives the message on the inner
    /// transport and returns its length, after its arrival stamp and before the wait for its
    /// arrival (a message to ourselves is not delayed).
    fn throttled_recv(
        &mut self,
        from: usize,
        recv: impl FnOnce(&mut T) -> Result<usize>,
    ) -> Result<()> {
        self.check(from)?;
        if from == self.rank() {
            return recv(&mut self.inner).map(drop);
        }
        let stamp = self.recv_stamp(from)?;
        let len = recv(&mut self.inner)?;
        self.finish_recv(from, stamp, len)
    }

    /// A duplex step of `sent` bytes to `to` and a message from `from` through the link:
    /// `step` moves both on the inner transport and returns the received length, between
    /// the swap of arrival stamps and the wait for the later side.
    fn throttled_exchange(
        &mut self,
        to: usize,
        sent: usize,
        from: usize,
        step: impl FnOnce(&mut T) -> Result<usize>,
    ) -> Result<()> {
        let end = self.exchange_stamps(to, sent, from)?;
        let len = step(&mut self.inner)?;
        self.finish_exchange(end, to, from, len)?;
        self.bytes_sent += sent as u64;
        Ok(())
    }

    fn finish_exchange(&mut self, p: Pending, to: usize, from: usize, len: usize) -> Result<()> {
        let send_end = p.send_end.unwrap_or(0);
        let arrival = p.recv_stamp.map_or(0, |s| self.arrival(from, s, len));
        // Attribute the wait (and a timeout) to the side that set the deadline.
        if arrival > send_end {
            let waited = self.wait_until(arrival, from, Op::Recv)?;
            self.stats.recv_wait += waited;
        } else {
            let waited = self.wait_until(send_end, to, Op::Send)?;
            self.stats.send_wait += waited;
        }
        Ok(())
    }
}

#[cfg(test)]
mod fake_clock;
#[cfg(test)]
mod schedule_tests;
#[cfg(test)]
mod tests;
