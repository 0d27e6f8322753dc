//! Elias omega ("recursive Elias") integer codes over an MSB-first bit stream, as QSGD's
//! variable-length encoding uses them.
//!
//! `omega(1) = 0`; for `N > 1`, the groups `bin(N)`, `bin(len(bin(N)) - 1)`, ... down to a
//! group of length 2 are written in reverse order, then a `0`. Bits fill bytes from the most
//! significant bit down; the last byte is zero-padded.

use crate::DecodeError;

/// Writes bits MSB-first into a byte vector.
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    fill: u32,
}

impl<'a> BitWriter<'a> {
    /// Appends to `out`.
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter {
            out,
            acc: 0,
            fill: 0,
        }
    }

    /// Writes the low `n` bits of `v` (n <= 32), most significant first.
    #[inline]
    pub(crate) fn put(&mut self, v: u32, n: u32) {
        debug_assert!(n <= 32);
        if n == 0 {
            return;
        }
        self.acc = (self.acc << n) | (v as u64 & ((1u64 << n) - 1));
        self.fill += n;
        while self.fill >= 8 {
            self.fill -= 8;
            self.out.push((self.acc >> self.fill) as u8);
        }
    }

    /// Writes `omega(v)` for `v >= 1`.
    pub(crate) fn omega(&mut self, v: u32) {
        debug_assert!(v >= 1);
        let mut groups = [(0u32, 0u32); 8];
        let mut k = 0;
        let mut n = v;
        while n > 1 {
            let len = 32 - n.leading_zeros();
            groups[k] = (n, len);
            k += 1;
            n = len - 1;
        }
        for &(g, len) in groups[..k].iter().rev() {
            self.put(g, len);
        }
        self.put(0, 1);
    }

    /// Flushes the last partial byte (zero-padded).
    pub(crate) fn finish(mut self) {
        if self.fill > 0 {
            let pad = 8 - self.fill;
            self.put(0, pad);
        }
    }
}

/// Reads bits MSB-first; every read past the end is an error.
pub(crate) struct BitReader<'a> {
    data: &'a [u8],
    pos: usize,
}

fn short(need_bits: usize, have: usize) -> DecodeError {
    DecodeError::Truncated {
        need: need_bits.div_ceil(8) + crate::HEADER_LEN,
        have: have + crate::HEADER_LEN,
    }
}

impl<'a> BitReader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        BitReader { data, pos: 0 }
    }

    /// Reads `n <= 32` bits.
    #[inline]
    pub(crate) fn get(&mut self, n: u32) -> Result<u32, DecodeError> {
        let end = self.pos + n as usize;
        if end > self.data.len() * 8 {
            return Err(short(end, self.data.len()));
        }
        let mut v = 0u64;
        let mut p = self.pos;
        while p < end {
            let byte = self.data[p / 8] as u64;
            let off = p % 8;
            let take = (8 - off).min(end - p);
            let bits = (byte >> (8 - off - take)) & ((1 << take) - 1);
            v = (v << take) | bits;
            p += take;
        }
        self.pos = end;
        Ok(v as u32)
    }

    /// Reads `omega(v)`; refuses values above `max`.
    pub(crate) fn omega(&mut self, max: u32, field: &'static str) -> Result<u32, DecodeError> {
        let mut n: u32 = 1;
        loop {
            if self.get(1)? == 0 {
                return Ok(n);
            }
            // The group is n+1 bits whose leading 1 was just read.
            if n >= 32 {
                return Err(DecodeError::InvalidField {
                    field,
                    reason: "Elias code too long",
                });
            }
            let rest = self.get(n)?;
            let v = (1u64 << n) | rest as u64;
            if v > max as u64 {
                return Err(DecodeError::InvalidField {
                    field,
                    reason: "value out of range",
                });
            }
            n = v as u32;
        }
    }

    /// Bytes consumed so far (rounded up).
    pub(crate) fn bytes_used(&self) -> usize {
        self.pos.div_ceil(8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn omega_round_trip_and_known_codes() {
        let mut out = Vec::new();
        let mut w = BitWriter::new(&mut out);
        w.omega(1); // 0
        w.omega(2); // 10 0
        w.omega(4); // 10 100 0
        w.finish();
        assert_eq!(out, vec![0b0100_1010, 0b0000_0000]);
        let vals: Vec<u32> = (1..2000).chain([65535, 1 << 30, u32::MAX]).collect();
        let mut out = Vec::new();
        let mut w = BitWriter::new(&mut out);
        for &v in &vals {
            w.omega(v);
            w.put(v & 1, 1);
        }
        w.finish();
        let mut r = BitReader::new(&out);
        for &v in &vals {
            assert_eq!(r.omega(u32::MAX, "x").unwrap(), v);
            assert_eq!(r.get(1).unwrap(), v & 1);
        }
        assert_eq!(r.bytes_used(), out.len());
        let mut r = BitReader::new(&out);
        assert!(r.omega(1000, "x").is_ok());
        let mut r = BitReader::new(&[0xff; 3]);
        assert!(r.omega(u32::MAX, "x").is_err());
    }
}
