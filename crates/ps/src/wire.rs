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

use std::io::{self, Read, Write};

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

const OP_HELLO: u8 = 0x01;
const OP_HEARTBEAT: u8 = 0x02;
const OP_LEAVE: u8 = 0x03;
const OP_INIT: u8 = 0x04;
const OP_PUSH: u8 = 0x05;
const OP_PUSHPULL: u8 = 0x06;
const OP_PULL: u8 = 0x07;
const OP_CHECKPOINT: u8 = 0x08;
const OP_STATS: u8 = 0x09;
const OP_VECOP: u8 = 0x0A;
const OP_SETVEC: u8 = 0x0B;
const OP_OK: u8 = 0x81;
const OP_VALUES: u8 = 0x82;
const OP_STATSRESP: u8 = 0x83;
const OP_ERROR: u8 = 0x84;

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

/// Appends a frame header for `body_start..` (the body written after `out[start..]`).
fn begin(out: &mut Vec<u8>, opcode: u8, rid: u64) -> usize {
    out.clear();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(VERSION);
    out.push(opcode);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&[0; 8]); // len, crc: patched by `end`
    out.extend_from_slice(&rid.to_le_bytes());
    HEADER_LEN
}

fn end(out: &mut [u8]) {
    let body = &out[HEADER_LEN..];
    let len = body.len() as u32;
    let crc = crc32fast::hash(body);
    out[8..12].copy_from_slice(&len.to_le_bytes());
    out[12..16].copy_from_slice(&crc.to_le_bytes());
}

fn put_chunk(out: &mut Vec<u8>, c: ChunkId) {
    out.extend_from_slice(&c.key.0.to_le_bytes());
    out.extend_from_slice(&c.index.to_le_bytes());
}

fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    put_raw_f32s(out, v);
}

/// Appends `v` as little-endian f32.
pub(crate) fn put_raw_f32s(out: &mut Vec<u8>, v: &[f32]) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(bytemuck::cast_slice(v));
    } else {
        for x in v {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(MAX_STR)];
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_push(out: &mut Vec<u8>, p: &Push, payload: Payload<'_>) {
    out.extend_from_slice(&p.worker.0.to_le_bytes());
    out.extend_from_slice(&p.incarnation.to_le_bytes());
    out.extend_from_slice(&p.seq.to_le_bytes());
    put_chunk(out, p.chunk);
    out.extend_from_slice(&p.clock.to_le_bytes());
    out.push(p.mode as u8);
    out.push(p.encoding as u8);
    match payload {
        Payload::Bytes(b) => {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
        Payload::F32(v) => {
            out.extend_from_slice(&((4 * v.len()) as u32).to_le_bytes());
            put_raw_f32s(out, v);
        }
    }
}

/// A push's payload given separately from its other fields.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// Encoded bytes.
    Bytes(&'a [u8]),
    /// Dense values, written as little-endian f32 straight into the frame.
    F32(&'a [f32]),
}

/// Writes a Push (or, with `pull`, a PushPull) frame whose payload is `payload` (the
/// `payload` field of `p` is ignored), without copying the payload twice.
pub fn encode_push(p: &Push, payload: Payload<'_>, pull: bool, rid: u64, out: &mut Vec<u8>) {
    begin(out, if pull { OP_PUSHPULL } else { OP_PUSH }, rid);
    let n = match payload {
        Payload::Bytes(b) => b.len(),
        Payload::F32(v) => 4 * v.len(),
    };
    out.reserve(56 + n);
    put_push(out, p, payload);
    end(out);
}

/// Writes a Values response frame straight from `values`.
pub fn encode_values(round: u64, min_clock: u64, values: &[f32], rid: u64, out: &mut Vec<u8>) {
    begin(out, OP_VALUES, rid);
    out.reserve(20 + 4 * values.len());
    out.extend_from_slice(&round.to_le_bytes());
    out.extend_from_slice(&min_clock.to_le_bytes());
    put_f32s(out, values);
    end(out);
}

impl Request {
    /// Writes this request as one frame (header and body) into `out` (cleared first).
    pub fn encode(&self, rid: u64, out: &mut Vec<u8>) {
        let op = match self {
            Request::Hello { .. } => OP_HELLO,
            Request::Heartbeat { .. } => OP_HEARTBEAT,
            Request::Leave { .. } => OP_LEAVE,
            Request::Init { .. } => OP_INIT,
            Request::Push(_) => OP_PUSH,
            Request::PushPull(_) => OP_PUSHPULL,
            Request::Pull { .. } => OP_PULL,
            Request::Checkpoint => OP_CHECKPOINT,
            Request::Stats => OP_STATS,
            Request::VecOp(_) => OP_VECOP,
            Request::SetVec { .. } => OP_SETVEC,
        };
        begin(out, op, rid);
        match self {
            Request::Hello {
                worker,
                incarnation,
            }
            | Request::Heartbeat {
                worker,
                incarnation,
            }
            | Request::Leave {
                worker,
                incarnation,
            } => {
                out.extend_from_slice(&worker.0.to_le_bytes());
                out.extend_from_slice(&incarnation.to_le_bytes());
            }
            Request::Init {
                chunk,
                spec,
                values,
            } => {
                put_chunk(out, *chunk);
                out.extend_from_slice(&spec.row_len.to_le_bytes());
                let (c, s) = match spec.consistency {
                    Consistency::Sync => (0u8, 0u32),
                    Consistency::Async => (1, 0),
                    Consistency::Ssp { staleness } => (2, staleness),
                };
                out.push(c);
                out.extend_from_slice(&s.to_le_bytes());
                out.push(match spec.dead_policy {
                    DeadPolicy::Strict => 0,
                    DeadPolicy::Shrink => 1,
                });
                put_str(out, &spec.updater.to_string());
                put_str(out, &spec.codec.to_string());
                put_f32s(out, values);
            }
            Request::Push(p) | Request::PushPull(p) => put_push(out, p, Payload::Bytes(&p.payload)),
            Request::Pull {
                worker,
                chunk,
                clock,
                rows,
            } => {
                out.extend_from_slice(&worker.0.to_le_bytes());
                put_chunk(out, *chunk);
                out.extend_from_slice(&clock.to_le_bytes());
                match rows {
                    None => out.push(0),
                    Some(r) => {
                        out.push(1);
                        out.extend_from_slice(&(r.len() as u32).to_le_bytes());
                        for x in r {
                            out.extend_from_slice(&x.to_le_bytes());
                        }
                    }
                }
            }
            Request::Checkpoint | Request::Stats => {}
            Request::VecOp(op) => {
                let (tag, a, b, c, alpha) = match *op {
                    VecOp::Dot { a, b } => (0u8, a, b, 0, 0.0f32),
                    VecOp::Axpy { a, b, c, alpha } => (1, a, b, c, alpha),
                    VecOp::Scale { a, c, alpha } => (2, a, 0, c, alpha),
                };
                out.push(tag);
                out.extend_from_slice(&a.to_le_bytes());
                out.extend_from_slice(&b.to_le_bytes());
                out.extend_from_slice(&c.to_le_bytes());
                out.extend_from_slice(&alpha.to_le_bytes());
            }
            Request::SetVec {
                slot,
                chunk,
                values,
            } => {
                out.extend_from_slice(&slot.to_le_bytes());
                put_chunk(out, *chunk);
                put_f32s(out, values);
            }
        }
        end(out);
    }

    /// Decodes a request body for `header` (whose CRC is checked here).
    pub fn decode(header: &FrameHeader, body: &[u8]) -> Result<Self, WireError> {
        header.check_body(body)?;
        let mut c = Cursor::new(body);
        let req = match header.opcode {
            OP_HELLO | OP_HEARTBEAT | OP_LEAVE => {
                let worker = WorkerId(c.u32()?);
                let incarnation = c.u64()?;
                match header.opcode {
                    OP_HELLO => Request::Hello {
                        worker,
                        incarnation,
                    },
                    OP_HEARTBEAT => Request::Heartbeat {
                        worker,
                        incarnation,
                    },
                    _ => Request::Leave {
                        worker,
                        incarnation,
                    },
                }
            }
            OP_INIT => {
                let chunk = c.chunk()?;
                let row_len = c.u32()?;
                if row_len == 0 {
                    return Err(WireError::BadField { field: "row_len" });
                }
                let cons = c.u8()?;
                let staleness = c.u32()?;
                let consistency = match cons {
                    0 => Consistency::Sync,
                    1 => Consistency::Async,
                    2 => Consistency::Ssp { staleness },
                    _ => {
                        return Err(WireError::BadField {
                            field: "consistency",
                        })
                    }
                };
                let dead_policy = match c.u8()? {
                    0 => DeadPolicy::Strict,
                    1 => DeadPolicy::Shrink,
                    _ => {
                        return Err(WireError::BadField {
                            field: "dead_policy",
                        })
                    }
                };
                let updater: UpdaterSpec = c
                    .str("updater")?
                    .parse()
                    .map_err(|_| WireError::BadField { field: "updater" })?;
                let codec: PushCodec = c
                    .str("codec")?
                    .parse()
                    .map_err(|_| WireError::BadField { field: "codec" })?;
                let values = c.f32s("values")?;
                Request::Init {
                    chunk,
                    spec: TableSpec {
                        updater,
                        consistency,
                        dead_policy,
                        codec,
                        row_len,
                    },
                    values,
                }
            }
            OP_PUSH | OP_PUSHPULL => {
                let p = Push {
                    worker: WorkerId(c.u32()?),
                    incarnation: c.u64()?,
                    seq: c.u64()?,
                    chunk: c.chunk()?,
                    clock: c.u64()?,
                    mode: PushMode::from_u8(c.u8()?)
                        .ok_or(WireError::BadField { field: "mode" })?,
                    encoding: match c.u8()? {
                        0 => Encoding::Dense,
                        1 => Encoding::Codec,
                        2 => Encoding::TwoBit,
                        _ => return Err(WireError::BadField { field: "encoding" }),
                    },
                    payload: {
                        let n = c.u32()? as usize;
                        c.bytes(n, "payload")?.to_vec()
                    },
                };
                if p.encoding == Encoding::Dense && !p.payload.len().is_multiple_of(4) {
                    return Err(WireError::BadLength {
                        field: "dense payload",
                    });
                }
                if header.opcode == OP_PUSH {
                    Request::Push(p)
                } else {
                    Request::PushPull(p)
                }
            }
            OP_PULL => {
                let worker = WorkerId(c.u32()?);
                let chunk = c.chunk()?;
                let clock = c.u64()?;
                let rows = match c.u8()? {
                    0 => None,
                    1 => {
                        let n = c.u32()? as usize;
                        let raw = c.bytes(n.saturating_mul(4), "rows")?;
                        Some(
                            raw.chunks_exact(4)
                                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                                .collect(),
                        )
                    }
                    _ => return Err(WireError::BadField { field: "has_rows" }),
                };
                Request::Pull {
                    worker,
                    chunk,
                    clock,
                    rows,
                }
            }
            OP_CHECKPOINT => Request::Checkpoint,
            OP_STATS => Request::Stats,
            OP_VECOP => {
                let tag = c.u8()?;
                let (a, b, cc) = (c.u64()?, c.u64()?, c.u64()?);
                let alpha = c.f32()?;
                if !alpha.is_finite() {
                    return Err(WireError::BadField { field: "alpha" });
                }
                Request::VecOp(match tag {
                    0 => VecOp::Dot { a, b },
                    1 => VecOp::Axpy { a, b, c: cc, alpha },
                    2 => VecOp::Scale { a, c: cc, alpha },
                    _ => return Err(WireError::BadField { field: "vecop" }),
                })
            }
            OP_SETVEC => Request::SetVec {
                slot: c.u64()?,
                chunk: c.chunk()?,
                values: c.f32s("values")?,
            },
            other => return Err(WireError::UnknownOpcode { found: other }),
        };
        c.finish()?;
        Ok(req)
    }
}

impl Response {
    /// Writes this response as one frame into `out` (cleared first).
    pub fn encode(&self, rid: u64, out: &mut Vec<u8>) {
        match self {
            Response::Ok { value } => {
                begin(out, OP_OK, rid);
                out.extend_from_slice(&value.to_le_bytes());
            }
            Response::Values {
                round,
                min_clock,
                values,
            } => {
                encode_values(*round, *min_clock, values, rid, out);
                return;
            }
            Response::Stats(v) => {
                begin(out, OP_STATSRESP, rid);
                let v = &v[..v.len().min(MAX_STATS)];
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                for x in v {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
            Response::Error(e) => {
                begin(out, OP_ERROR, rid);
                out.extend_from_slice(&(e.code as u16).to_le_bytes());
                out.extend_from_slice(&e.worker.unwrap_or(u32::MAX).to_le_bytes());
                out.extend_from_slice(&e.value.to_le_bytes());
                let mut m = e.message.as_str();
                while m.len() > MAX_STR {
                    let mut cut = MAX_STR;
                    while !m.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    m = &m[..cut];
                }
                put_str(out, m);
            }
        }
        end(out);
    }

    /// Decodes a response body for `header` (whose CRC is checked here).
    pub fn decode(header: &FrameHeader, body: &[u8]) -> Result<Self, WireError> {
        header.check_body(body)?;
        let mut c = Cursor::new(body);
        let r = match header.opcode {
            OP_OK => Response::Ok { value: c.u64()? },
            OP_VALUES => Response::Values {
                round: c.u64()?,
                min_clock: c.u64()?,
                values: c.f32s("values")?,
            },
            OP_STATSRESP => {
                let n = c.u32()? as usize;
                if n > MAX_STATS {
                    return Err(WireError::BadLength { field: "stats" });
                }
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(c.u64()?);
                }
                Response::Stats(v)
            }
            OP_ERROR => {
                let code = ErrorCode::from_u16(c.u16()?).ok_or(WireError::BadField {
                    field: "error code",
                })?;
                let w = c.u32()?;
                let value = c.u64()?;
                let message = c.str("message")?.to_string();
                Response::Error(RemoteError {
                    code,
                    worker: (w != u32::MAX).then_some(w),
                    value,
                    message,
                })
            }
            other => return Err(WireError::UnknownOpcode { found: other }),
        };
        c.finish()?;
        Ok(r)
    }
}

/// A bounds-checked reader over a body.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }
    pub(crate) fn bytes(&mut self, n: usize, _field: &'static str) -> Result<&'a [u8], WireError> {
        let have = self.buf.len() - self.pos;
        if n > have {
            return Err(WireError::Truncated {
                need: self.pos.saturating_add(n),
                have: self.buf.len(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        Ok(self.bytes(N, "")?.try_into().expect("N bytes"))
    }
    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.arr::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    pub(crate) fn f32(&mut self) -> Result<f32, WireError> {
        Ok(f32::from_le_bytes(self.arr()?))
    }
    fn chunk(&mut self) -> Result<ChunkId, WireError> {
        Ok(ChunkId {
            key: Key(self.u64()?),
            index: self.u32()?,
        })
    }
    fn str(&mut self, field: &'static str) -> Result<&'a str, WireError> {
        let n = self.u16()? as usize;
        if n > MAX_STR {
            return Err(WireError::BadLength { field });
        }
        std::str::from_utf8(self.bytes(n, field)?).map_err(|_| WireError::BadField { field })
    }
    pub(crate) fn f32s(&mut self, field: &'static str) -> Result<Vec<f32>, WireError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(4) > self.buf.len() - self.pos {
            return Err(WireError::BadLength { field });
        }
        let raw = self.bytes(n * 4, field)?;
        Ok(read_f32s(raw))
    }
    pub(crate) fn finish(self) -> Result<(), WireError> {
        let extra = self.buf.len() - self.pos;
        if extra != 0 {
            return Err(WireError::Trailing { extra });
        }
        Ok(())
    }
}

/// Little-endian f32s from bytes (`raw.len()` a multiple of 4).
pub(crate) fn read_f32s(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> Vec<Request> {
        let push = Push {
            worker: WorkerId(3),
            incarnation: 7,
            seq: 9,
            chunk: ChunkId {
                key: Key(5),
                index: 1,
            },
            clock: 4,
            mode: PushMode::Add,
            encoding: Encoding::Dense,
            payload: vec![0, 0, 128, 63, 0, 0, 0, 64],
        };
        vec![
            Request::Hello {
                worker: WorkerId(1),
                incarnation: 2,
            },
            Request::Heartbeat {
                worker: WorkerId(1),
                incarnation: 2,
            },
            Request::Leave {
                worker: WorkerId(1),
                incarnation: 2,
            },
            Request::Init {
                chunk: push.chunk,
                spec: TableSpec::new(
                    Consistency::Ssp { staleness: 3 },
                    "adam:lr=0.01".parse().unwrap(),
                )
                .with_codec("topk:ratio=0.1".parse().unwrap())
                .with_dead_policy(DeadPolicy::Shrink)
                .with_row_len(4),
                values: vec![1.0, 2.0, 3.0, 4.0],
            },
            Request::Push(push.clone()),
            Request::PushPull(push),
            Request::Pull {
                worker: WorkerId(0),
                chunk: ChunkId {
                    key: Key(1),
                    index: 0,
                },
                clock: 3,
                rows: Some(vec![0, 5, 2]),
            },
            Request::Pull {
                worker: WorkerId(0),
                chunk: ChunkId {
                    key: Key(1),
                    index: 0,
                },
                clock: 0,
                rows: None,
            },
            Request::Checkpoint,
            Request::Stats,
            Request::VecOp(VecOp::Axpy {
                a: 1,
                b: 1 << 33,
                c: 1 << 34,
                alpha: -0.5,
            }),
            Request::SetVec {
                slot: 1 << 32,
                chunk: ChunkId {
                    key: Key(1),
                    index: 0,
                },
                values: vec![0.5],
            },
        ]
    }

    fn responses() -> Vec<Response> {
        vec![
            Response::Ok { value: 42 },
            Response::Values {
                round: 1,
                min_clock: 2,
                values: vec![1.5, -2.0],
            },
            Response::Stats(vec![1, 2, 3]),
            Response::Error(RemoteError {
                code: ErrorCode::WorkerLost,
                worker: Some(2),
                value: 5,
                message: "worker 2 died".into(),
            }),
        ]
    }

    fn split(frame: &[u8]) -> (FrameHeader, &[u8]) {
        let h = FrameHeader::decode(frame, DEFAULT_MAX_BODY).unwrap();
        (h, &frame[HEADER_LEN..])
    }

    #[test]
    fn every_message_round_trips() {
        let mut buf = Vec::new();
        for r in examples() {
            r.encode(77, &mut buf);
            let (h, body) = split(&buf);
            assert_eq!(h.rid, 77);
            assert_eq!(Request::decode(&h, body).unwrap(), r);
        }
        for r in responses() {
            r.encode(5, &mut buf);
            let (h, body) = split(&buf);
            assert_eq!(Response::decode(&h, body).unwrap(), r);
        }
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        let mut buf = Vec::new();
        for r in examples() {
            r.encode(1, &mut buf);
            for cut in 0..buf.len() {
                let res = read_frame(&mut &buf[..cut], DEFAULT_MAX_BODY, &mut Vec::new());
                match res {
                    Err(ReadError::Closed) => assert_eq!(cut, 0),
                    Err(ReadError::Wire(_)) => {}
                    other => panic!("{r:?} cut at {cut}: {other:?}"),
                }
                if cut >= HEADER_LEN {
                    let (h, _) = split(&buf);
                    assert!(Request::decode(&h, &buf[HEADER_LEN..cut]).is_err());
                }
            }
        }
    }

    #[test]
    fn header_refuses_bad_magic_version_opcode_flags_and_oversize() {
        let mut buf = Vec::new();
        Request::Stats.encode(1, &mut buf);
        let mut b = buf.clone();
        b[0] ^= 1;
        assert!(matches!(
            FrameHeader::decode(&b, 100),
            Err(WireError::BadMagic { .. })
        ));
        let mut b = buf.clone();
        b[4] = 2;
        assert_eq!(
            FrameHeader::decode(&b, 100),
            Err(WireError::UnknownVersion { found: 2 })
        );
        let mut b = buf.clone();
        b[5] = 0x40;
        assert_eq!(
            FrameHeader::decode(&b, 100),
            Err(WireError::UnknownOpcode { found: 0x40 })
        );
        let mut b = buf.clone();
        b[6] = 1;
        assert!(matches!(
            FrameHeader::decode(&b, 100),
            Err(WireError::BadField { .. })
        ));
        let mut b = buf.clone();
        b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            FrameHeader::decode(&b, 100),
            Err(WireError::Oversized {
                len: u32::MAX as u64,
                max: 100
            })
        );
        // An oversized frame is refused by read_frame before the body is allocated.
        let mut body = Vec::new();
        assert!(matches!(
            read_frame(&mut &b[..], 100, &mut body),
            Err(ReadError::Wire(WireError::Oversized { .. }))
        ));
        assert_eq!(body.capacity(), 0);
    }

    #[test]
    fn bit_flips_in_the_body_fail_the_checksum() {
        let mut buf = Vec::new();
        for r in examples() {
            r.encode(1, &mut buf);
            for i in HEADER_LEN..buf.len() {
                let mut b = buf.clone();
                b[i] ^= 0x10;
                assert!(matches!(
                    read_frame(&mut &b[..], DEFAULT_MAX_BODY, &mut Vec::new()),
                    Err(ReadError::Wire(WireError::BadChecksum { .. }))
                ));
            }
        }
    }

    #[test]
    fn lying_counts_are_refused_without_allocation() {
        // A body whose f32 count claims far more than is present (CRC made valid).
        let mut buf = Vec::new();
        Request::SetVec {
            slot: 1 << 32,
            chunk: ChunkId {
                key: Key(0),
                index: 0,
            },
            values: vec![1.0],
        }
        .encode(1, &mut buf);
        let at = HEADER_LEN + 8 + 12;
        buf[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        end(&mut buf);
        let (h, body) = split(&buf);
        assert_eq!(
            Request::decode(&h, body),
            Err(WireError::BadLength { field: "values" })
        );
    }

    proptest::proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200), op in 0u8..=0x90) {
            // Random bodies under a valid header for every opcode (CRC made valid).
            let mut frame = Vec::new();
            begin(&mut frame, 0, 0);
            frame[5] = op;
            frame.extend_from_slice(&bytes);
            end(&mut frame);
            if let Ok(h) = FrameHeader::decode(&frame, DEFAULT_MAX_BODY) {
                let _ = Request::decode(&h, &frame[HEADER_LEN..]);
                let _ = Response::decode(&h, &frame[HEADER_LEN..]);
            }
            let _ = read_frame(&mut &bytes[..], 1000, &mut Vec::new());
        }
    }
}
