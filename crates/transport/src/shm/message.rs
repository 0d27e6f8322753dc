//! A message's way through a ring: its 8-byte length, then its bytes, moved piece by piece
//! as the ring has room ([`Outgoing`]) or data ([`Incoming`]). The length is the peer's
//! word: it is checked against the frame limit before anything is allocated.

use super::ring::Ring;
use crate::{Error, Result};

/// An outgoing message: its 8-byte length, then its bytes.
pub(super) struct Outgoing<'a> {
    pub(super) to: usize,
    pub(super) hdr: [u8; 8],
    pub(super) msg: &'a [u8],
    pub(super) sent: usize,
}

impl Outgoing<'_> {
    pub(super) fn step(&mut self, ring: &mut Ring) -> Result<bool> {
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

    pub(super) fn done(&self) -> bool {
        self.sent == 8 + self.msg.len()
    }
}

/// Where an incoming message goes.
pub(super) enum Sink<'a> {
    /// A growable buffer (cleared first).
    Vec(&'a mut Vec<u8>),
    /// An exact-size buffer.
    Exact(&'a mut [u8]),
    /// Read and dropped: an exact-size receive got another size.
    Discard { expected: usize },
}

/// An incoming message: its 8-byte length, then its bytes.
pub(super) struct Incoming<'a> {
    pub(super) from: usize,
    hdr: [u8; 8],
    hdr_got: usize,
    len: Option<usize>,
    got: usize,
    sink: Sink<'a>,
}

impl<'a> Incoming<'a> {
    pub(super) fn new(from: usize, sink: Sink<'a>) -> Incoming<'a> {
        Incoming {
            from,
            hdr: [0; 8],
            hdr_got: 0,
            len: None,
            got: 0,
            sink,
        }
    }

    pub(super) fn step(&mut self, ring: &mut Ring, max_frame: u64) -> Result<bool> {
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

    pub(super) fn done(&self) -> bool {
        self.len == Some(self.got)
    }

    pub(super) fn finish(self) -> Result<()> {
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
