//! `local`: the ranks of one job as threads of one process, joined by channels.
//!
//! Each ordered pair of ranks has an unbounded channel, so `send` never blocks and
//! `send_recv` cannot deadlock; received buffers travel back to their sender for reuse, so a
//! steady state allocates nothing. A rank that is dropped closes its channels: its peers get
//! [`Error::PeerClosed`] naming it, and a stalled one gives [`Error::Timeout`].
//!
//! A world splits ([`crate::split::Split`]): after the ranks agree on the groups over the
//! world's channels, group rank 0 builds an in-process world of the group's size and hands
//! each member its end through the world's hand-off channels.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use crate::split::{self, Group, Split};
use crate::{Error, Op, Result, SplitStep, Transport, DEFAULT_TIMEOUT};

/// A group's end handed to a member by the group's rank 0.
struct Handoff {
    seq: u32,
    color: u32,
    end: Local,
}

/// One rank of an in-process world (see [`Local::world`]).
pub struct Local {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    bytes_sent: u64,
    /// `to[p]`: messages to rank p.
    to: Vec<Option<Sender<Vec<u8>>>>,
    /// `from[p]`: messages from rank p.
    from: Vec<Option<Receiver<Vec<u8>>>>,
    /// `spare_out[p]`: buffers rank p has finished with, for our next send to p.
    spare_out: Vec<Option<Receiver<Vec<u8>>>>,
    /// `spare_back[p]`: hands a buffer received from p back to p.
    spare_back: Vec<Option<Sender<Vec<u8>>>>,
    /// The rank a posted [`SplitStep`] receives from.
    posted_from: Option<usize>,
    /// Splits of this world so far.
    splits: u32,
    /// `handoff[p]`: hands rank p its end of a group.
    handoff: Vec<Sender<Handoff>>,
    /// Ends of groups handed to this rank.
    inbox: Receiver<Handoff>,
}

impl Local {
    /// Builds a world of `n` ranks; move each into its own thread.
    pub fn world(n: usize) -> Vec<Local> {
        let (handoff, inboxes): (Vec<_>, Vec<_>) = (0..n).map(|_| channel()).unzip();
        let mut ranks: Vec<Local> = inboxes
            .into_iter()
            .enumerate()
            .map(|(rank, inbox)| Local {
                rank,
                world_size: n,
                timeout: DEFAULT_TIMEOUT,
                bytes_sent: 0,
                to: (0..n).map(|_| None).collect(),
                from: (0..n).map(|_| None).collect(),
                spare_out: (0..n).map(|_| None).collect(),
                spare_back: (0..n).map(|_| None).collect(),
                posted_from: None,
                splits: 0,
                handoff: handoff.clone(),
                inbox,
            })
            .collect();
        for a in 0..n {
            for b in 0..n {
                let (tx, rx) = channel();
                ranks[a].to[b] = Some(tx);
                ranks[b].from[a] = Some(rx);
                let (stx, srx) = channel();
                ranks[b].spare_back[a] = Some(stx);
                ranks[a].spare_out[b] = Some(srx);
            }
        }
        ranks
    }

    fn check(&self, peer: usize) -> Result<()> {
        crate::check_rank(peer, self.world_size)
    }

    fn take_message(&mut self, from: usize) -> Result<Vec<u8>> {
        self.check(from)?;
        let rx = self.from[from]
            .as_ref()
            .expect("channel built by Local::world");
        match rx.recv_timeout(self.timeout) {
            Ok(msg) => Ok(msg),
            Err(RecvTimeoutError::Timeout) => Err(Error::Timeout {
                peer: from,
                op: Op::Recv,
                after: self.timeout,
            }),
            Err(RecvTimeoutError::Disconnected) => Err(Error::PeerClosed {
                peer: from,
                op: Op::Recv,
            }),
        }
    }

    fn give_back(&mut self, from: usize, buf: Vec<u8>) {
        if buf.capacity() > 0 {
            if let Some(tx) = &self.spare_back[from] {
                // The peer may be gone; then the buffer is simply dropped.
                let _ = tx.send(buf);
            }
        }
    }
}

impl Transport for Local {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn send(&mut self, to: usize, msg: &[u8]) -> Result<()> {
        self.check(to)?;
        let mut buf = self.spare_out[to]
            .as_ref()
            .and_then(|rx| rx.try_recv().ok())
            .unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(msg);
        let tx = self.to[to].as_ref().expect("channel built by Local::world");
        tx.send(buf).map_err(|_| Error::PeerClosed {
            peer: to,
            op: Op::Send,
        })?;
        self.bytes_sent += msg.len() as u64;
        Ok(())
    }

    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> Result<()> {
        let mut msg = self.take_message(from)?;
        std::mem::swap(buf, &mut msg);
        self.give_back(from, msg);
        Ok(())
    }

    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.send(to, msg)?;
        self.recv(from, buf)
    }

    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        let msg = self.take_message(from)?;
        let res = crate::copy_exact(from, &msg, out);
        self.give_back(from, msg);
        res
    }

    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        self.send(to, msg)?;
        self.recv_into(from, out)
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

    fn splitter(&mut self) -> Option<&mut dyn Split> {
        Some(self)
    }
}

impl Split for Local {
    fn split(&mut self, color: u32, key: u32) -> Result<Group> {
        let seq = self.splits;
        self.splits += 1;
        let plan = split::agree(self, seq, color, key)?;
        let m = plan.members.len();
        let wrap = |end: Local| Group::new(Box::new(end), plan.color, plan.members.clone());
        if plan.rank == 0 {
            let mut ends = Local::world(m);
            for e in &mut ends {
                e.timeout = self.timeout;
            }
            let mut ends = ends.into_iter();
            let mine = ends.next().expect("a group has rank 0");
            for (g, end) in ends.enumerate().map(|(i, e)| (i + 1, e)) {
                let to = plan.members[g];
                let sent = self.handoff[to].send(Handoff { seq, color, end });
                if sent.is_err() {
                    return Err(plan.name_error(Error::PeerClosed {
                        peer: g,
                        op: Op::Send,
                    }));
                }
            }
            return Ok(wrap(mine));
        }
        let timeout = self.timeout;
        let failed = |e: Error| plan.name_error(e);
        match self.inbox.recv_timeout(timeout) {
            Ok(h) if h.seq == seq && h.color == color && h.end.rank == plan.rank => Ok(wrap(h.end)),
            Ok(_) => Err(failed(Error::Misuse {
                what: "a group's end from another split arrived (splits out of step)",
            })),
            Err(RecvTimeoutError::Timeout) => Err(failed(Error::Timeout {
                peer: 0,
                op: Op::Connect,
                after: timeout,
            })),
            Err(RecvTimeoutError::Disconnected) => Err(failed(Error::PeerClosed {
                peer: 0,
                op: Op::Connect,
            })),
        }
    }
}

/// Sends never block here, so posting is sending, and completing is receiving.
impl SplitStep for Local {
    fn post(&mut self, to: usize, msg: &[u8], from: usize) -> Result<()> {
        if self.posted_from.is_some() {
            return Err(Error::Misuse {
                what: "a second step posted before the first was completed",
            });
        }
        self.check(from)?;
        self.send(to, msg)?;
        self.posted_from = Some(from);
        Ok(())
    }

    fn complete_into(&mut self, _msg: &[u8], out: &mut [u8]) -> Result<()> {
        let from = self.posted_from.take().ok_or(Error::Misuse {
            what: "complete_into without a posted step",
        })?;
        self.recv_into(from, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_exchange_and_order() {
        let n = 4;
        let hs: Vec<_> = Local::world(n)
            .into_iter()
            .map(|mut t| {
                std::thread::spawn(move || {
                    let me = t.rank();
                    let mut buf = Vec::new();
                    let mut got = Vec::new();
                    for i in 0..3u8 {
                        t.send_recv((me + 1) % n, &[me as u8, i], (me + n - 1) % n, &mut buf)
                            .unwrap();
                        got.push(buf.clone());
                    }
                    got
                })
            })
            .collect();
        for (me, h) in hs.into_iter().enumerate() {
            let got = h.join().unwrap();
            let left = ((me + n - 1) % n) as u8;
            assert_eq!(got, vec![vec![left, 0], vec![left, 1], vec![left, 2]]);
        }
    }

    #[test]
    fn dropped_peer_is_named() {
        let mut w = Local::world(3);
        let mut a = w.remove(0);
        drop(w); // ranks 1 and 2 gone
        let mut buf = Vec::new();
        let err = a.recv(2, &mut buf).unwrap_err();
        assert_eq!(err.peer(), Some(2));
        assert!(matches!(err, Error::PeerClosed { .. }));
    }

    #[test]
    fn stalled_peer_times_out() {
        let mut w = Local::world(2);
        let mut a = w.remove(0);
        a.set_timeout(Duration::from_millis(20));
        let err = a.recv(1, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, Error::Timeout { peer: 1, .. }), "{err}");
        drop(w);
    }

    #[test]
    fn recv_into_checks_length() {
        let mut w = Local::world(2);
        let mut b = w.pop().unwrap();
        let mut a = w.pop().unwrap();
        a.send(1, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 2];
        let err = b.recv_into(0, &mut out).unwrap_err();
        assert!(matches!(
            err,
            Error::SizeMismatch {
                peer: 0,
                expected: 2,
                got: 3
            }
        ));
        assert!(matches!(
            b.send(5, &[]),
            Err(Error::InvalidRank { rank: 5, .. })
        ));
    }
}
