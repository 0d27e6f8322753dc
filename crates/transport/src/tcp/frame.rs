//! The frame header of the TCP transport, and the rendezvous handshake messages.
//!
//! Data frame header (8 bytes, little-endian):
//! ```text
//! 0..4  magic  u32 = 0x3146_5747 ("GWF1") for a message, 0x3141_5747 ("GWA1") for an abort
//! 4..8  len    u32 payload bytes that follow (for an abort: the rank that failed; no payload)
//! ```
//! Handshake (sent once by the connecting side, before any frame):
//! ```text
//! 0..4   magic      u32 = 0x3148_5747 ("GWH1")
//! 4      kind       u8  (1 = hello to rank 0, 2 = join between ranks > 0)
//! 5..9   rank       u32
//! 9..13  world_size u32
//! 13..15 port       u16 (the sender's listening port; hello only)
//! 15..17 token_len  u16 (at most MAX_TOKEN)
//! 17..   token      token_len bytes
//! ```
//! Rank 0's reply to a hello: magic `GWT1`, then `world_size` entries of
//! (ipv4/ipv6 tag u8, 16 address bytes, port u16).

/// Magic of a data frame.
pub const MAGIC_DATA: u32 = 0x3146_5747;
/// Magic of an abort frame.
pub const MAGIC_ABORT: u32 = 0x3141_5747;
/// Magic of a handshake.
pub const MAGIC_HELLO: u32 = 0x3148_5747;
/// Magic of the address table rank 0 sends back.
pub const MAGIC_TABLE: u32 = 0x3154_5747;
/// Length of a data frame header.
pub const FRAME_HEADER_LEN: usize = 8;
/// Longest accepted token.
pub const MAX_TOKEN: usize = 1024;
/// Length of the fixed part of a handshake.
pub const HELLO_FIXED_LEN: usize = 17;
/// Length of one address-table entry.
pub const TABLE_ENTRY_LEN: usize = 19;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameHeader {
    /// A message of this many payload bytes follows.
    Data(u32),
    /// The sender reports that this rank failed; the job is over.
    Abort(u32),
}

/// Why a frame header or handshake was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Unknown magic.
    BadMagic,
    /// Fewer bytes than the fixed part.
    Truncated,
    /// A length above the limit.
    TooLarge(u64),
    /// A field out of range.
    BadField(&'static str),
}

impl FrameHeader {
    /// Encodes the header.
    pub fn encode(self) -> [u8; FRAME_HEADER_LEN] {
        let (magic, v) = match self {
            FrameHeader::Data(len) => (MAGIC_DATA, len),
            FrameHeader::Abort(rank) => (MAGIC_ABORT, rank),
        };
        let mut h = [0u8; FRAME_HEADER_LEN];
        h[..4].copy_from_slice(&magic.to_le_bytes());
        h[4..].copy_from_slice(&v.to_le_bytes());
        h
    }

    /// Decodes and checks a header against the frame-size limit.
    pub fn decode(h: &[u8; FRAME_HEADER_LEN], max_frame: u64) -> Result<FrameHeader, FrameError> {
        let magic = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let v = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        match magic {
            MAGIC_DATA if u64::from(v) > max_frame => Err(FrameError::TooLarge(v.into())),
            MAGIC_DATA => Ok(FrameHeader::Data(v)),
            MAGIC_ABORT => Ok(FrameHeader::Abort(v)),
            _ => Err(FrameError::BadMagic),
        }
    }
}

/// Which handshake a connection opens with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloKind {
    /// A rank > 0 announcing itself to rank 0.
    Hello = 1,
    /// A rank > 0 connecting to a lower rank > 0.
    Join = 2,
}

/// A decoded handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Which handshake.
    pub kind: HelloKind,
    /// The sender's rank.
    pub rank: u32,
    /// The sender's idea of the world size.
    pub world_size: u32,
    /// The sender's listening port.
    pub port: u16,
    /// The shared secret.
    pub token: Vec<u8>,
}

impl Hello {
    /// Encodes the handshake.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HELLO_FIXED_LEN + self.token.len());
        v.extend_from_slice(&MAGIC_HELLO.to_le_bytes());
        v.push(self.kind as u8);
        v.extend_from_slice(&self.rank.to_le_bytes());
        v.extend_from_slice(&self.world_size.to_le_bytes());
        v.extend_from_slice(&self.port.to_le_bytes());
        v.extend_from_slice(&(self.token.len() as u16).to_le_bytes());
        v.extend_from_slice(&self.token);
        v
    }

    /// Decodes the fixed part; returns the handshake without its token and the token length
    /// still to read.
    pub fn decode_fixed(b: &[u8]) -> Result<(Hello, usize), FrameError> {
        if b.len() < HELLO_FIXED_LEN {
            return Err(FrameError::Truncated);
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u32_at(0) != MAGIC_HELLO {
            return Err(FrameError::BadMagic);
        }
        let kind = match b[4] {
            1 => HelloKind::Hello,
            2 => HelloKind::Join,
            _ => return Err(FrameError::BadField("kind")),
        };
        let token_len = usize::from(u16::from_le_bytes([b[15], b[16]]));
        if token_len > MAX_TOKEN {
            return Err(FrameError::TooLarge(token_len as u64));
        }
        let hello = Hello {
            kind,
            rank: u32_at(5),
            world_size: u32_at(9),
            port: u16::from_le_bytes([b[13], b[14]]),
            token: Vec::new(),
        };
        Ok((hello, token_len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_header_round_trip_and_limits() {
        let h = FrameHeader::Data(1000).encode();
        assert_eq!(FrameHeader::decode(&h, 1000), Ok(FrameHeader::Data(1000)));
        assert_eq!(
            FrameHeader::decode(&h, 999),
            Err(FrameError::TooLarge(1000))
        );
        let a = FrameHeader::Abort(3).encode();
        assert_eq!(FrameHeader::decode(&a, 0), Ok(FrameHeader::Abort(3)));
        assert_eq!(
            FrameHeader::decode(&[0u8; 8], 10),
            Err(FrameError::BadMagic)
        );
    }

    #[test]
    fn hello_round_trip_and_garbage() {
        let h = Hello {
            kind: HelloKind::Join,
            rank: 3,
            world_size: 8,
            port: 4242,
            token: b"s3cret".to_vec(),
        };
        let b = h.encode();
        let (d, n) = Hello::decode_fixed(&b).unwrap();
        assert_eq!(n, 6);
        assert_eq!(
            Hello {
                token: b[HELLO_FIXED_LEN..].to_vec(),
                ..d
            },
            h
        );
        assert_eq!(Hello::decode_fixed(&b[..5]), Err(FrameError::Truncated));
        let mut bad = b.clone();
        bad[4] = 9;
        assert_eq!(Hello::decode_fixed(&bad), Err(FrameError::BadField("kind")));
        let mut big = b;
        big[15..17].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(
            Hello::decode_fixed(&big),
            Err(FrameError::TooLarge(_))
        ));
    }
}
