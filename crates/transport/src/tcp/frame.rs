//! The wire formats of the TCP transport: the frame header, the handshake messages and the
//! address table. Every decoder here is pure and total (malformed bytes give an error, never
//! a panic), and each is a fuzz target (`fuzz/fuzz_targets/tcp_*.rs`).
//!
//! Data frame header (8 bytes, little-endian):
//! ```text
//! 0..4  magic  u32 = 0x3146_5747 ("GWF1") for a message, 0x3141_5747 ("GWA1") for an abort
//! 4..8  len    u32 payload bytes that follow (for an abort: the rank that failed; no payload)
//! ```
//! Handshake (the order and the proofs are described in [`super::auth`]). The token never
//! crosses the wire: each side proves it knows it with an HMAC-SHA256 over the whole exchange
//! so far, the connecting side first.
//! ```text
//! hello, connecting side -> accepting side (47 bytes)
//! 0..4   magic      u32 = 0x3348_5747 ("GWH3")
//! 4      kind       u8  (1 = hello to rank 0, 2 = join between ranks > 0)
//! 5..9   rank       u32
//! 9..13  world_size u32
//! 13..15 port       u16 (the sender's listening port; hello only)
//! 15..31 nonce      16 random bytes
//! 31..47 job        16 bytes: the digest of the job's identity (`auth::job_digest`)
//!
//! challenge, accepting side -> connecting side (24 bytes)
//! 0..4   magic      u32 = 0x3343_5747 ("GWC3")
//! 4..8   rank       u32 (the accepting rank)
//! 8..24  nonce      16 random bytes
//!
//! proof, connecting side -> accepting side (36 bytes)
//! 0..4   magic      u32 = 0x3350_5747 ("GWP3")
//! 4..36  mac        HMAC-SHA256(token, "gradwire connect" | hello | challenge)
//!
//! confirm, accepting side -> connecting side (36 bytes)
//! 0..4   magic      u32 = 0x334B_5747 ("GWK3")
//! 4..36  mac        HMAC-SHA256(token, "gradwire accept" | hello | challenge | proof)
//! ```
//! Rank 0's reply once every rank has joined: the mesh identity (20 bytes: magic `GWM1`, 16
//! random bytes that bind the connections between the other ranks to this mesh), then the
//! address table (`4 + 19 * world_size` bytes): magic `GWT1`, then one entry per rank: tag
//! u8 (4 = IPv4, 6 = IPv6), 16 address bytes (IPv4 as an IPv4-mapped IPv6 address), port u16.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Magic of a data frame.
pub const MAGIC_DATA: u32 = 0x3146_5747;
/// Magic of an abort frame.
pub const MAGIC_ABORT: u32 = 0x3141_5747;
/// Magic of a hello (the handshake's first message).
pub const MAGIC_HELLO: u32 = 0x3348_5747;
/// Magic of a challenge (the accepting side's answer: its rank and nonce).
pub const MAGIC_CHALLENGE: u32 = 0x3343_5747;
/// Magic of a proof (the connecting side's answer).
pub const MAGIC_PROOF: u32 = 0x3350_5747;
/// Magic of a confirm (the accepting side's proof, sent once the connecting side's checked).
pub const MAGIC_CONFIRM: u32 = 0x334B_5747;
/// Magic of the mesh identity rank 0 sends before the address table.
pub const MAGIC_MESH: u32 = 0x314D_5747;
/// Magic of the address table rank 0 sends back.
pub const MAGIC_TABLE: u32 = 0x3154_5747;
/// Length of a data frame header.
pub const FRAME_HEADER_LEN: usize = 8;
/// Largest payload a frame header can announce.
pub const MAX_FRAME_LIMIT: u64 = u32::MAX as u64;
/// Length of a handshake nonce.
pub const NONCE_LEN: usize = 16;
/// Length of an HMAC-SHA256 tag.
pub const MAC_LEN: usize = 32;
/// Length of the job digest a hello carries.
pub const JOB_LEN: usize = 16;
/// Length of a hello.
pub const HELLO_LEN: usize = 47;
/// Length of a challenge.
pub const CHALLENGE_LEN: usize = 24;
/// Length of a proof.
pub const PROOF_LEN: usize = 36;
/// Length of a confirm.
pub const CONFIRM_LEN: usize = 36;
/// Length of the mesh identity message.
pub const MESH_LEN: usize = 20;
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

/// The connecting side's first message.
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
    /// Fresh random bytes, so no proof can be replayed.
    pub nonce: [u8; NONCE_LEN],
    /// The digest of the job's identity (`auth::job_digest`): a rank of another job is
    /// refused before any proof.
    pub job: [u8; JOB_LEN],
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn check_len(b: &[u8], len: usize) -> Result<(), FrameError> {
    match b.len() {
        n if n < len => Err(FrameError::Truncated),
        n if n > len => Err(FrameError::BadField("trailing bytes")),
        _ => Ok(()),
    }
}

/// Checks a message of fixed length `len` that opens with `magic`: exactly `len` bytes
/// (checked first), then the magic.
fn open(b: &[u8], len: usize, magic: u32) -> Result<(), FrameError> {
    check_len(b, len)?;
    if u32_at(b, 0) != magic {
        return Err(FrameError::BadMagic);
    }
    Ok(())
}

// The messages built by `tagged` and read by `untagged`: a magic and one fixed-size body.
const _: () = assert!(PROOF_LEN == 4 + MAC_LEN && CONFIRM_LEN == 4 + MAC_LEN);
const _: () = assert!(MESH_LEN == 4 + NONCE_LEN);

/// A message of `N` bytes: `magic`, then the fixed-size `body` (`N - 4` bytes).
fn tagged<const N: usize>(magic: u32, body: &[u8]) -> [u8; N] {
    let mut v = [0u8; N];
    v[..4].copy_from_slice(&magic.to_le_bytes());
    v[4..].copy_from_slice(body);
    v
}

/// The body of a message of exactly `4 + B` bytes that opens with `magic` (see [`tagged`]).
fn untagged<const B: usize>(b: &[u8], magic: u32) -> Result<[u8; B], FrameError> {
    open(b, 4 + B, magic)?;
    let mut body = [0u8; B];
    body.copy_from_slice(&b[4..]);
    Ok(body)
}

impl Hello {
    /// Encodes the hello.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut v = [0u8; HELLO_LEN];
        v[..4].copy_from_slice(&MAGIC_HELLO.to_le_bytes());
        v[4] = self.kind as u8;
        v[5..9].copy_from_slice(&self.rank.to_le_bytes());
        v[9..13].copy_from_slice(&self.world_size.to_le_bytes());
        v[13..15].copy_from_slice(&self.port.to_le_bytes());
        v[15..31].copy_from_slice(&self.nonce);
        v[31..].copy_from_slice(&self.job);
        v
    }

    /// Decodes a hello of exactly [`HELLO_LEN`] bytes.
    pub fn decode(b: &[u8]) -> Result<Hello, FrameError> {
        open(b, HELLO_LEN, MAGIC_HELLO)?;
        let kind = match b[4] {
            1 => HelloKind::Hello,
            2 => HelloKind::Join,
            _ => return Err(FrameError::BadField("kind")),
        };
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[15..31]);
        let mut job = [0u8; JOB_LEN];
        job.copy_from_slice(&b[31..HELLO_LEN]);
        Ok(Hello {
            kind,
            rank: u32_at(b, 5),
            world_size: u32_at(b, 9),
            port: u16::from_le_bytes([b[13], b[14]]),
            nonce,
            job,
        })
    }
}

/// The accepting side's answer to a hello: its rank and its nonce. It carries nothing
/// derived from the token: the connecting side proves first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// The accepting rank.
    pub rank: u32,
    /// Fresh random bytes.
    pub nonce: [u8; NONCE_LEN],
}

impl Challenge {
    /// Encodes the challenge.
    pub fn encode(&self) -> [u8; CHALLENGE_LEN] {
        let mut v = [0u8; CHALLENGE_LEN];
        v[..4].copy_from_slice(&MAGIC_CHALLENGE.to_le_bytes());
        v[4..8].copy_from_slice(&self.rank.to_le_bytes());
        v[8..].copy_from_slice(&self.nonce);
        v
    }

    /// Decodes a challenge of exactly [`CHALLENGE_LEN`] bytes.
    pub fn decode(b: &[u8]) -> Result<Challenge, FrameError> {
        open(b, CHALLENGE_LEN, MAGIC_CHALLENGE)?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[8..CHALLENGE_LEN]);
        Ok(Challenge {
            rank: u32_at(b, 4),
            nonce,
        })
    }
}

/// The connecting side's proof that it knows the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// HMAC over the hello and the whole challenge.
    pub mac: [u8; MAC_LEN],
}

impl Proof {
    /// Encodes the proof.
    pub fn encode(&self) -> [u8; PROOF_LEN] {
        tagged(MAGIC_PROOF, &self.mac)
    }

    /// Decodes a proof of exactly [`PROOF_LEN`] bytes.
    pub fn decode(b: &[u8]) -> Result<Proof, FrameError> {
        Ok(Proof {
            mac: untagged(b, MAGIC_PROOF)?,
        })
    }
}

/// The accepting side's proof that it knows the token, sent once the connecting side has
/// proven it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirm {
    /// HMAC over the hello, the challenge and the proof.
    pub mac: [u8; MAC_LEN],
}

impl Confirm {
    /// Encodes the confirm.
    pub fn encode(&self) -> [u8; CONFIRM_LEN] {
        tagged(MAGIC_CONFIRM, &self.mac)
    }

    /// Decodes a confirm of exactly [`CONFIRM_LEN`] bytes.
    pub fn decode(b: &[u8]) -> Result<Confirm, FrameError> {
        Ok(Confirm {
            mac: untagged(b, MAGIC_CONFIRM)?,
        })
    }
}

/// Encodes the mesh identity message.
pub fn encode_mesh(mesh: &[u8; NONCE_LEN]) -> [u8; MESH_LEN] {
    tagged(MAGIC_MESH, mesh)
}

/// Decodes a mesh identity message of exactly [`MESH_LEN`] bytes.
pub fn decode_mesh(b: &[u8]) -> Result<[u8; NONCE_LEN], FrameError> {
    untagged(b, MAGIC_MESH)
}

/// Length of the address table of a world of `world_size` ranks.
pub fn table_len(world_size: usize) -> usize {
    4 + world_size * TABLE_ENTRY_LEN
}

/// Encodes the address table (rank order).
pub fn encode_table(addrs: &[SocketAddr]) -> Vec<u8> {
    let mut out = Vec::with_capacity(table_len(addrs.len()));
    out.extend_from_slice(&MAGIC_TABLE.to_le_bytes());
    for a in addrs {
        let (tag, bytes) = match a.ip() {
            IpAddr::V4(v4) => (4u8, v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => (6u8, v6.octets()),
        };
        out.push(tag);
        out.extend_from_slice(&bytes);
        out.extend_from_slice(&a.port().to_le_bytes());
    }
    out
}

/// Decodes an address table of exactly `world_size` entries.
pub fn decode_table(b: &[u8], world_size: usize) -> Result<Vec<SocketAddr>, FrameError> {
    let len = world_size
        .checked_mul(TABLE_ENTRY_LEN)
        .and_then(|n| n.checked_add(4))
        .ok_or(FrameError::TooLarge(world_size as u64))?;
    open(b, len, MAGIC_TABLE)?;
    b[4..]
        .chunks_exact(TABLE_ENTRY_LEN)
        .map(|e| {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&e[1..17]);
            let v6 = Ipv6Addr::from(octets);
            let ip = match (e[0], v6.to_ipv4_mapped()) {
                (4, Some(v4)) => IpAddr::V4(v4),
                (4, None) => return Err(FrameError::BadField("ipv4 entry not ipv4-mapped")),
                (6, _) => IpAddr::V6(v6),
                _ => return Err(FrameError::BadField("address tag")),
            };
            Ok(SocketAddr::new(ip, u16::from_le_bytes([e[17], e[18]])))
        })
        .collect()
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
    fn handshake_messages_round_trip_and_garbage() {
        let h = Hello {
            kind: HelloKind::Join,
            rank: 3,
            world_size: 8,
            port: 4242,
            nonce: [7; NONCE_LEN],
            job: [3; JOB_LEN],
        };
        let b = h.encode();
        assert_eq!(Hello::decode(&b), Ok(h));
        assert_eq!(Hello::decode(&b[..5]), Err(FrameError::Truncated));
        assert!(Hello::decode(&[&b[..], &[0]].concat()).is_err());
        let mut bad = b;
        bad[4] = 9;
        assert_eq!(Hello::decode(&bad), Err(FrameError::BadField("kind")));

        let c = Challenge {
            rank: 2,
            nonce: [1; NONCE_LEN],
        };
        assert_eq!(Challenge::decode(&c.encode()), Ok(c.clone()));
        assert_eq!(Challenge::decode(&b[..20]), Err(FrameError::Truncated));
        assert!(Challenge::decode(&b).is_err());
        let p = Proof { mac: [5; MAC_LEN] };
        assert_eq!(Proof::decode(&p.encode()), Ok(p.clone()));
        let k = Confirm { mac: [6; MAC_LEN] };
        assert_eq!(Confirm::decode(&k.encode()), Ok(k));
        // A proof is not a confirm, nor the other way round.
        assert_eq!(Confirm::decode(&p.encode()), Err(FrameError::BadMagic));
        assert_eq!(
            Proof::decode(&Confirm { mac: [0; MAC_LEN] }.encode()),
            Err(FrameError::BadMagic)
        );
        let m = encode_mesh(&[8; NONCE_LEN]);
        assert_eq!(decode_mesh(&m), Ok([8; NONCE_LEN]));
        assert_eq!(decode_mesh(&m[..19]), Err(FrameError::Truncated));
        assert_eq!(
            decode_mesh(&p.encode()[..MESH_LEN]),
            Err(FrameError::BadMagic)
        );
    }

    #[test]
    fn addr_table_round_trip_and_garbage() {
        let addrs: Vec<SocketAddr> = ["127.0.0.1:5", "[::1]:65535", "10.1.2.3:29500"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let t = encode_table(&addrs);
        assert_eq!(t.len(), table_len(3));
        assert_eq!(decode_table(&t, 3), Ok(addrs));
        assert_eq!(decode_table(&t, 4), Err(FrameError::Truncated));
        assert!(decode_table(&t, 2).is_err());
        let mut bad = t.clone();
        bad[4] = 5;
        assert_eq!(
            decode_table(&bad, 3),
            Err(FrameError::BadField("address tag"))
        );
        assert!(decode_table(&t, usize::MAX).is_err());
    }
}
