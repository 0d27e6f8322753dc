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

/// Reads one frame from `r` into `body` (reused), checking the header, the limit (before
/// allocating) and the CRC. Returns the header; decode `body` with [`Request::decode`] or
/// [`Response::decode`].
pub fn read_frame(
    r: &mut impl Read,
    max_body: usize,
    body: &mut Vec<u8>,
) -> Result<FrameHeader, ReadError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => {
                return Err(ReadError::Wire(WireError::Truncated {
                    need: HEADER_LEN,
                    have: got,
                }))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let header = FrameHeader::decode(&h, max_body)?;
    body.clear();
    body.resize(header.len as usize, 0);
    r.read_exact(body).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ReadError::Wire(WireError::Truncated {
                need: header.len as usize,
                have: 0,
            })
        } else {
            ReadError::Io(e)
        }
    })?;
    header.check_body(body)?;
    Ok(header)
}

/// Writes a frame already encoded in `frame`.
pub fn write_frame(w: &mut impl Write, frame: &[u8]) -> io::Result<()> {
    w.write_all(frame)?;
    w.flush()
}
