//! The PS protocol: versioned, length-limited, checksummed frames (little-endian).
//!
//! Every message is one frame, a 24-byte header then `len` body bytes:
//! ```text
//! 0..4    magic    u32 = 0x3150_5747 ("GWP1")
//! 4       version  u8  = 1
//! 5       opcode   u8  (requests 0x01..=0x0B, responses 0x81..=0x84; table below)
//! 6..8    flags    u16 = 0 (reserved; anything else is refused)
//! 8..12   len      u32 body bytes (<= the receiver's limit, checked before allocating)
//! 12..16  crc      u32 CRC-32 (IEEE) of the body
//! 16..24  rid      u64 request id, echoed by the response (the client drops stale replies)
//! ```
//! Common fields: `worker` u32, `inc` (incarnation) u64, `chunk` = key u64 then index u32
//! (12 bytes), `f32s(n)` = `n` u32 then `n` f32 (exactly `4n` bytes), `str` = u16 length
//! then that many UTF-8 bytes (at most [`MAX_STR`]).
//!
//! | opcode | request | body |
//! |---|---|---|
//! | 0x01 | Hello | worker, inc |
//! | 0x02 | Heartbeat | worker, inc |
//! | 0x03 | Leave | worker, inc |
//! | 0x04 | Init | chunk, row_len u32, consistency u8 (0 sync, 1 async, 2 ssp), staleness u32, dead_policy u8 (0 strict, 1 shrink), updater str, codec str, f32s |
//! | 0x05 | Push | worker, inc, seq u64, chunk, clock u64, mode u8 (0 grad, 1 add, 2 assign), encoding u8 (0 dense f32, 1 gradwire codec payload, 2 MXNet 2-bit), payload_len u32, payload |
//! | 0x06 | PushPull | as Push |
//! | 0x07 | Pull | worker, chunk, clock u64, has_rows u8 (0/1), [n u32, n row ids u32] |
//! | 0x08 | Checkpoint | (empty) |
//! | 0x09 | Stats | (empty) |
//! | 0x0A | VecOp | op u8, a u64, b u64, c u64, alpha f32 (Sandblaster vector ops; see [`VecOp`]) |
//! | 0x0B | SetVec | slot u64, chunk, f32s (store a vector slice for Sandblaster) |
//!
//! | opcode | response | body |
//! |---|---|---|
//! | 0x81 | Ok | value u64 |
//! | 0x82 | Values | round u64, min_clock u64, f32s |
//! | 0x83 | Stats | n u32 (<= 64), n u64 counters |
//! | 0x84 | Error | code u16, worker u32 (u32::MAX: none), value u64, message str |
//!
//! The decoder is total: truncated, oversized, unknown version or opcode, bad lengths,
//! bad checksums and trailing bytes are typed [`WireError`]s, never panics, and nothing is
//! allocated beyond the body (itself bounded by the limit). A server answers a malformed
//! frame with an Error response, drops that connection, and keeps serving the others.

use crate::spec::{
    ChunkId, Consistency, DeadPolicy, Key, PushCodec, PushMode, TableSpec, WorkerId,
};
use crate::updater::UpdaterSpec;

/// Magic of every frame ("GWP1").
pub const MAGIC: u32 = 0x3150_5747;
/// Protocol version written and read by this build.
pub const VERSION: u8 = 1;
/// Frame header length.
pub const HEADER_LEN: usize = 24;
/// Default limit on a frame body (a 16 Mi-element chunk plus headroom).
pub const DEFAULT_MAX_BODY: usize = (64 << 20) + 4096;
/// Longest string field.
pub const MAX_STR: usize = 1024;
/// Most counters in a Stats response.
pub const MAX_STATS: usize = 64;

/// Why bytes could not be decoded as a PS message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than a field needs.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A declared length above the receiver's limit.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    Oversized {
        /// The declared length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// Not a PS frame.
    #[error("bad magic {found:#010x}")]
    BadMagic {
        /// What was found.
        found: u32,
    },
    /// A protocol version this build does not speak.
    #[error("unsupported protocol version {found}")]
    UnknownVersion {
        /// What was found.
        found: u8,
    },
    /// An opcode this build does not know (or a response where a request belongs).
    #[error("unknown opcode {found:#04x}")]
    UnknownOpcode {
        /// What was found.
        found: u8,
    },
    /// A count that disagrees with the bytes present.
    #[error("bad length in field {field}")]
    BadLength {
        /// The field.
        field: &'static str,
    },
    /// The body's CRC does not match the header's.
    #[error("checksum mismatch: header {expected:#010x}, body {found:#010x}")]
    BadChecksum {
        /// From the header.
        expected: u32,
        /// Computed over the body.
        found: u32,
    },
    /// A field with an impossible value.
    #[error("invalid field {field}")]
    BadField {
        /// The field.
        field: &'static str,
    },
    /// Bytes after the last field.
    #[error("{extra} trailing bytes")]
    Trailing {
        /// How many.
        extra: usize,
    },
}

impl WireError {
    /// The error code sent back for this decode failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::Truncated { .. } => ErrorCode::Truncated,
            WireError::Oversized { .. } => ErrorCode::Oversized,
            WireError::BadMagic { .. } => ErrorCode::BadMagic,
            WireError::UnknownVersion { .. } => ErrorCode::UnknownVersion,
            WireError::UnknownOpcode { .. } => ErrorCode::UnknownOpcode,
            WireError::BadLength { .. } => ErrorCode::BadLength,
            WireError::BadChecksum { .. } => ErrorCode::BadChecksum,
            WireError::BadField { .. } => ErrorCode::BadField,
            WireError::Trailing { .. } => ErrorCode::Trailing,
        }
    }
}

/// The code of an Error response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// Frame or field truncated.
    Truncated = 1,
    /// Frame above the limit.
    Oversized = 2,
    /// Not a PS frame.
    BadMagic = 3,
    /// Unknown protocol version.
    UnknownVersion = 4,
    /// Unknown opcode.
    UnknownOpcode = 5,
    /// Inconsistent length field.
    BadLength = 6,
    /// CRC mismatch.
    BadChecksum = 7,
    /// Impossible field value.
    BadField = 8,
    /// Trailing bytes.
    Trailing = 9,
    /// The chunk was never initialized on this shard.
    NotInitialized = 20,
    /// Length or spec differs from the initialized chunk.
    ShapeMismatch = 21,
    /// A well-formed request the server cannot honour (bad row id, wrong codec, ...).
    InvalidArgument = 22,
    /// The push's incarnation is older than the worker's current one.
    Fenced = 23,
    /// The sequence number is beyond the dedup window.
    WindowExceeded = 24,
    /// A worker the request waits for is dead (`worker` names it).
    WorkerLost = 25,
    /// The request's wait passed the server's deadline.
    Timeout = 26,
    /// A sync push for a round that already closed (`value` = the current round).
    StaleRound = 27,
    /// The write-ahead log or checkpoint could not be written.
    Durability = 28,
    /// The worker id is not below the server's worker count.
    UnknownWorker = 29,
    /// The connection may not make this request (another worker's id, or a coordinator's
    /// operation from a worker).
    PermissionDenied = 30,
    /// The request is above one of the shard's limits (reply size, tables, elements,
    /// scratch vectors); `value` is the limit.
    LimitExceeded = 31,
    /// The shard is at its connection or memory limit right now; try again later.
    Busy = 32,
}

impl ErrorCode {
    /// Parses a code; `None` when unknown.
    pub fn from_u16(v: u16) -> Option<Self> {
        use ErrorCode::*;
        Some(match v {
            1 => Truncated,
            2 => Oversized,
            3 => BadMagic,
            4 => UnknownVersion,
            5 => UnknownOpcode,
            6 => BadLength,
            7 => BadChecksum,
            8 => BadField,
            9 => Trailing,
            20 => NotInitialized,
            21 => ShapeMismatch,
            22 => InvalidArgument,
            23 => Fenced,
            24 => WindowExceeded,
            25 => WorkerLost,
            26 => Timeout,
            27 => StaleRound,
            28 => Durability,
            29 => UnknownWorker,
            30 => PermissionDenied,
            31 => LimitExceeded,
            32 => Busy,
            _ => return None,
        })
    }

    /// Whether the code reports a malformed frame (after which the server drops the
    /// connection).
    pub fn is_protocol(self) -> bool {
        (self as u16) < 20
    }
}

/// How a push's payload is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Encoding {
    /// Little-endian f32, exactly the chunk's length.
    Dense = 0,
    /// A gradwire codec payload (self-describing header), decoded by the table's codec.
    Codec = 1,
    /// An MXNet 2-bit payload ([`crate::TwoBit`]).
    TwoBit = 2,
}

/// A push (or the push half of a push-pull).
#[derive(Debug, Clone, PartialEq)]
pub struct Push {
    /// The pushing worker.
    pub worker: WorkerId,
    /// Its incarnation (fences off older processes of the same worker).
    pub incarnation: u64,
    /// Per (worker, shard) sequence number: a repeat is acknowledged but not applied.
    pub seq: u64,
    /// The target chunk.
    pub chunk: ChunkId,
    /// The worker's count of earlier pushes to this table. Informational (logs, tools):
    /// the shard keeps the authoritative sync rounds and SSP clocks itself.
    pub clock: u64,
    /// Gradient, additive update or assignment.
    pub mode: PushMode,
    /// How `payload` is encoded.
    pub encoding: Encoding,
    /// The encoded values.
    pub payload: Vec<u8>,
}

/// Sandblaster vector operations, executed by a shard on the slices it holds. Operands are
/// vector slots (`u64`); slot 0..2^32 are the parameter chunks of table key `slot` (all of
/// its chunks on the shard), higher slots are scratch vectors set with `SetVec`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VecOp {
    /// Returns the partial dot product of slots `a` and `b` (as f64 bits in Ok's value).
    Dot {
        /// First operand.
        a: u64,
        /// Second operand.
        b: u64,
    },
    /// `slot[c] = slot[a] + alpha · slot[b]` (c may equal a or b; created if absent).
    Axpy {
        /// Base vector.
        a: u64,
        /// Scaled vector.
        b: u64,
        /// Destination.
        c: u64,
        /// Scale of `b`.
        alpha: f32,
    },
    /// `slot[c] = alpha · slot[a]`.
    Scale {
        /// Source.
        a: u64,
        /// Destination.
        c: u64,
        /// Scale.
        alpha: f32,
    },
}

/// A client request.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Registers (or re-registers with a newer incarnation) a worker.
    Hello {
        /// The worker.
        worker: WorkerId,
        /// Its incarnation.
        incarnation: u64,
    },
    /// Liveness.
    Heartbeat {
        /// The worker.
        worker: WorkerId,
        /// Its incarnation.
        incarnation: u64,
    },
    /// A worker leaves for good (sync rounds and SSP reads stop waiting for it).
    Leave {
        /// The worker.
        worker: WorkerId,
        /// Its incarnation.
        incarnation: u64,
    },
    /// Creates a chunk (the first init wins; a later identical one is acknowledged).
    Init {
        /// The chunk.
        chunk: ChunkId,
        /// Its table's spec.
        spec: TableSpec,
        /// Initial values.
        values: Vec<f32>,
    },
    /// A push.
    Push(Push),
    /// A push, then a pull of the same chunk once the push's round (sync) or clock (SSP)
    /// allows.
    PushPull(Push),
    /// Reads a chunk (or some of its rows).
    Pull {
        /// The reader.
        worker: WorkerId,
        /// The chunk.
        chunk: ChunkId,
        /// Sync: wait until this many rounds have closed. Async and SSP: ignored (an SSP
        /// read waits on the reader's own push count, kept by the shard).
        clock: u64,
        /// Row ids (row-sparse pull), or `None` for the whole chunk.
        rows: Option<Vec<u32>>,
    },
    /// Writes a checkpoint now.
    Checkpoint,
    /// Reads the shard's counters.
    Stats,
    /// A Sandblaster vector op.
    VecOp(VecOp),
    /// Stores a scratch vector slice for Sandblaster.
    SetVec {
        /// Slot (>= 2^32).
        slot: u64,
        /// The chunk whose layout the slice follows.
        chunk: ChunkId,
        /// Values.
        values: Vec<f32>,
    },
}

/// A server response.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// Success with one number (a shard id, an LSN, a dot product's f64 bits, ...).
    Ok {
        /// The number.
        value: u64,
    },
    /// Values of a chunk (or of the requested rows, in request order).
    Values {
        /// Rounds closed on the chunk (sync) or updates applied (async, SSP).
        round: u64,
        /// SSP: the slowest worker's clock when the read was served.
        min_clock: u64,
        /// The values.
        values: Vec<f32>,
    },
    /// Counters, in [`crate::ShardStats`] order.
    Stats(Vec<u64>),
    /// A typed failure.
    Error(RemoteError),
}

/// An error reported by a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteError {
    /// What went wrong.
    pub code: ErrorCode,
    /// The worker it concerns (`WorkerLost`, `Fenced`), if any.
    pub worker: Option<u32>,
    /// A number the code explains (current round, current incarnation, ...).
    pub value: u64,
    /// Human-readable detail.
    pub message: String,
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The opcode.
    pub opcode: u8,
    /// Body length.
    pub len: u32,
    /// CRC-32 of the body.
    pub crc: u32,
    /// Request id.
    pub rid: u64,
}

pub(super) const OP_HELLO: u8 = 0x01;
pub(super) const OP_HEARTBEAT: u8 = 0x02;
pub(super) const OP_LEAVE: u8 = 0x03;
pub(super) const OP_INIT: u8 = 0x04;
pub(super) const OP_PUSH: u8 = 0x05;
pub(super) const OP_PUSHPULL: u8 = 0x06;
pub(super) const OP_PULL: u8 = 0x07;
pub(super) const OP_CHECKPOINT: u8 = 0x08;
pub(super) const OP_STATS: u8 = 0x09;
pub(super) const OP_VECOP: u8 = 0x0A;
pub(super) const OP_SETVEC: u8 = 0x0B;
pub(super) const OP_OK: u8 = 0x81;
pub(super) const OP_VALUES: u8 = 0x82;
pub(super) const OP_STATSRESP: u8 = 0x83;
pub(super) const OP_ERROR: u8 = 0x84;

impl FrameHeader {
    /// Parses a header, refusing bad magic, version, flags, unknown opcodes and bodies
    /// above `max_body` (before anything is allocated).
    pub fn decode(buf: &[u8], max_body: usize) -> Result<Self, WireError> {
        if buf.len() < HEADER_LEN {
            return Err(WireError::Truncated {
                need: HEADER_LEN,
                have: buf.len(),
            });
        }
        let magic = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes"));
        if magic != MAGIC {
            return Err(WireError::BadMagic { found: magic });
        }
        if buf[4] != VERSION {
            return Err(WireError::UnknownVersion { found: buf[4] });
        }
        let opcode = buf[5];
        if !matches!(opcode, OP_HELLO..=OP_SETVEC | OP_OK..=OP_ERROR) {
            return Err(WireError::UnknownOpcode { found: opcode });
        }
        if buf[6] != 0 || buf[7] != 0 {
            return Err(WireError::BadField { field: "flags" });
        }
        let len = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
        if len as u64 > max_body as u64 {
            return Err(WireError::Oversized {
                len: len as u64,
                max: max_body as u64,
            });
        }
        Ok(FrameHeader {
            opcode,
            len,
            crc: u32::from_le_bytes(buf[12..16].try_into().expect("4 bytes")),
            rid: u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes")),
        })
    }

    /// Checks the body's length and CRC against this header.
    pub fn check_body(&self, body: &[u8]) -> Result<(), WireError> {
        if body.len() != self.len as usize {
            return Err(WireError::Truncated {
                need: self.len as usize,
                have: body.len(),
            });
        }
        let found = crc32fast::hash(body);
        if found != self.crc {
            return Err(WireError::BadChecksum {
                expected: self.crc,
                found,
            });
        }
        Ok(())
    }
}

mod decode;
mod encode;
mod io;

pub(crate) use decode::{read_f32s, Cursor};
pub(crate) use encode::put_raw_f32s;
pub use encode::{encode_push, encode_values, Payload};
pub use io::{read_frame, write_frame, ReadError};

#[cfg(test)]
mod tests;
