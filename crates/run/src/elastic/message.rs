//! The wire format between members and the coordinator.
//!
//! Every message is one frame: the body's length as a `u32` little-endian, then the body, a
//! JSON text (serde's externally tagged enums: `"Pending"`, `{"Next":{"commits":[..],
//! "reached":N}}`). A body longer than [`MAX_MESSAGE`] is refused from its length alone,
//! before anything is allocated for it. The decoders are total: any bytes give a message or
//! a [`MessageError`].

use std::io::{self, Read};

use serde::{Deserialize, Serialize};

/// The largest body a frame may announce (1 MiB).
pub const MAX_MESSAGE: usize = 1 << 20;

/// Bytes of a frame's length prefix.
const PREFIX: usize = 4;

/// A request, member to coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Asks for the next world. `commits`: global steps of the commits this member holds in
    /// memory (empty for a new member); `reached`: the last global step it completed (0 for a
    /// new member).
    Next {
        /// Global steps of the commits this member holds.
        commits: Vec<u64>,
        /// The last global step this member completed.
        reached: u64,
    },
    /// Rank 0 at a commit: is a new member waiting, with room under MAX?
    Pending,
    /// Rank 0 of `generation`: training runs again since `unix_s` (seconds since the epoch).
    Resumed {
        /// The generation that resumed.
        generation: u64,
        /// When it resumed, seconds since the Unix epoch.
        unix_s: f64,
    },
    /// This member finished the run.
    Done,
    /// The membership events so far.
    Events,
}

/// A reply, coordinator to member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// The world the member joins (answers [`Request::Next`]).
    World(World),
    /// Whether a new member waits with room for it (answers [`Request::Pending`]).
    Pending(bool),
    /// The membership events so far (answers [`Request::Events`]).
    Events(Vec<MembershipEvent>),
    /// Taken note of (answers [`Request::Resumed`] and [`Request::Done`]).
    Ack,
    /// The run is over for this member; the text says why.
    Abort(String),
}

/// One generation's world, as one member sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct World {
    /// The generation (0 for the first world).
    pub generation: u64,
    /// This member's rank in it.
    pub rank: u32,
    /// Its ranks.
    pub world_size: u32,
    /// Where the ranks meet (rank 0 listens there): a socket address as text,
    /// `"127.0.0.1:PORT"`.
    pub master: String,
    /// The generation's job id, `"{job}/g{generation}"`.
    pub job: String,
    /// `None` for generation 0; else the global step of the commit every survivor restores.
    pub restore_step: Option<u64>,
    /// Ranks `0..survivors` hold the commit at `restore_step`; ranks `survivors..` are new
    /// members (they receive the state).
    pub survivors: u32,
}

/// How one generation formed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MembershipEvent {
    /// The generation this event formed.
    pub generation: u64,
    /// `"start"`, `"lost"`, `"joined"` or `"lost+joined"`.
    pub kind: String,
    /// The broken generation's world size (0 for `"start"`).
    pub world_size_before: u32,
    /// The new generation's world size.
    pub world_size_after: u32,
    /// Ranks, in the broken generation, that died, closed, or were evicted.
    pub lost_ranks: Vec<u32>,
    /// New members admitted.
    pub joined: u32,
    /// The step the survivors restore (`None` for `"start"`).
    pub restore_step: Option<u64>,
    /// The highest `reached` among the survivors (0 for `"start"`).
    pub reached_step: u64,
    /// `reached_step - restore_step` (0 for `"start"`).
    pub steps_lost: u64,
    /// When the coordinator learned the generation broke (its first EOF or `Next`), seconds
    /// since the Unix epoch; the formation time for `"start"`.
    pub detected_unix_s: f64,
    /// When this generation formed, seconds since the Unix epoch.
    pub formed_unix_s: f64,
    /// When its rank 0 reported training running again ([`Request::Resumed`]).
    pub resumed_unix_s: Option<f64>,
}

/// Why a frame or a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    /// The connection ended before a frame began.
    #[error("the connection closed")]
    Closed,
    /// The connection ended inside a frame.
    #[error("the connection closed inside a frame")]
    Truncated,
    /// A frame announced a body over [`MAX_MESSAGE`].
    #[error("a frame announced {len} bytes, over the {MAX_MESSAGE} allowed")]
    TooLarge {
        /// The announced length.
        len: u64,
    },
    /// The body is not a message.
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
    /// Reading failed.
    #[error("reading a frame: {0}")]
    Io(#[from] io::Error),
}

fn frame(body: Vec<u8>) -> Vec<u8> {
    // A body is a few hundred bytes, an event list a few per generation: far below u32.
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(PREFIX + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn body<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing these types cannot fail: string keys only, and a non-finite f64 becomes
    // `null` (which then does not decode).
    serde_json::to_vec(v).unwrap_or_default()
}

/// The whole frame (length prefix and body) of a request.
pub fn encode_request(r: &Request) -> Vec<u8> {
    frame(body(r))
}

/// The whole frame (length prefix and body) of a reply.
pub fn encode_reply(r: &Reply) -> Vec<u8> {
    frame(body(r))
}

/// A request from a frame's body (without the prefix).
pub fn decode_request(body: &[u8]) -> Result<Request, MessageError> {
    check_len(body.len())?;
    Ok(serde_json::from_slice(body)?)
}

/// A reply from a frame's body (without the prefix).
pub fn decode_reply(body: &[u8]) -> Result<Reply, MessageError> {
    check_len(body.len())?;
    Ok(serde_json::from_slice(body)?)
}

fn check_len(len: usize) -> Result<(), MessageError> {
    if len > MAX_MESSAGE {
        return Err(MessageError::TooLarge { len: len as u64 });
    }
    Ok(())
}

/// Reads one frame and returns its body. The length is checked against [`MAX_MESSAGE`]
/// before the body is allocated; the end of input before a frame is
/// [`MessageError::Closed`], inside one [`MessageError::Truncated`].
pub fn read_frame(r: &mut impl Read) -> Result<Vec<u8>, MessageError> {
    let mut prefix = [0u8; PREFIX];
    let mut got = 0;
    while got < PREFIX {
        match r.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Err(MessageError::Closed),
            Ok(0) => return Err(MessageError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(MessageError::Io(e)),
        }
    }
    let len = u32::from_le_bytes(prefix);
    let len = usize::try_from(len).map_err(|_| MessageError::TooLarge { len: len.into() })?;
    check_len(len)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => MessageError::Truncated,
        _ => MessageError::Io(e),
    })?;
    Ok(body)
}

/// The fuzz targets' check: `data` decodes as a request and as a reply to a message or an
/// error, never a panic, and what decodes encodes and decodes back to the same value.
#[cfg(fuzzing)]
pub fn fuzz_message(data: &[u8]) {
    if let Ok(r) = decode_request(data) {
        let f = encode_request(&r);
        let again = decode_request(&f[PREFIX..]);
        assert!(matches!(again, Ok(ref a) if *a == r), "{r:?} -> {again:?}");
    }
    if let Ok(r) = decode_reply(data) {
        let f = encode_reply(&r);
        let again = decode_reply(&f[PREFIX..]);
        assert!(matches!(again, Ok(ref a) if *a == r), "{r:?} -> {again:?}");
    }
    let _ = read_frame(&mut &data[..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_the_length_then_the_json_body() {
        let f = encode_request(&Request::Pending);
        assert_eq!(&f[..4], &9u32.to_le_bytes());
        assert_eq!(&f[4..], b"\"Pending\"");
        let body = read_frame(&mut &f[..]).unwrap();
        assert_eq!(decode_request(&body).unwrap(), Request::Pending);
    }

    #[test]
    fn the_end_of_input_is_closed_before_a_frame_and_truncated_inside_one() {
        assert!(matches!(
            read_frame(&mut &[][..]),
            Err(MessageError::Closed)
        ));
        assert!(matches!(
            read_frame(&mut &[1u8, 0][..]),
            Err(MessageError::Truncated)
        ));
        assert!(matches!(
            read_frame(&mut &[3u8, 0, 0, 0, b'"'][..]),
            Err(MessageError::Truncated)
        ));
    }
}
