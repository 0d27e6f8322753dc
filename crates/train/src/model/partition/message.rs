//! The messages between the partitions of one model replica (see `link.rs` for how they
//! are used): one tag byte, then its payload.
//! - `0` (data): values, little-endian (`f32` activations and gradients, `f64` sums); the
//!   receiver knows how many to expect and refuses any other length.
//! - `1` (abort): a `u32` (little-endian) naming the partition that failed.
//!
//! Apart from the link so that the fuzz target `partition_message` can compile it alone
//! (it needs only `std` and `gradwire_transport`'s error type).

use gradwire_transport::Error as TransportError;

/// Tag of a data message.
pub(crate) const DATA: u8 = 0;
/// Tag of an abort message.
pub(crate) const ABORT: u8 = 1;

/// A value carried by data messages, little-endian.
pub(crate) trait Value: Copy {
    /// Bytes per value.
    const SIZE: usize;
    /// Appends the value's bytes.
    fn put(self, out: &mut Vec<u8>);
    /// Reads one value from exactly [`Value::SIZE`] bytes.
    fn get(b: &[u8]) -> Self;
}

impl Value for f32 {
    const SIZE: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> f32 {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Value for f64 {
    const SIZE: usize = 8;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> f64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        f64::from_le_bytes(a)
    }
}

/// Writes the data tag and `values` into `out` (cleared first).
pub(crate) fn encode<V: Value>(values: &[V], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(1 + V::SIZE * values.len());
    out.push(DATA);
    for &v in values {
        v.put(out);
    }
}

/// Reads `msg`, a message from partition `from` of a replica of `parts`, as `out.len()`
/// values: [`TransportError::SizeMismatch`] for data of another length, `PeerFailed` for an
/// abort naming a partition, `BadFrame` for anything else. Never panics.
pub(crate) fn decode<V: Value>(
    msg: &[u8],
    parts: usize,
    from: usize,
    out: &mut [V],
) -> Result<(), TransportError> {
    match msg.first() {
        Some(&DATA) => {
            let body = &msg[1..];
            if body.len() != V::SIZE * out.len() {
                return Err(TransportError::SizeMismatch {
                    peer: from,
                    expected: 1 + V::SIZE * out.len(),
                    got: msg.len(),
                });
            }
            for (o, b) in out.iter_mut().zip(body.chunks_exact(V::SIZE)) {
                *o = V::get(b);
            }
            Ok(())
        }
        Some(&ABORT) if msg.len() == 5 => {
            let p = u32::from_le_bytes([msg[1], msg[2], msg[3], msg[4]]);
            match usize::try_from(p) {
                Ok(p) if p < parts => Err(TransportError::PeerFailed {
                    peer: p,
                    reported_by: from,
                }),
                _ => Err(TransportError::BadFrame {
                    peer: from,
                    what: "partition abort naming no partition",
                }),
            }
        }
        _ => Err(TransportError::BadFrame {
            peer: from,
            what: "unknown partition message tag",
        }),
    }
}

/// The fuzz target's check (and the tests'): any bytes, read as data of 0 to 7 `f32`s or
/// `f64`s, or as an abort, give a value or a typed error (never a panic); data that decodes
/// encodes back to the same bytes.
#[cfg(any(fuzzing, test))]
pub fn fuzz_message(data: &[u8]) {
    fn check<V: Value + PartialEq + std::fmt::Debug>(data: &[u8], n: usize) {
        let mut out = vec![V::get(&[0u8; 8][..V::SIZE]); n];
        if decode(data, 4, 1, &mut out).is_ok() {
            let mut again = Vec::new();
            encode(&out, &mut again);
            assert_eq!(again, data, "data messages round-trip byte for byte");
        }
    }
    for n in 0..8 {
        check::<f32>(data, n);
        check::<f64>(data, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_decode_or_are_refused_by_type() {
        let mut buf = Vec::new();
        encode(&[1.5f32, -2.0], &mut buf);
        let mut out = [0f32; 2];
        decode(&buf, 3, 1, &mut out).unwrap();
        assert_eq!(out, [1.5, -2.0]);
        let mut three = [0f32; 3];
        assert!(matches!(
            decode(&buf, 3, 1, &mut three),
            Err(TransportError::SizeMismatch { peer: 1, .. })
        ));
        let abort = [ABORT, 2, 0, 0, 0];
        assert!(matches!(
            decode(&abort, 3, 1, &mut out),
            Err(TransportError::PeerFailed {
                peer: 2,
                reported_by: 1
            })
        ));
        for bad in [
            &[ABORT, 3, 0, 0, 0][..],
            &[ABORT, 1][..],
            &[7u8][..],
            &[][..],
        ] {
            assert!(matches!(
                decode(bad, 3, 1, &mut out),
                Err(TransportError::BadFrame { peer: 1, .. })
            ));
        }
        for len in 0..40 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
            fuzz_message(&bytes);
            let mut tagged = bytes.clone();
            tagged.insert(0, DATA);
            fuzz_message(&tagged);
        }
    }
}
