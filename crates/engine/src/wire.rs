//! The negotiation message each rank contributes to a cycle's all-gather, and the tensor
//! descriptors compared the first time a tensor is seen. Little-endian:
//!
//! ```text
//! message:    u8 flags (bit 0: shutdown requested) | u64 now_us
//!             | u32 nbits | ceil(nbits/8) bytes: bit i = cached tensor i pending here
//!             | u32 n | n x (u32 cache id, u64 ready_us): bits newly set this cycle
//!             | u32 m | m x (u64 ready_us, descriptor): tensors not cached yet
//! descriptor: u16 len, name | u8 op (0 all_reduce, 1 all_gather, 2 broadcast, 3 barrier)
//!             | u8 dtype
//!             (0 = f32) | u32 root | u32 ndims, ndims x u64 | u16 len, policy (codec@strategy)
//! ```
//!
//! The speculative round's exchange (one per step of that round, see `worker.rs`) wraps a
//! message and, when the sender has the whole speculative batch pending, its part of the
//! receiver's chunk:
//!
//! ```text
//! exchange:   u32 len | len bytes: message | u8 attached (0 or 1)
//!             | zero bytes up to a multiple of 4 from the exchange's start (0..=3)
//!             | attached = 1: part_len x f32 (the sender's floats, as in memory)
//! ```
//! On power-of-two worlds the round follows recursive halving instead, and each step's
//! exchange carries every message its sender knows so far (its own, then those it received
//! in earlier steps: `P / 2m` of them at the step with partner distance `m`):
//!
//! ```text
//! tree step:  u32 count | count x (u32 rank | u32 len | len bytes: that rank's message),
//!             ranks strictly ascending
//!             | u8 attached (0 or 1: the sender and every rank it carries attached)
//!             | zero bytes up to a multiple of 4 from the exchange's start (0..=3)
//!             | attached = 1: the sender's partial sums of the receiver's half, as f32
//! ```
//!
//! The padding puts the floats on a 4-byte boundary of the receive buffer, so the receiver
//! sums them where they arrived ([`decode_exchange`] hands them out as bytes; the caller
//! reinterprets them in place when the buffer is aligned, and copies otherwise).
//!
//! Decoding is total: a short or malformed message is an [`Error::Protocol`] naming the rank.

use crate::error::{Error, Result};

/// What operation a tensor takes part in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Mean over ranks.
    AllReduce,
    /// Concatenation in rank order (lengths may differ per rank).
    AllGather,
    /// The root's buffer to everyone.
    Broadcast,
    /// No data: completes once every rank has submitted it (a barrier).
    Barrier,
}

impl OpKind {
    fn code(self) -> u8 {
        match self {
            OpKind::AllReduce => 0,
            OpKind::AllGather => 1,
            OpKind::Broadcast => 2,
            OpKind::Barrier => 3,
        }
    }
    fn from_code(c: u8) -> Option<OpKind> {
        Some(match c {
            0 => OpKind::AllReduce,
            1 => OpKind::AllGather,
            2 => OpKind::Broadcast,
            3 => OpKind::Barrier,
            _ => return None,
        })
    }
}

/// What every rank must agree on about a named tensor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Descriptor {
    /// The tensor's name.
    pub name: String,
    /// The operation.
    pub op: OpKind,
    /// Element type (0 = f32, the only one today).
    pub dtype: u8,
    /// Broadcast root (0 otherwise).
    pub root: u32,
    /// Shape (for all-gather: this rank's contribution).
    pub shape: Vec<u64>,
    /// Canonical `codec@strategy` (empty for all-gather and broadcast).
    pub policy: String,
}

impl Descriptor {
    /// The first field in which `other` differs, with both values, or `None`.
    pub fn diff(&self, other: &Descriptor) -> Option<(&'static str, String, String)> {
        if self.name != other.name {
            return Some(("name", self.name.clone(), other.name.clone()));
        }
        if self.dtype != other.dtype {
            return Some(("dtype", self.dtype.to_string(), other.dtype.to_string()));
        }
        if self.op != other.op || self.root != other.root {
            return Some((
                "op",
                format!("{:?}(root {})", self.op, self.root),
                format!("{:?}(root {})", other.op, other.root),
            ));
        }
        if self.op != OpKind::AllGather && self.shape != other.shape {
            return Some((
                "shape",
                format!("{:?}", self.shape),
                format!("{:?}", other.shape),
            ));
        }
        if self.policy != other.policy {
            let role = |p: &str| {
                p.split(" role=")
                    .nth(1)
                    .map(|r| r.split('+').next().map(str::to_string))
            };
            let field = if role(&self.policy) != role(&other.policy) {
                "role"
            } else {
                "codec"
            };
            return Some((field, self.policy.clone(), other.policy.clone()));
        }
        None
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        put_str(out, &self.name);
        out.push(self.op.code());
        out.push(self.dtype);
        out.extend_from_slice(&self.root.to_le_bytes());
        out.extend_from_slice(&(self.shape.len() as u32).to_le_bytes());
        for d in &self.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        put_str(out, &self.policy);
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Descriptor> {
        let name = r.string()?;
        let op = OpKind::from_code(r.u8()?).ok_or(r.err("unknown op code"))?;
        let dtype = r.u8()?;
        let root = r.u32()?;
        let nd = r.u32()? as usize;
        if nd > r.remaining() / 8 {
            return Err(r.err("shape longer than the message"));
        }
        let shape = (0..nd).map(|_| r.u64()).collect::<Result<_>>()?;
        let policy = r.string()?;
        Ok(Descriptor {
            name,
            op,
            dtype,
            root,
            shape,
            policy,
        })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

/// One rank's contribution to a negotiation round.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Message {
    pub shutdown: bool,
    pub now_us: u64,
    /// Cached ids pending on this rank (as a bit-vector of `nbits` bits).
    pub nbits: usize,
    pub bits: Vec<u8>,
    /// `(cache id, ready_us)` for bits newly set this cycle.
    pub new_ready: Vec<(u32, u64)>,
    /// `(ready_us, descriptor)` for tensors not in the cache yet.
    pub requests: Vec<(u64, Descriptor)>,
}

impl Message {
    pub(crate) fn bit(&self, id: usize) -> bool {
        id < self.nbits && self.bits[id / 8] & (1 << (id % 8)) != 0
    }

    pub(crate) fn set_bits(&mut self, nbits: usize, ids: impl Iterator<Item = usize>) {
        self.nbits = nbits;
        self.bits.clear();
        self.bits.resize(nbits.div_ceil(8), 0);
        for id in ids {
            self.bits[id / 8] |= 1 << (id % 8);
        }
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        out.push(self.shutdown as u8);
        out.extend_from_slice(&self.now_us.to_le_bytes());
        out.extend_from_slice(&(self.nbits as u32).to_le_bytes());
        out.extend_from_slice(&self.bits);
        out.extend_from_slice(&(self.new_ready.len() as u32).to_le_bytes());
        for (id, t) in &self.new_ready {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&(self.requests.len() as u32).to_le_bytes());
        for (t, d) in &self.requests {
            out.extend_from_slice(&t.to_le_bytes());
            d.write(out);
        }
    }

    #[cfg(any(test, fuzzing))]
    pub(crate) fn decode(peer: usize, buf: &[u8]) -> Result<Message> {
        let mut m = Message::default();
        m.decode_into(peer, buf)?;
        Ok(m)
    }

    /// [`Message::decode`] into `self`, reusing its buffers (every field is overwritten;
    /// after an error `self` holds a partial message and must not be used).
    pub(crate) fn decode_into(&mut self, peer: usize, buf: &[u8]) -> Result<()> {
        let mut r = Reader { buf, pos: 0, peer };
        let flags = r.u8()?;
        self.shutdown = flags & 1 != 0;
        self.now_us = r.u64()?;
        self.nbits = r.u32()? as usize;
        self.bits.clear();
        self.bits
            .extend_from_slice(r.bytes(self.nbits.div_ceil(8))?);
        let n = r.u32()? as usize;
        if n > r.remaining() / 12 {
            return Err(r.err("ready list longer than the message"));
        }
        self.new_ready.clear();
        for _ in 0..n {
            self.new_ready.push((r.u32()?, r.u64()?));
        }
        let m = r.u32()? as usize;
        if m > r.remaining() / 8 {
            return Err(r.err("request list longer than the message"));
        }
        self.requests.clear();
        for _ in 0..m {
            self.requests.push((r.u64()?, Descriptor::read(&mut r)?));
        }
        if r.remaining() != 0 {
            return Err(r.err("trailing bytes"));
        }
        Ok(())
    }
}

/// A bounds-checked little-endian reader.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    peer: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(peer: usize, buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0, peer }
    }
    pub(crate) fn err(&self, what: &'static str) -> Error {
        Error::Protocol {
            peer: self.peer,
            what,
        }
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err("truncated"));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.bytes(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn string(&mut self) -> Result<String> {
        let n = u16::from_le_bytes(self.bytes(2)?.try_into().expect("2 bytes")) as usize;
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.err("name is not UTF-8"))
    }
}

/// Encodes a descriptor list (the registration check at start).
pub(crate) fn encode_list(list: &[Descriptor], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&(list.len() as u32).to_le_bytes());
    for d in list {
        d.write(out);
    }
}

/// Decodes [`encode_list`]'s output.
pub(crate) fn decode_list(peer: usize, buf: &[u8]) -> Result<Vec<Descriptor>> {
    let mut r = Reader::new(peer, buf);
    let n = r.u32()? as usize;
    if n > r.remaining() / 12 {
        return Err(r.err("descriptor list longer than the message"));
    }
    let list = (0..n)
        .map(|_| Descriptor::read(&mut r))
        .collect::<Result<_>>()?;
    if r.remaining() != 0 {
        return Err(r.err("trailing bytes"));
    }
    Ok(list)
}

/// Padding after an exchange header of `header` bytes (`4 + len + 1`), up to a multiple of 4.
fn exchange_pad(header: usize) -> usize {
    (4 - header % 4) % 4
}

/// Writes an exchange's header (length, message, flag, padding) into `out` (cleared first);
/// with `attached`, the sender then sends its part right after it (as a separate piece).
pub(crate) fn encode_exchange_header(msg: &[u8], attached: bool, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    out.extend_from_slice(msg);
    out.push(u8::from(attached));
    let pad = exchange_pad(out.len());
    out.resize(out.len() + pad, 0);
}

/// Decodes an exchange whose part, when attached, is `part_len` floats: the message, and the
/// part's bytes (`4 * part_len`, starting at a multiple of 4 from `buf`'s start) if attached.
pub(crate) fn decode_exchange(
    peer: usize,
    buf: &[u8],
    part_len: usize,
) -> Result<(&[u8], Option<&[u8]>)> {
    let mut r = Reader::new(peer, buf);
    let n = r.u32()? as usize;
    let msg = r.bytes(n)?;
    Ok((msg, read_part(&mut r, part_len)?))
}

/// The end of an exchange (either kind): the flag, the padding to a multiple of 4 from the
/// exchange's start, and when the flag is 1 exactly `part_len` floats; nothing after.
fn read_part<'a>(r: &mut Reader<'a>, part_len: usize) -> Result<Option<&'a [u8]>> {
    let attached = match r.u8()? {
        0 => false,
        1 => true,
        _ => return Err(r.err("bad speculation flag")),
    };
    if r.bytes(exchange_pad(r.pos))?.iter().any(|&b| b != 0) {
        return Err(r.err("non-zero padding in a negotiation exchange"));
    }
    let part = if attached {
        let bytes = part_len
            .checked_mul(4)
            .ok_or_else(|| r.err("part length overflows"))?;
        Some(r.bytes(bytes)?)
    } else {
        None
    };
    if r.remaining() != 0 {
        return Err(r.err("trailing bytes in a negotiation exchange"));
    }
    Ok(part)
}

/// Writes a tree step's header (messages with their ranks, flag, padding) into `out`
/// (cleared first); the sender's floats follow as a separate piece when `attached`.
pub(crate) fn encode_tree_header<'a>(
    msgs: impl Iterator<Item = (usize, &'a [u8])> + Clone,
    attached: bool,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.extend_from_slice(&(msgs.clone().count() as u32).to_le_bytes());
    for (rank, m) in msgs {
        out.extend_from_slice(&(rank as u32).to_le_bytes());
        out.extend_from_slice(&(m.len() as u32).to_le_bytes());
        out.extend_from_slice(m);
    }
    out.push(u8::from(attached));
    let pad = exchange_pad(out.len());
    out.resize(out.len() + pad, 0);
}

/// One tree step's exchange, decoded.
pub(crate) struct TreeStep<'a> {
    /// `(rank, message)` in the order sent.
    pub msgs: Vec<(usize, &'a [u8])>,
    /// The sender's partial sums (`4 * part_len` bytes on a 4-byte boundary), if attached.
    pub part: Option<&'a [u8]>,
}

/// Decodes a tree step that must carry exactly `count` messages, from ranks `r < world` with
/// `expected(r)` in strictly ascending order (so each at most once), and, if attached,
/// `part_len` floats.
pub(crate) fn decode_tree_exchange<'a>(
    peer: usize,
    buf: &'a [u8],
    world: usize,
    count: usize,
    expected: impl Fn(usize) -> bool,
    part_len: usize,
) -> Result<TreeStep<'a>> {
    let mut r = Reader::new(peer, buf);
    if r.u32()? as usize != count {
        return Err(r.err("wrong number of messages in a tree step"));
    }
    let mut msgs = Vec::with_capacity(count);
    for _ in 0..count {
        let rank = r.u32()? as usize;
        let after_last = msgs.last().is_none_or(|&(prev, _)| rank > prev);
        if rank >= world || !expected(rank) || !after_last {
            return Err(r.err("unexpected rank in a tree step"));
        }
        let n = r.u32()? as usize;
        msgs.push((rank, r.bytes(n)?));
    }
    let part = read_part(&mut r, part_len)?;
    Ok(TreeStep { msgs, part })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree step written out by hand: header round trip, alignment of the part, every
    /// truncation refused, and ranks that are unexpected, repeated, out of order or out of
    /// the world.
    #[test]
    fn tree_step_layout_by_hand() {
        let msgs: [(usize, &[u8]); 2] = [(2, b"abc"), (6, b"")];
        for attached in [false, true] {
            let mut want = 2u32.to_le_bytes().to_vec();
            for (r, m) in msgs {
                want.extend_from_slice(&(r as u32).to_le_bytes());
                want.extend_from_slice(&(m.len() as u32).to_le_bytes());
                want.extend_from_slice(m);
            }
            want.push(attached as u8);
            while !want.len().is_multiple_of(4) {
                want.push(0);
            }
            let mut header = Vec::new();
            encode_tree_header(msgs.iter().copied(), attached, &mut header);
            assert_eq!(header, want);
            if attached {
                want.extend_from_slice(&7.5f32.to_ne_bytes());
            }
            let even = |r: usize| r.is_multiple_of(2);
            let got = decode_tree_exchange(1, &want, 8, 2, even, 1).unwrap();
            assert_eq!(got.msgs, msgs.to_vec());
            assert_eq!(got.part.map(|p| p.len()), attached.then_some(4));
            if let Some(p) = got.part {
                assert_eq!((p.as_ptr() as usize - want.as_ptr() as usize) % 4, 0);
            }
            for cut in 0..want.len() {
                assert!(decode_tree_exchange(1, &want[..cut], 8, 2, even, 1).is_err());
            }
            // Wrong count, a rank outside the expected set, outside the world, repeated.
            assert!(decode_tree_exchange(1, &want, 8, 3, even, 1).is_err());
            assert!(decode_tree_exchange(1, &want, 8, 2, |r| r != 6, 1).is_err());
            assert!(decode_tree_exchange(1, &want, 4, 2, even, 1).is_err());
            let mut twice = Vec::new();
            encode_tree_header(
                [(2, &b"a"[..]), (2, &b"b"[..])].into_iter(),
                false,
                &mut twice,
            );
            assert!(decode_tree_exchange(1, &twice, 8, 2, even, 1).is_err());
            let mut descending = Vec::new();
            encode_tree_header(
                [(6, &b"a"[..]), (2, &b"b"[..])].into_iter(),
                false,
                &mut descending,
            );
            assert!(decode_tree_exchange(1, &descending, 8, 2, even, 1).is_err());
        }
    }

    /// The exchange layout written out by hand (not with the encoder), every message length
    /// mod 4, with and without a part; every truncation and a trailing byte are refused.
    #[test]
    fn exchange_layout_by_hand() {
        for n in 0..8usize {
            for attached in [false, true] {
                let msg: Vec<u8> = (0..n as u8).map(|b| b.wrapping_mul(37)).collect();
                let part = [1.5f32, -2.0, 3.25];
                let mut want = (n as u32).to_le_bytes().to_vec();
                want.extend_from_slice(&msg);
                want.push(attached as u8);
                while !want.len().is_multiple_of(4) {
                    want.push(0);
                }
                let mut header = Vec::new();
                encode_exchange_header(&msg, attached, &mut header);
                assert_eq!(header, want, "n {n} attached {attached}");
                if attached {
                    for x in part {
                        want.extend_from_slice(&x.to_ne_bytes());
                    }
                }
                let (m, p) = decode_exchange(3, &want, part.len()).unwrap();
                assert_eq!(m, &msg[..]);
                assert_eq!(p.map(|b| b.len()), attached.then_some(12));
                if let Some(b) = p {
                    let floats: Vec<f32> = b
                        .chunks_exact(4)
                        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                        .collect();
                    assert_eq!(floats, part);
                    assert_eq!((b.as_ptr() as usize - want.as_ptr() as usize) % 4, 0);
                }
                for cut in 0..want.len() {
                    assert!(
                        matches!(
                            decode_exchange(3, &want[..cut], part.len()),
                            Err(Error::Protocol { peer: 3, .. })
                        ),
                        "n {n} attached {attached} cut {cut}"
                    );
                }
                let mut long = want.clone();
                long.push(0);
                assert!(decode_exchange(3, &long, part.len()).is_err());
            }
        }
        // A flag other than 0 or 1, and non-zero padding.
        assert!(decode_exchange(0, &[0, 0, 0, 0, 2, 0, 0, 0], 0).is_err());
        assert!(decode_exchange(0, &[0, 0, 0, 0, 0, 0, 1, 0], 0).is_err());
        assert!(decode_exchange(0, &[0, 0, 0, 0, 0, 0, 0, 0], 0).is_ok());
        // A huge part length is refused, not allocated.
        assert!(decode_exchange(0, &[0, 0, 0, 0, 1, 0, 0, 0], usize::MAX).is_err());
    }

    #[test]
    fn message_round_trips_and_rejects_garbage() {
        let d = Descriptor {
            name: "fc1.weight".into(),
            op: OpKind::Broadcast,
            dtype: 0,
            root: 2,
            shape: vec![3, 4],
            policy: "none@dense".into(),
        };
        let mut m = Message {
            shutdown: true,
            now_us: 123,
            new_ready: vec![(3, 99)],
            requests: vec![(7, d.clone())],
            ..Default::default()
        };
        m.set_bits(11, [0, 3, 10].into_iter());
        let mut buf = Vec::new();
        m.encode(&mut buf);
        let back = Message::decode(1, &buf).unwrap();
        assert_eq!(back, m);
        assert!(back.bit(10) && back.bit(3) && !back.bit(4) && !back.bit(64));
        for cut in 0..buf.len() {
            assert!(matches!(
                Message::decode(1, &buf[..cut]),
                Err(Error::Protocol { peer: 1, .. })
            ));
        }
        let mut list = Vec::new();
        encode_list(&[d.clone(), d.clone()], &mut list);
        assert_eq!(decode_list(0, &list).unwrap(), vec![d.clone(), d]);
    }

    /// Every decoder of the negotiation round on `buf` as if rank `peer` had sent it (what
    /// the fuzz target `engine_negotiation` runs): each gives a value or a typed error.
    fn decode_all(peer: usize, buf: &[u8]) {
        let _ = Message::decode(peer, buf);
        let _ = decode_list(peer, buf);
        let part_len = buf.first().map_or(0, |&b| usize::from(b));
        let _ = decode_exchange(peer, buf, part_len);
        let count = buf.get(1).map_or(0, |&b| usize::from(b % 9));
        let _ = decode_tree_exchange(peer, buf, 8, count, |r| r % 2 == 1, part_len);
    }

    /// The fuzz target's decoders on seeded random bytes and on every single-byte corruption
    /// of a valid message: a value or a typed error, never a panic (the fuzz crate runs it
    /// unbounded).
    #[test]
    fn decoders_are_total_on_garbage() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let n = rng.gen_range(0..96);
            let buf: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            decode_all(2, &buf);
        }
        let mut m = Message {
            now_us: 5,
            new_ready: vec![(1, 2)],
            ..Default::default()
        };
        m.set_bits(70, [0, 69].into_iter());
        let mut buf = Vec::new();
        m.encode(&mut buf);
        for i in 0..buf.len() {
            for b in [0u8, 0x7f, 0xff] {
                let mut c = buf.clone();
                c[i] = b;
                decode_all(2, &c);
            }
        }
    }
}
