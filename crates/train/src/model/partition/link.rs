//! The messages between the partitions of one model replica, over any
//! [`Transport`] whose ranks are the partitions (rank `p` holds partition `p`).
//!
//! Wire format: every message is one tag byte, then its payload.
//! - `0` (data): values, little-endian: `f32` activations and gradients, `f64` for the
//!   loss and evaluation sums; the receiver knows how many to expect and refuses any other length ([`TransportError::SizeMismatch`]).
//! - `1` (abort): a `u32` (little-endian) naming the partition that failed. A partition
//!   whose transport call fails sends it to every other partition (best effort) before it
//!   returns its error, so a partition blocked on a live neighbour learns which partition
//!   died instead of timing out on the neighbour.
//!
//! Naming the failed partition: when a call with partition `q` times out or finds `q` gone,
//! `q` may only have been waiting on the partition that really failed (or have reported it
//! and exited). So a partition tells the others it suspects `q`, then reads what `q` sent
//! for at most one more deadline, looking for `q`'s own report (this module's abort
//! message, or the transport's abort notice, [`TransportError::PeerFailed`]); a report
//! naming `r` moves the suspicion to `r`, and so on, until a suspect stays silent or is gone
//! without a report: that one is named. A dead partition is thus named within a small
//! multiple of the deadline (one more per partition on the chain), never a hang.
//!
//! Any other tag, or an abort naming no partition, is [`TransportError::BadFrame`]. After
//! a failure the link stays failed: every later call returns the same partition's error at
//! once (the replica cannot go on).
//!
//! The all-reduce is the ring one (reduce-scatter then all-gather, `2 (K - 1)` steps of one
//! `send_recv` each): every partition ends with bit-identical sums, which the split layers
//! rely on (each partition applies the same ReLU to the same values).

use std::time::{Duration, Instant};

use gradwire_transport::{Error as TransportError, Transport};

use super::message::{decode, encode, Value, ABORT};
use crate::error::{Error, PartitionError, Result};

/// Most messages read from a failed call's peer while looking for its report.
const PROBE_MESSAGES: usize = 1024;
/// How long a failed link waits for more unread messages from each peer before it closes.
const DRAIN_WAIT: Duration = Duration::from_millis(2);

/// The replica's transport with reused message buffers and the failure state.
pub(crate) struct Link {
    transport: Box<dyn Transport>,
    index: usize,
    parts: usize,
    out: Vec<u8>,
    inb: Vec<u8>,
    /// The partition whose failure ended the replica, once one did.
    failed: Option<usize>,
}

impl Drop for Link {
    /// A failed link first reads whatever the other partitions sent and it never read: a
    /// TCP connection closed with unread data is reset, and the reset would destroy the
    /// abort notices this partition sent but its peers have not read yet.
    fn drop(&mut self) {
        if self.failed.is_none() {
            return;
        }
        self.transport.set_timeout(DRAIN_WAIT);
        for p in (0..self.parts).filter(|&p| p != self.index) {
            for _ in 0..PROBE_MESSAGES {
                if self.transport.recv(p, &mut self.inb).is_err() {
                    break;
                }
            }
        }
    }
}

/// Ranges of `len` elements cut into `parts` nearly equal pieces (the first ones longer).
pub(crate) fn chunk(len: usize, parts: usize, i: usize) -> std::ops::Range<usize> {
    let (q, r) = (len / parts, len % parts);
    let start = i * q + i.min(r);
    start..start + q + usize::from(i < r)
}

impl Link {
    /// Wraps the transport of partition `index` of `parts`.
    pub(crate) fn new(transport: Box<dyn Transport>, index: usize, parts: usize) -> Result<Link> {
        if transport.world_size() != parts || transport.rank() != index {
            return Err(PartitionError::Transport {
                index,
                partitions: parts,
                rank: transport.rank(),
                world: transport.world_size(),
            }
            .into());
        }
        Ok(Link {
            transport,
            index,
            parts,
            out: Vec::new(),
            inb: Vec::new(),
            failed: None,
        })
    }

    /// The error of the partition that ended the replica, if one did.
    fn check(&self) -> Result<()> {
        match self.failed {
            None => Ok(()),
            Some(p) => Err(Error::PartitionLost {
                partition: p,
                source: TransportError::PeerFailed {
                    peer: p,
                    reported_by: self.index,
                },
            }),
        }
    }

    /// Turns a transport error into the replica's error, telling every other partition.
    fn fail(&mut self, source: TransportError) -> Error {
        if let Some(p) = self.failed {
            return Error::PartitionLost {
                partition: p,
                source,
            };
        }
        // Whom the error accuses, and whether that may be only a partition waiting on the
        // one that failed (a silence or a report), rather than proof (a malformed message).
        let (suspect, follow) = match &source {
            TransportError::PeerFailed { peer, .. } => (*peer, true),
            TransportError::Timeout { peer, .. }
            | TransportError::PeerClosed { peer, .. }
            | TransportError::Io { peer, .. } => (*peer, true),
            other => (other.peer().unwrap_or(self.index), false),
        };
        // Tell the others at once: a wrong suspect is corrected by its own report.
        self.notify(suspect);
        let partition = if follow && suspect != self.index {
            self.follow(suspect)
        } else {
            suspect
        };
        self.failed = Some(partition);
        Error::PartitionLost { partition, source }
    }

    /// Sends an abort naming `suspect` to every other partition but it (best effort: a
    /// partition that cannot be told learns of the failure from its own deadline).
    fn notify(&mut self, suspect: usize) {
        let mut msg = [ABORT, 0, 0, 0, 0];
        msg[1..].copy_from_slice(&(suspect as u32).to_le_bytes());
        for p in 0..self.parts {
            if p != self.index && p != suspect {
                let _ = self.transport.send(p, &msg);
            }
        }
    }

    /// The partition that failed, found from `suspect`: a suspect that is alive was only
    /// waiting on another, and reports it (this module's abort message, or the transport's
    /// own abort notice) within about one deadline of this partition's failure; a suspect
    /// that reports nothing within one deadline, or is gone without a report, is the one.
    /// Data still in flight from a suspect is dropped.
    fn follow(&mut self, mut suspect: usize) -> usize {
        let timeout = self.transport.timeout();
        let mut seen = vec![false; self.parts];
        seen[self.index] = true;
        'chain: while !seen[suspect] {
            seen[suspect] = true;
            let until = Instant::now() + timeout;
            for _ in 0..PROBE_MESSAGES {
                let Some(left) = until.checked_duration_since(Instant::now()) else {
                    break 'chain;
                };
                self.transport.set_timeout(left);
                let report = match self.transport.recv(suspect, &mut self.inb) {
                    Err(TransportError::PeerFailed { peer, .. }) => peer,
                    Err(_) => break 'chain,
                    Ok(()) => match self.decode::<f32>(suspect, &mut []) {
                        Err(TransportError::PeerFailed { peer, .. }) => peer,
                        _ => continue,
                    },
                };
                if report == self.index || seen[report] {
                    // Waiting on each other: no one of them failed first; name the suspect.
                    break 'chain;
                }
                suspect = report;
                continue 'chain;
            }
            break;
        }
        self.transport.set_timeout(timeout);
        suspect
    }

    /// Reads the message in `self.inb` from `from` as `out.len()` values.
    fn decode<V: Value>(
        &self,
        from: usize,
        out: &mut [V],
    ) -> std::result::Result<(), TransportError> {
        decode(&self.inb, self.parts, from, out)
    }

    /// Sends `values` to partition `to`.
    pub(crate) fn send<V: Value>(&mut self, to: usize, values: &[V]) -> Result<()> {
        self.check()?;
        encode(values, &mut self.out);
        match self.transport.send(to, &self.out) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Receives exactly `out.len()` values from partition `from`.
    pub(crate) fn recv<V: Value>(&mut self, from: usize, out: &mut [V]) -> Result<()> {
        self.check()?;
        let got = self
            .transport
            .recv(from, &mut self.inb)
            .and_then(|()| self.decode(from, out));
        got.map_err(|e| self.fail(e))
    }

    /// One ring step: sends `send` to `to` while receiving `recv.len()` values from `from`.
    fn step(&mut self, to: usize, send: &[f32], from: usize, recv: &mut [f32]) -> Result<()> {
        encode(send, &mut self.out);
        let got = self
            .transport
            .send_recv(to, &self.out, from, &mut self.inb)
            .and_then(|()| self.decode(from, recv));
        got.map_err(|e| self.fail(e))
    }

    /// Sums `buf` over all partitions in place; every partition ends with the same bits.
    /// `scratch` is reused between calls (grown to a chunk's length).
    pub(crate) fn all_reduce(&mut self, buf: &mut [f32], scratch: &mut Vec<f32>) -> Result<()> {
        self.check()?;
        let (k, r) = (self.parts, self.index);
        if k == 1 {
            return Ok(());
        }
        let (right, left) = ((r + 1) % k, (r + k - 1) % k);
        let len = buf.len();
        // Reduce-scatter: after step s, chunk (r - s - 1) holds s + 2 partitions' values.
        for s in 0..k - 1 {
            let (cs, cr) = ((r + k - s) % k, (r + 2 * k - s - 1) % k);
            let (send, recv) = (chunk(len, k, cs), chunk(len, k, cr));
            scratch.resize(recv.len(), 0.0);
            self.step(right, &buf[send], left, &mut scratch[..])?;
            for (b, x) in buf[recv].iter_mut().zip(scratch.iter()) {
                *b += x;
            }
        }
        // All-gather: chunk (r + 1) is complete here; pass the complete chunks round.
        for s in 0..k - 1 {
            let (cs, cr) = ((r + 1 + k - s) % k, (r + k - s) % k);
            let (send, recv) = (chunk(len, k, cs), chunk(len, k, cr));
            scratch.resize(recv.len(), 0.0);
            self.step(right, &buf[send], left, &mut scratch[..])?;
            buf[recv].copy_from_slice(scratch);
        }
        Ok(())
    }
}
