//! Writing PS frames: the header and checksum around a body, and every message's body.

use super::*;

/// Appends a frame header for `body_start..` (the body written after `out[start..]`).
pub(super) fn begin(out: &mut Vec<u8>, opcode: u8, rid: u64) -> usize {
    out.clear();
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.push(VERSION);
    out.push(opcode);
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&[0; 8]); // len, crc: patched by `end`
    out.extend_from_slice(&rid.to_le_bytes());
    HEADER_LEN
}

pub(super) fn end(out: &mut [u8]) {
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
}
