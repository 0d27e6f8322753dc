//! The header at the start of every ring file, and its decoder.
//!
//! The file is shared with another process, so the header is untrusted input: [`decode`]
//! checks every field against the file it came from and answers a typed [`HeaderError`],
//! never a panic or an out-of-bounds read (it is fuzzed: `fuzz/fuzz_targets/shm_header.rs`).
//!
//! Layout (little-endian; offsets in bytes; each atomic on its own cache line):
//!
//! | offset | field | |
//! |---|---|---|
//! | 0 | magic `GWSHMRG1` | 8 bytes |
//! | 8 | version | u32 = [`VERSION`] |
//! | 12 | header length = offset of the data | u32 = [`HEADER_LEN`] |
//! | 16 | capacity of the data area | u64, a power of two in [`MIN_CAPACITY`]..=[`MAX_CAPACITY`] |
//! | 24 | source rank, destination rank, world size | 3 × u32 |
//! | 40 | job key (a key of the job's name, see `shm::config`) | u64 |
//! | 64 | producer pid, producer state, failed rank + 1 (0: none) | 3 × atomic u32 |
//! | 128 | consumer pid, consumer state | 2 × atomic u32 |
//! | 192 | head: bytes written so far | atomic u64 |
//! | 256 | tail: bytes read so far | atomic u64 |
//! | 320 | consumer asleep on `head` (futex), 0 or 1 | atomic u32 |
//! | 384 | producer asleep on `tail` (futex), 0 or 1 | atomic u32 |
//! | 4096 | data: `capacity` bytes, a byte stream of frames `len: u64` + payload | |

/// First bytes of every ring file.
pub const MAGIC: [u8; 8] = *b"GWSHMRG1";
/// Layout version (2: the sleeping flags at 320 and 384).
pub const VERSION: u32 = 2;
/// Bytes before the data area (one page).
pub const HEADER_LEN: usize = 4096;
/// Smallest data area.
pub const MIN_CAPACITY: u64 = 4096;
/// Largest data area.
pub const MAX_CAPACITY: u64 = 1 << 30;

pub(crate) const OFF_PRODUCER_PID: usize = 64;
pub(crate) const OFF_PRODUCER_STATE: usize = 68;
pub(crate) const OFF_PRODUCER_ABORT: usize = 72;
pub(crate) const OFF_CONSUMER_PID: usize = 128;
pub(crate) const OFF_CONSUMER_STATE: usize = 132;
pub(crate) const OFF_HEAD: usize = 192;
pub(crate) const OFF_TAIL: usize = 256;
pub(crate) const OFF_CONSUMER_ASLEEP: usize = 320;
pub(crate) const OFF_PRODUCER_ASLEEP: usize = 384;

/// The static fields of a ring header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingHeader {
    /// Bytes in the data area.
    pub capacity: u64,
    /// The rank that writes.
    pub src: u32,
    /// The rank that reads.
    pub dst: u32,
    /// Ranks in the job.
    pub world_size: u32,
    /// The key of the job's name (the same key names the ring files).
    pub job: u64,
}

/// Why a ring file or its header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer bytes than a header.
    #[error("ring file too short ({len} bytes)")]
    Truncated {
        /// Bytes available.
        len: u64,
    },
    /// Not a gradwire ring.
    #[error("bad magic (not a gradwire shared-memory ring)")]
    BadMagic,
    /// Written by another layout version.
    #[error("ring version {found}, this build speaks {VERSION}")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// A size field disagrees with the layout or with the file.
    #[error("bad ring size: {what}")]
    Size {
        /// Which size.
        what: &'static str,
    },
    /// The ring belongs to another job or pair of ranks.
    #[error("ring belongs to another {what}")]
    Mismatch {
        /// What differs (job, ranks, world size).
        what: &'static str,
    },
    /// Head and tail are further apart than the capacity (a corrupted or hostile peer).
    #[error("ring positions corrupt (head {head}, tail {tail}, capacity {capacity})")]
    Positions {
        /// Bytes written.
        head: u64,
        /// Bytes read.
        tail: u64,
        /// Capacity.
        capacity: u64,
    },
    /// The ring file is not this user's, or others may read or write it: only a regular
    /// file owned by this user with mode 0600 is opened.
    #[error("ring file not ours (owner uid {uid}, mode {mode:o}; want our uid and mode 600)")]
    NotOurs {
        /// Its owner.
        uid: u32,
        /// Its permission bits.
        mode: u32,
    },
    /// A symbolic link where the ring file should be (never followed).
    #[error("a symbolic link where the ring file should be")]
    Link,
    /// A frame announced more bytes than allowed.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge {
        /// Announced length.
        len: u64,
        /// The limit.
        max: u64,
    },
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// Decodes and checks the header at the start of `bytes`, a copy of the start of a ring
/// file of `file_len` bytes.
pub fn decode(bytes: &[u8], file_len: u64) -> Result<RingHeader, HeaderError> {
    if bytes.len() < 48 || file_len < HEADER_LEN as u64 {
        return Err(HeaderError::Truncated {
            len: (bytes.len() as u64).min(file_len),
        });
    }
    if bytes[..8] != MAGIC {
        return Err(HeaderError::BadMagic);
    }
    let version = u32_at(bytes, 8);
    if version != VERSION {
        return Err(HeaderError::Version { found: version });
    }
    if u32_at(bytes, 12) as usize != HEADER_LEN {
        return Err(HeaderError::Size {
            what: "header length",
        });
    }
    let capacity = u64_at(bytes, 16);
    if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
        return Err(HeaderError::Size { what: "capacity" });
    }
    if HEADER_LEN as u64 + capacity != file_len {
        return Err(HeaderError::Size {
            what: "file length",
        });
    }
    let h = RingHeader {
        capacity,
        src: u32_at(bytes, 24),
        dst: u32_at(bytes, 28),
        world_size: u32_at(bytes, 32),
        job: u64_at(bytes, 40),
    };
    if h.src >= h.world_size || h.dst >= h.world_size || h.src == h.dst {
        return Err(HeaderError::Size { what: "ranks" });
    }
    Ok(h)
}

/// Writes the static fields of `h` into `out` (at least 48 bytes; the rest is left as is).
pub fn encode(h: &RingHeader, out: &mut [u8]) {
    out[..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    out[16..24].copy_from_slice(&h.capacity.to_le_bytes());
    out[24..28].copy_from_slice(&h.src.to_le_bytes());
    out[28..32].copy_from_slice(&h.dst.to_le_bytes());
    out[32..36].copy_from_slice(&h.world_size.to_le_bytes());
    out[40..48].copy_from_slice(&h.job.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> (Vec<u8>, u64) {
        let h = RingHeader {
            capacity: 1 << 16,
            src: 1,
            dst: 2,
            world_size: 3,
            job: 42,
        };
        let mut b = vec![0; HEADER_LEN];
        encode(&h, &mut b);
        (b, HEADER_LEN as u64 + (1 << 16))
    }

    #[test]
    fn round_trips() {
        let (b, len) = good();
        let h = decode(&b, len).unwrap();
        assert_eq!(
            (h.capacity, h.src, h.dst, h.world_size, h.job),
            (1 << 16, 1, 2, 3, 42)
        );
    }

    #[test]
    fn refuses_each_bad_field() {
        let (b, len) = good();
        let bad = |f: &dyn Fn(&mut Vec<u8>), len: u64| {
            let mut c = b.clone();
            f(&mut c);
            decode(&c, len).unwrap_err()
        };
        assert!(matches!(
            bad(&|c| c.truncate(20), len),
            HeaderError::Truncated { .. }
        ));
        assert!(matches!(bad(&|_| {}, 100), HeaderError::Truncated { .. }));
        assert_eq!(bad(&|c| c[0] = b'X', len), HeaderError::BadMagic);
        assert_eq!(bad(&|c| c[8] = 9, len), HeaderError::Version { found: 9 });
        assert!(matches!(bad(&|c| c[12] = 1, len), HeaderError::Size { .. }));
        assert!(matches!(bad(&|c| c[16] = 3, len), HeaderError::Size { .. }));
        assert!(matches!(
            bad(&|c| c[23] = 0x80, len),
            HeaderError::Size { .. }
        ));
        assert!(matches!(bad(&|_| {}, len + 1), HeaderError::Size { .. }));
        assert!(matches!(bad(&|c| c[24] = 7, len), HeaderError::Size { .. }));
        assert!(matches!(bad(&|c| c[28] = 1, len), HeaderError::Size { .. }));
        // Any short or random input is an error, never a panic.
        for n in 0..64 {
            let _ = decode(&b[..n], n as u64);
            let _ = decode(&vec![0xFF; n], u64::MAX);
        }
    }

    /// A cheap stand-in for the fuzz target: every single-byte mutation of a valid header,
    /// and random headers, decode to Ok or an error; what is accepted is consistent.
    #[test]
    fn mutations_never_panic() {
        use rand::{Rng, SeedableRng};
        let (b, len) = good();
        let check = |bytes: &[u8], len: u64| {
            if let Ok(h) = decode(bytes, len) {
                assert!(h.capacity.is_power_of_two());
                assert_eq!(HEADER_LEN as u64 + h.capacity, len);
                assert!(h.src < h.world_size && h.dst < h.world_size && h.src != h.dst);
            }
        };
        for i in 0..64 {
            for v in [0u8, 1, 0x7F, 0x80, 0xFF] {
                let mut c = b.clone();
                c[i] = v;
                check(&c, len);
            }
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..10_000 {
            let n = rng.gen_range(0..96);
            let mut c: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            if n >= 8 && rng.gen_bool(0.5) {
                c[..8].copy_from_slice(&MAGIC);
            }
            check(&c, rng.gen_range(0..1 << 20) | rng.gen::<u64>() & 0x1000);
        }
    }
}
