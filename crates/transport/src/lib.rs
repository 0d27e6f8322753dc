//! gradwire-transport: moves bytes between ranks.
//!
//! This layer owns point-to-point messaging between the `world_size` ranks of a job: a
//! [`Transport`] sends and receives whole messages (framed byte buffers, ordered per pair of
//! ranks) with a deadline on every blocking call. It knows nothing of f32, gradients or
//! codecs; collectives live in `gradwire-collective`.
//!
//! Implementations: [`local`] (ranks as threads of one process, for tests and single-process
//! use) and [`tcp`] (a full mesh over TCP with rendezvous at rank 0 and a shared-token
//! handshake), and `shm` (ranks of one host through shared-memory rings).
//! [`link::Throttled`] wraps any of them to emulate a slower network. [`split`] makes groups
//! of ranks with transports of their own (`MPI_Comm_split`; [`split::grid`] for the replica
//! and partition groups of model parallelism).
//! With feature `mpi`, `mpi::Mpi` runs each rank as one process of an MPI job: start it with
//! `mpirun -np N prog` or `srun -n N prog` and call `Mpi::from_env()` (see the `mpi` module).
//!
//! Glossary: a *rank* is one member of the job, numbered `0..world_size`; *peer* is only used
//! for "the other rank" of a point-to-point call.
//!
//! ```
//! use gradwire_transport::{local::Local, Transport};
//! let ranks = Local::world(2);
//! let handles: Vec<_> = ranks.into_iter().map(|mut t| std::thread::spawn(move || {
//!     let me = t.rank();
//!     let mut buf = Vec::new();
//!     t.send_recv(1 - me, &[me as u8], 1 - me, &mut buf).unwrap();
//!     buf[0] as usize
//! })).collect();
//! let got: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
//! assert_eq!(got, vec![1, 0]);
//! ```
#![deny(missing_docs)]

pub mod env;
mod error;
pub mod link;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(unix)]
pub mod shm;
pub mod split;
pub mod tcp;

pub use error::{Error, Op, Result};

use std::time::Duration;

/// The default deadline of every blocking call: long enough for a slow step, short enough
/// that a dead rank is named within a minute.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Moves whole messages between ranks.
///
/// Messages between one pair of ranks arrive in the order they were sent. Every blocking call
/// fails with an [`Error`] naming the peer when the peer dies or stalls past the deadline.
pub trait Transport: Send {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the job.
    fn world_size(&self) -> usize;

    /// Sends one message to `to`. May block while the peer's buffers are full.
    fn send(&mut self, to: usize, msg: &[u8]) -> Result<()>;

    /// Receives the next message from `from` into `buf` (cleared first; its capacity is reused).
    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> Result<()>;

    /// Sends `msg` to `to` while receiving the next message from `from` into `buf`, without
    /// deadlocking at any message size (one ring step). `to` and `from` may be the same rank.
    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()>;

    /// Receives the next message from `from` into `out`, which must be its exact length
    /// (otherwise [`Error::SizeMismatch`]). Lets a caller receive straight into its buffer.
    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        let mut buf = Vec::with_capacity(out.len());
        self.recv(from, &mut buf)?;
        copy_exact(from, &buf, out)
    }

    /// [`Transport::send_recv`] receiving straight into `out`, which must be the exact length
    /// of the incoming message.
    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        let mut buf = Vec::with_capacity(out.len());
        self.send_recv(to, msg, from, &mut buf)?;
        copy_exact(from, &buf, out)
    }

    /// [`Transport::send_recv`] with the message given in pieces: sends their concatenation
    /// as one message (the receiver cannot tell the difference), so the caller need not
    /// assemble it. The default assembles it and calls `send_recv`; the TCP transport writes
    /// the pieces straight from the caller's buffers with vectored writes.
    fn send_recv_parts(
        &mut self,
        to: usize,
        parts: &[&[u8]],
        from: usize,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        let msg = parts.concat();
        self.send_recv(to, &msg, from, buf)
    }

    /// [`Transport::send_recv_parts`] receiving straight into the pieces of `out`, in order,
    /// whose lengths must add up to the incoming message's (otherwise
    /// [`Error::SizeMismatch`]). The default receives into a buffer and copies; the TCP
    /// transport reads into the pieces.
    fn send_recv_parts_into(
        &mut self,
        to: usize,
        parts: &[&[u8]],
        from: usize,
        out: &mut [&mut [u8]],
    ) -> Result<()> {
        let mut buf = Vec::new();
        self.send_recv_parts(to, parts, from, &mut buf)?;
        scatter_exact(from, &buf, out)
    }

    /// The deadline applied to each blocking call.
    fn timeout(&self) -> Duration;

    /// Changes the deadline applied to each blocking call.
    fn set_timeout(&mut self, timeout: Duration);

    /// Total payload bytes this rank has sent so far (frame headers excluded).
    fn bytes_sent(&self) -> u64;

    /// The split form of [`Transport::send_recv_into`], if this transport has one (see
    /// [`SplitStep`]); `None`, the default, makes callers use `send_recv_into`.
    fn split_step(&mut self) -> Option<&mut dyn SplitStep> {
        None
    }

    /// This transport as one that can be split into groups ([`split::Split`]), if it can;
    /// `None`, the default, makes [`split::split`] answer [`Error::SplitUnsupported`].
    fn splitter(&mut self) -> Option<&mut dyn split::Split> {
        None
    }
}

/// A ring step split in two, so the caller can work while it is in flight: the pipelined
/// ring posts segment `i + 1` before it reduces segment `i`, and the wire never waits for
/// the adder.
///
/// `post(to, msg, from)` then `complete_into(msg, out)` has the effect of
/// `send_recv_into(to, msg, from, out)`; `complete_into` must be given the same bytes again
/// (unchanged in between), so the transport sends the rest of them without keeping a copy. At most one step is in flight: any other call on
/// the transport before `complete_into` is a bug (the TCP transport answers it with
/// [`Error::Misuse`]). `post` may return
/// before `msg` is sent, and never blocks on the peer; errors of either half may surface at either call.
pub trait SplitStep {
    /// Starts sending `msg` to `to`, and expects the next message from `from`.
    fn post(&mut self, to: usize, msg: &[u8], from: usize) -> Result<()>;

    /// Finishes the posted step: completes the send of `msg` (the bytes given to `post`), and
    /// receives the message from `from` into `out`, which must be its exact length.
    fn complete_into(&mut self, msg: &[u8], out: &mut [u8]) -> Result<()>;
}

/// Copies a received message into pieces of exactly its total length, or reports the
/// mismatch.
fn scatter_exact(from: usize, buf: &[u8], out: &mut [&mut [u8]]) -> Result<()> {
    let expected: usize = out.iter().map(|p| p.len()).sum();
    if buf.len() != expected {
        return Err(Error::SizeMismatch {
            peer: from,
            expected,
            got: buf.len(),
        });
    }
    let mut at = 0;
    for p in out.iter_mut() {
        p.copy_from_slice(&buf[at..at + p.len()]);
        at += p.len();
    }
    Ok(())
}

/// `rank` as a rank of a world of `world_size` ranks, or [`Error::InvalidRank`] when it is
/// not one (every rank is, for a world of none).
pub(crate) fn check_rank(rank: usize, world_size: usize) -> Result<()> {
    if rank >= world_size {
        return Err(Error::InvalidRank { rank, world_size });
    }
    Ok(())
}

/// Copies a received message into an exact-size buffer, or reports the mismatch.
fn copy_exact(from: usize, buf: &[u8], out: &mut [u8]) -> Result<()> {
    if buf.len() != out.len() {
        return Err(Error::SizeMismatch {
            peer: from,
            expected: out.len(),
            got: buf.len(),
        });
    }
    out.copy_from_slice(buf);
    Ok(())
}

impl<T: Transport + ?Sized> Transport for Box<T> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn send(&mut self, to: usize, msg: &[u8]) -> Result<()> {
        (**self).send(to, msg)
    }
    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> Result<()> {
        (**self).recv(from, buf)
    }
    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()> {
        (**self).send_recv(to, msg, from, buf)
    }
    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        (**self).recv_into(from, out)
    }
    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        (**self).send_recv_into(to, msg, from, out)
    }
    fn send_recv_parts(
        &mut self,
        to: usize,
        parts: &[&[u8]],
        from: usize,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        (**self).send_recv_parts(to, parts, from, buf)
    }
    fn send_recv_parts_into(
        &mut self,
        to: usize,
        parts: &[&[u8]],
        from: usize,
        out: &mut [&mut [u8]],
    ) -> Result<()> {
        (**self).send_recv_parts_into(to, parts, from, out)
    }
    fn timeout(&self) -> Duration {
        (**self).timeout()
    }
    fn set_timeout(&mut self, timeout: Duration) {
        (**self).set_timeout(timeout)
    }
    fn bytes_sent(&self) -> u64 {
        (**self).bytes_sent()
    }
    fn split_step(&mut self) -> Option<&mut dyn SplitStep> {
        (**self).split_step()
    }
    fn splitter(&mut self) -> Option<&mut dyn split::Split> {
        (**self).splitter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compile-time guard: the trait stays usable as `dyn`.
    #[test]
    fn transport_is_object_safe() {
        let ranks: Vec<Box<dyn Transport>> = local::Local::world(1)
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .collect();
        assert_eq!(ranks[0].world_size(), 1);
    }

    /// The default piecewise send and receive (the in-process transport has no override):
    /// pieces arrive as their concatenation, receive pieces cut differently are filled in
    /// order, and receive pieces of the wrong total are a typed error.
    #[test]
    fn default_pieces_are_the_concatenation() {
        let got: Vec<(Vec<u8>, Vec<u8>, bool)> = std::thread::scope(|s| {
            let hs: Vec<_> = local::Local::world(2)
                .into_iter()
                .map(|mut t| {
                    s.spawn(move || {
                        let me = t.rank() as u8;
                        let other = 1 - t.rank();
                        let (a, b) = ([me; 3], [me + 10; 2]);
                        let mut buf = Vec::new();
                        t.send_recv_parts(other, &[&a, &[], &b], other, &mut buf)
                            .unwrap();
                        let (mut x, mut y) = ([0u8; 1], [0u8; 4]);
                        t.send_recv_parts_into(
                            other,
                            &[&b, &a],
                            other,
                            &mut [&mut x, &mut [], &mut y],
                        )
                        .unwrap();
                        let into: Vec<u8> = x.iter().chain(&y).copied().collect();
                        let mut short = [0u8; 4];
                        let err = t
                            .send_recv_parts_into(other, &[&a, &b], other, &mut [&mut short])
                            .unwrap_err();
                        let typed = matches!(
                            err,
                            Error::SizeMismatch { peer, expected: 4, got: 5 } if peer == other
                        );
                        (buf, into, typed)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got[0], (vec![1, 1, 1, 11, 11], vec![11, 11, 1, 1, 1], true));
        assert_eq!(got[1], (vec![0, 0, 0, 10, 10], vec![10, 10, 0, 0, 0], true));
    }
}
