//! Frames on a stream: reading one whole frame (header checked before the body is read)
//! and writing an encoded one.

use std::io::{self, Read, Write};

use super::{FrameHeader, WireError, HEADER_LEN};

/// Why a frame could not be read from a stream.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed")]
    Closed,
    /// The socket failed or timed out.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The bytes are not a valid frame.
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
}

/// Body bytes committed ahead of what has arrived: the buffer grows by at most this much,
/// or by what it holds already (doubling), per read.
const GROW_STEP: usize = 64 << 10;

/// Reads one frame from `r` into `body` (reused), checking the header, the limit (before
/// allocating) and the CRC. Returns the header; decode `body` with [`super::Request::decode`] or
/// [`super::Response::decode`].
///
/// Memory follows the bytes that arrive: a header announcing a large body commits nothing
/// until the body comes, and the buffer at most doubles per read. A read that times out in
/// the middle of a frame (the reader's deadline) is a [`WireError::Truncated`] naming how
/// much came; before the first byte it is [`ReadError::Io`] (an idle connection).
pub fn read_frame(
    r: &mut impl Read,
    max_body: usize,
    body: &mut Vec<u8>,
) -> Result<FrameHeader, ReadError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    let cut = |need: usize, have: usize| ReadError::Wire(WireError::Truncated { need, have });
    while got < HEADER_LEN {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(cut(HEADER_LEN, got)),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if got > 0 && is_timeout(&e) => return Err(cut(HEADER_LEN, got)),
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let header = FrameHeader::decode(&h, max_body)?;
    let len = header.len as usize;
    body.clear();
    while body.len() < len {
        let have = body.len();
        let step = (len - have).min(GROW_STEP.max(have));
        body.resize(have + step, 0);
        match r.read(&mut body[have..]) {
            Ok(0) => {
                body.truncate(have);
                return Err(cut(HEADER_LEN + len, HEADER_LEN + have));
            }
            Ok(n) => body.truncate(have + n),
            Err(e) => {
                body.truncate(have);
                match e.kind() {
                    io::ErrorKind::Interrupted => {}
                    _ if is_timeout(&e) => return Err(cut(HEADER_LEN + len, HEADER_LEN + have)),
                    _ => return Err(ReadError::Io(e)),
                }
            }
        }
    }
    header.check_body(body)?;
    Ok(header)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Writes a frame already encoded in `frame`.
pub fn write_frame(w: &mut impl Write, frame: &[u8]) -> io::Result<()> {
    w.write_all(frame)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Yields `data`, then fails every read as a timed-out socket would.
    struct Stalls<'a>(&'a [u8]);

    impl Read for Stalls<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn header(len: u32) -> Vec<u8> {
        let mut f = Vec::new();
        crate::wire::Request::Stats.encode(5, &mut f);
        f[8..12].copy_from_slice(&len.to_le_bytes());
        f
    }

    #[test]
    fn a_large_announced_body_commits_memory_only_as_it_arrives() {
        let max = crate::wire::DEFAULT_MAX_BODY;
        let mut data = header(64 << 20);
        data.extend_from_slice(&[7u8; 1000]);
        let mut body = Vec::new();
        let e = read_frame(&mut Stalls(&data), max, &mut body).unwrap_err();
        assert!(
            matches!(e, ReadError::Wire(WireError::Truncated { need, have })
                if need == HEADER_LEN + (64 << 20) && have == HEADER_LEN + 1000),
            "{e:?}"
        );
        assert!(
            body.capacity() <= 2 * GROW_STEP,
            "{} bytes committed for 1000 received",
            body.capacity()
        );
    }

    #[test]
    fn a_stall_before_any_byte_is_idle_and_inside_a_header_is_truncated() {
        let mut body = Vec::new();
        let max = crate::wire::DEFAULT_MAX_BODY;
        assert!(matches!(
            read_frame(&mut Stalls(&[]), max, &mut body),
            Err(ReadError::Io(_))
        ));
        assert!(matches!(
            read_frame(&mut Stalls(&header(0)[..10]), max, &mut body),
            Err(ReadError::Wire(WireError::Truncated {
                need: HEADER_LEN,
                have: 10
            }))
        ));
    }

    #[test]
    fn a_body_arriving_in_pieces_is_read_whole() {
        let mut f = Vec::new();
        crate::wire::Request::SetVec {
            slot: 1 << 33,
            chunk: crate::ChunkId {
                key: crate::Key(1),
                index: 0,
            },
            values: vec![1.5; 100_000],
        }
        .encode(3, &mut f);
        /// Yields the frame in pieces of at most 777 bytes.
        struct Pieces<'a>(&'a [u8]);
        impl Read for Pieces<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(self.0.len()).min(777);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut body = Vec::new();
        let h = read_frame(&mut Pieces(&f), crate::wire::DEFAULT_MAX_BODY, &mut body).unwrap();
        assert_eq!(h.rid, 3);
        assert_eq!(&body[..], &f[HEADER_LEN..]);
    }
}
