//! The data path: one send and/or one receive driven to completion over non-blocking sockets
//! with `poll(2)` (full duplex, so a ring step never deadlocks), frame parsing against the
//! size limit, the no-progress deadline, and the abort notice that tells every rank which
//! rank failed.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::frame::{FrameError, FrameHeader, FRAME_HEADER_LEN};
use super::Tcp;
use crate::{Error, Op, Result, SplitStep};

/// Where a receive puts its payload.
pub(super) enum Sink<'a, 'b> {
    Vec(&'a mut Vec<u8>),
    Slice(&'a mut [u8]),
    /// Consecutive pieces of exactly the message's length.
    Pieces(&'a mut [&'b mut [u8]]),
}

/// Reads into the pieces from payload byte `off` on: one `readv` over the unfilled rest of
/// up to [`MAX_IOV`] pieces (no allocation), so a message spread over many small pieces
/// does not cost a system call per piece. `Ok(0)` only at end of stream (the caller stops
/// at the message's length, so some piece is unfilled).
fn read_pieces(
    stream: &mut impl Read,
    pieces: &mut [&mut [u8]],
    mut off: usize,
) -> io::Result<usize> {
    let mut iov: [IoSliceMut<'_>; MAX_IOV] = std::array::from_fn(|_| IoSliceMut::new(&mut []));
    let mut n = 0;
    for p in pieces.iter_mut() {
        if off >= p.len() {
            off -= p.len();
            continue;
        }
        iov[n] = IoSliceMut::new(&mut p[off..]);
        off = 0;
        n += 1;
        if n == MAX_IOV {
            break;
        }
    }
    stream.read_vectored(&mut iov[..n])
}

/// Bytes to write on one connection: `head` then the pieces of `body` in order (a frame
/// header and its payload, or what is left of a posted frame).
#[derive(Clone, Copy)]
struct Out<'a> {
    to: usize,
    head: &'a [u8],
    body: &'a [&'a [u8]],
}

impl Out<'_> {
    fn len(&self) -> usize {
        self.head.len() + body_len(self.body)
    }
}

fn body_len(body: &[&[u8]]) -> usize {
    body.iter().map(|p| p.len()).sum()
}

/// Most pieces handed to one `writev` (the rest go in the next call of the same loop).
const MAX_IOV: usize = 16;

/// A ring step posted with [`SplitStep::post`]: its frame is written up to `sent` bytes
/// (header included); the rest is written from the caller's bytes at completion, no copy.
pub(super) struct Posted {
    to: usize,
    from: usize,
    header: [u8; FRAME_HEADER_LEN],
    len: usize,
    sent: usize,
}

impl Tcp {
    /// Drives one send and/or one receive to completion with `poll(2)`.
    pub(super) fn transfer(
        &mut self,
        send: Option<(usize, &[&[u8]])>,
        recv: Option<(usize, Sink<'_, '_>)>,
    ) -> Result<()> {
        if self.posted.is_some() {
            return Err(Error::Misuse {
                what: "a posted step must be completed before the next call",
            });
        }
        let res = self.checked_transfer(send, recv);
        self.after(res)
    }

    /// On an error that names a failed peer, tells the others (once).
    fn after(&mut self, res: Result<()>) -> Result<()> {
        if let Err(e) = &res {
            if let Some(failed) = failed_rank(e) {
                self.abort(failed);
            }
        }
        res
    }

    fn check_send(&self, to: usize, len: usize) -> Result<[u8; FRAME_HEADER_LEN]> {
        self.check_peer(to)?;
        if len as u64 > self.max_frame {
            return Err(Error::FrameTooLarge {
                peer: to,
                len: len as u64,
                max: self.max_frame,
            });
        }
        Ok(FrameHeader::Data(len as u32).encode())
    }

    fn checked_transfer(
        &mut self,
        send: Option<(usize, &[&[u8]])>,
        recv: Option<(usize, Sink<'_, '_>)>,
    ) -> Result<()> {
        let header = match send {
            Some((to, msg)) => Some(self.check_send(to, body_len(msg))?),
            None => None,
        };
        if let Some((from, _)) = &recv {
            self.check_peer(*from)?;
        }
        let out = send
            .zip(header.as_ref())
            .map(|((to, body), h)| Out { to, head: h, body });
        self.drive(out, recv)?;
        if let Some((_, msg)) = send {
            self.bytes_sent += body_len(msg) as u64;
        }
        Ok(())
    }

    /// Writes as much of `out` from byte `sent` on as the socket takes without blocking;
    /// returns the new count and whether anything moved.
    fn write_some(&mut self, out: Out<'_>, mut sent: usize) -> Result<(usize, bool)> {
        let total = out.len();
        let mut progressed = false;
        let stream = self.peers[out.to].as_mut().expect("checked peer");
        while sent < total {
            // The unsent rest of head and body, as up to MAX_IOV slices (no allocation).
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let (mut n, mut skip) = (0, sent);
            for piece in std::iter::once(out.head).chain(out.body.iter().copied()) {
                if skip >= piece.len() {
                    skip -= piece.len();
                    continue;
                }
                iov[n] = IoSlice::new(&piece[skip..]);
                skip = 0;
                n += 1;
                if n == MAX_IOV {
                    break;
                }
            }
            let r = stream.write_vectored(&iov[..n]);
            match r {
                Ok(0) => {
                    return Err(Error::PeerClosed {
                        peer: out.to,
                        op: Op::Send,
                    })
                }
                Ok(k) => {
                    sent += k;
                    progressed = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(out.to, Op::Send, e)),
            }
        }
        Ok((sent, progressed))
    }

    /// Drives `out` (if any) and one received frame (if any) to completion.
    ///
    /// Longer than 120 lines on purpose: one poll loop drives both sides, and the order of
    /// its steps (a whole frame before an abort notice, the deadline checked before a receive
    /// spins, so a dead peer is named in time) is the point; it reads best as one loop.
    fn drive(&mut self, out: Option<Out<'_>>, recv: Option<(usize, Sink<'_, '_>)>) -> Result<()> {
        let mut sent = 0usize; // bytes of header + payload written
        let send_total = out.map_or(0, |o| o.len());

        let mut rhead = [0u8; FRAME_HEADER_LEN];
        let mut rgot = 0usize; // header bytes, then header + payload bytes
        let mut rtotal: Option<usize> = None; // header + payload, once the header is known
        let (recv_from, mut sink) = match recv {
            Some((f, s)) => (Some(f), Some(s)),
            None => (None, None),
        };
        let mut last_progress = Instant::now();
        self.partial_send = out.filter(|_| send_total > 0).map(|o| o.to);

        loop {
            let mut progressed = false;
            let mut want_out = false;
            let mut want_in = false;
            // Send side.
            if let Some(o) = out {
                if sent < send_total {
                    let (now_sent, moved) = self.write_some(o, sent)?;
                    sent = now_sent;
                    progressed |= moved;
                    want_out = sent < send_total;
                    if !want_out {
                        // The frame is whole: an abort notice after it is read as one, even
                        // when the receive side fails later in this call.
                        self.partial_send = None;
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
                            Sink::Vec(v) => super::sys::read_into_spare(stream, v, end - off),
                            Sink::Slice(s) => stream.read(&mut s[off..end]),
                            Sink::Pieces(ps) => read_pieces(stream, ps, off),
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
                                    // Filled by reads into its spare capacity: no
                                    // zeroing of bytes about to be overwritten.
                                    Sink::Vec(v) => {
                                        v.clear();
                                        v.reserve(len);
                                    }
                                    Sink::Slice(s) if s.len() != len => {
                                        return Err(Error::SizeMismatch {
                                            peer: from,
                                            expected: s.len(),
                                            got: len,
                                        });
                                    }
                                    Sink::Slice(_) => {}
                                    Sink::Pieces(ps) => {
                                        let expected = ps.iter().map(|p| p.len()).sum();
                                        if expected != len {
                                            return Err(Error::SizeMismatch {
                                                peer: from,
                                                expected,
                                                got: len,
                                            });
                                        }
                                    }
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
                    self.stall_error(want_in.then_some(recv_from).flatten(), out.map(|o| o.to))
                );
            }
            // Only a receive spins (after the deadline check, so a dead peer is still named
            // in time): a send waiting for room is a large message, bound by the reader, not
            // by a wake-up.
            if !want_out && now.duration_since(last_progress) < self.spin {
                std::hint::spin_loop();
                continue;
            }
            let mut fds = Vec::with_capacity(2);
            if want_out {
                let to = out.expect("sending").to;
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
                    let peer = recv_from.or(out.map(|o| o.to)).unwrap_or(self.rank);
                    return Err(Error::Io {
                        peer,
                        op: Op::Recv,
                        source: e,
                    });
                }
            }
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

/// The pipelined ring step: [`SplitStep::post`] writes the frame as far as the kernel takes it
/// without blocking and notes how far it got; [`SplitStep::complete_into`] writes the rest
/// from the same bytes (no copy) while it receives, like
/// [`crate::Transport::send_recv_into`]. Between the two calls the kernel keeps moving both
/// directions: our frame drains from the send buffer, the peer's arrives in the receive
/// buffer (the "posted receive"), while the caller reduces the previous segment.
impl SplitStep for Tcp {
    fn post(&mut self, to: usize, msg: &[u8], from: usize) -> Result<()> {
        if self.posted.is_some() {
            return Err(Error::Misuse {
                what: "a second step posted before the first was completed",
            });
        }
        let res = self.post_inner(to, msg, from);
        self.after(res)
    }

    fn complete_into(&mut self, msg: &[u8], out: &mut [u8]) -> Result<()> {
        let Some(p) = self.posted.take() else {
            return Err(Error::Misuse {
                what: "complete_into without a posted step",
            });
        };
        if msg.len() != p.len {
            return Err(Error::Misuse {
                what: "complete_into was given other bytes than the posted step",
            });
        }
        let body = [msg];
        let rest_of_msg;
        let rest = if p.sent < FRAME_HEADER_LEN {
            Out {
                to: p.to,
                head: &p.header[p.sent..],
                body: &body,
            }
        } else {
            rest_of_msg = [&msg[p.sent - FRAME_HEADER_LEN..]];
            Out {
                to: p.to,
                head: &[],
                body: &rest_of_msg,
            }
        };
        let res = self.drive(Some(rest), Some((p.from, Sink::Slice(out))));
        if res.is_ok() {
            self.bytes_sent += p.len as u64;
        }
        self.after(res)
    }
}

impl Tcp {
    fn post_inner(&mut self, to: usize, msg: &[u8], from: usize) -> Result<()> {
        let header = self.check_send(to, msg.len())?;
        self.check_peer(from)?;
        self.partial_send = Some(to);
        let body = [msg];
        let out = Out {
            to,
            head: &header,
            body: &body,
        };
        let (sent, _) = self.write_some(out, 0)?;
        if sent == FRAME_HEADER_LEN + msg.len() {
            self.partial_send = None;
        }
        self.posted = Some(Posted {
            to,
            from,
            header,
            len: msg.len(),
            sent,
        });
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most `chunk` bytes per call, vectored or not (as a socket
    /// with little data queued does).
    struct Trickle<'a> {
        data: &'a [u8],
        chunk: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.read_vectored(&mut [IoSliceMut::new(buf)])
        }
        fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
            let mut n = 0;
            for b in bufs.iter_mut() {
                let k = b.len().min(self.chunk - n).min(self.data.len());
                b[..k].copy_from_slice(&self.data[..k]);
                self.data = &self.data[k..];
                n += k;
                if n == self.chunk || self.data.is_empty() {
                    break;
                }
            }
            Ok(n)
        }
    }

    /// Reading a message into pieces call after call (each from the offset reached so far)
    /// fills them with exactly the message, whatever the cut: empty pieces, more pieces than
    /// one `readv` takes, and reads that stop inside a piece.
    #[test]
    fn pieces_fill_with_the_message_in_order() {
        let lens: Vec<usize> = vec![
            0, 3, 1, 0, 5, 2, 2, 0, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 0, 9,
        ];
        let total: usize = lens.iter().sum();
        let msg: Vec<u8> = (0..total).map(|i| (i * 7 + 3) as u8).collect();
        for chunk in [1, 2, 3, 5, 8, 13, total] {
            let mut store: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0xEE; n]).collect();
            let mut pieces: Vec<&mut [u8]> = store.iter_mut().map(Vec::as_mut_slice).collect();
            let mut src = Trickle { data: &msg, chunk };
            let (mut got, mut calls) = (0, 0);
            while got < total {
                let k = read_pieces(&mut src, &mut pieces, got).unwrap();
                assert!(k > 0, "chunk {chunk}: no progress at {got}");
                got += k;
                calls += 1;
            }
            assert_eq!(got, total);
            assert_eq!(store.concat(), msg, "chunk {chunk}");
            if chunk == total {
                // 21 pieces, 17 of them non-empty, at most 16 per readv: two calls.
                assert_eq!(calls, 2);
            }
        }
    }
}
