//! Reading PS frame bodies: the total decoders of every message and the bounds-checked
//! cursor they read with.

use super::*;

impl Request {
    /// Decodes a request body for `header` (whose CRC is checked here).
    ///
    /// Longer than 120 lines on purpose: one match arm per opcode, each a few reads, so every
    /// request's layout is read in one place, in the order [`Request::encode`] writes it.
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
    /// Decodes a response body for `header` (whose CRC is checked here).
    ///
    /// One match arm per response kind, like [`Request::decode`].
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
