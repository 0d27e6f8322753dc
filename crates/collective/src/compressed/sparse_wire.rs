//! The sparse all-reduce's wire format (little-endian), small and total:
//!
//! ```text
//! 0      magic  u8  = 0x53 ('S')
//! 1      kind   u8  = 0 sparse | 1 dense | 2 signs
//! 2..4   zero   u16 (reserved, must be 0)
//! 4..8   nnz    u32 (sparse, signs: number of entries; dense: 0)
//! 8..16  len    u64 (the tensor's element count; must equal the receiver's)
//! sparse: nnz u32 indices (strictly increasing, < len), then nnz f32 values
//! dense:  len f32 values
//! signs:  tau f32 (finite, > 0), then nnz u32 words (index << 1) | sign (sign 1 = -tau),
//!         indices strictly increasing, < len
//! ```
//!
//! *Signs* is Strom's (2015) message: 32 bits per sent element, a 31-bit index and a sign
//! bit, the value `+-tau` implicit. The encoder writes it whenever every value has the same
//! magnitude (finite, non-zero) and the tensor has at most `2^31` elements — a threshold
//! codec's own selection, and sums that stay `+-tau` where index sets do not overlap — and
//! pairs otherwise; the decoder refuses pairs that should have been signs, so every message
//! has one encoding.
//!
//! [`decode`] checks every field and the exact total length; malformed input is an error
//! naming the sender, never a panic, and never allocates beyond `len` elements.

use gradwire_codec::SparseGrad;

use crate::{Error, Result};

/// Header length in bytes.
pub const HEADER: usize = 16;
const MAGIC: u8 = 0x53;
const SPARSE: u8 = 0;
const DENSE: u8 = 1;
const SIGNS: u8 = 2;
/// Largest tensor whose indices fit the 31 bits of a sign word.
const SIGN_MAX_LEN: usize = 1 << 31;

/// The common magnitude of `values` when they may travel as sign words: at least one value,
/// all `+-tau` with the same finite `tau > 0`, and `len <= 2^31`.
fn sign_magnitude(values: &[f32], len: usize) -> Option<f32> {
    let tau = values.first()?.abs();
    (len <= SIGN_MAX_LEN
        && tau.is_finite()
        && tau > 0.0
        && values.iter().all(|v| v.abs().to_bits() == tau.to_bits()))
    .then_some(tau)
}

/// A decoded message: sparse pairs or a dense vector.
pub(crate) enum Kind {
    Sparse,
    Dense,
}

/// Writes a sparse message for `s` (tensor length `len`) into `out` (cleared first): sign
/// words when every value is `+-tau`, pairs otherwise.
pub(crate) fn encode_sparse(s: &SparseGrad, len: usize, out: &mut Vec<u8>) {
    out.clear();
    if let Some(tau) = sign_magnitude(&s.values, len) {
        out.reserve(HEADER + 4 + 4 * s.indices.len());
        header(out, SIGNS, s.indices.len() as u32, len);
        out.extend_from_slice(&tau.to_le_bytes());
        for (&i, &v) in s.indices.iter().zip(&s.values) {
            let word = (i << 1) | u32::from(v.is_sign_negative());
            out.extend_from_slice(&word.to_le_bytes());
        }
        return;
    }
    out.reserve(HEADER + 8 * s.indices.len());
    header(out, SPARSE, s.indices.len() as u32, len);
    out.extend_from_slice(bytemuck::cast_slice(&s.indices));
    out.extend_from_slice(bytemuck::cast_slice(&s.values));
}

/// Writes a dense message for `d` into `out` (cleared first).
pub(crate) fn encode_dense(d: &[f32], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(HEADER + 4 * d.len());
    header(out, DENSE, 0, d.len());
    out.extend_from_slice(bytemuck::cast_slice(d));
}

fn header(out: &mut Vec<u8>, kind: u8, nnz: u32, len: usize) {
    out.extend_from_slice(&[MAGIC, kind, 0, 0]);
    out.extend_from_slice(&nnz.to_le_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
}

/// Decodes `msg` from `peer` for a tensor of `len` elements: a sparse message into `sparse`
/// (cleared first), a dense one into `dense` (resized to `len`).
pub(crate) fn decode(
    peer: usize,
    msg: &[u8],
    len: usize,
    sparse: &mut SparseGrad,
    dense: &mut Vec<f32>,
) -> Result<Kind> {
    let bad = |what| Error::Malformed { peer, what };
    if msg.len() < HEADER {
        return Err(bad("sparse all-reduce message shorter than its header"));
    }
    if msg[0] != MAGIC {
        return Err(bad("bad magic in sparse all-reduce message"));
    }
    if msg[2] != 0 || msg[3] != 0 {
        return Err(bad("reserved bytes not zero"));
    }
    let nnz = u32::from_le_bytes(msg[4..8].try_into().expect("4 bytes")) as usize;
    let their_len = u64::from_le_bytes(msg[8..16].try_into().expect("8 bytes"));
    if their_len != len as u64 {
        return Err(Error::LengthMismatch {
            peer,
            expected: len,
            got: usize::try_from(their_len).unwrap_or(usize::MAX),
        });
    }
    let body = &msg[HEADER..];
    match msg[1] {
        SPARSE => {
            if nnz > len || body.len() != 8 * nnz {
                return Err(bad("sparse message length disagrees with its pair count"));
            }
            sparse.clear();
            let (idx, val) = body.split_at(4 * nnz);
            let mut prev: Option<u32> = None;
            for c in idx.chunks_exact(4) {
                let i = u32::from_le_bytes(c.try_into().expect("4 bytes"));
                if (i as usize) >= len || prev.is_some_and(|p| i <= p) {
                    return Err(bad(
                        "sparse indices out of range or not strictly increasing",
                    ));
                }
                prev = Some(i);
                sparse.indices.push(i);
            }
            sparse.values.extend(
                val.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))),
            );
            if sign_magnitude(&sparse.values, len).is_some() {
                sparse.clear();
                return Err(bad("pairs of one magnitude must travel as sign words"));
            }
            Ok(Kind::Sparse)
        }
        SIGNS => {
            if nnz == 0 || nnz > len || len > SIGN_MAX_LEN || body.len() != 4 + 4 * nnz {
                return Err(bad("sign message length disagrees with its word count"));
            }
            let tau = f32::from_le_bytes(body[..4].try_into().expect("4 bytes"));
            if !(tau.is_finite() && tau > 0.0) {
                return Err(bad("sign message magnitude not finite and positive"));
            }
            sparse.clear();
            let mut prev: Option<u32> = None;
            for c in body[4..].chunks_exact(4) {
                let w = u32::from_le_bytes(c.try_into().expect("4 bytes"));
                let i = w >> 1;
                if (i as usize) >= len || prev.is_some_and(|p| i <= p) {
                    sparse.clear();
                    return Err(bad(
                        "sign word indices out of range or not strictly increasing",
                    ));
                }
                prev = Some(i);
                sparse.indices.push(i);
                sparse.values.push(if w & 1 == 1 { -tau } else { tau });
            }
            Ok(Kind::Sparse)
        }
        DENSE => {
            if nnz != 0 || body.len() != 4 * len {
                return Err(bad("dense message length disagrees with the tensor length"));
            }
            dense.clear();
            dense.extend(
                body.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))),
            );
            Ok(Kind::Dense)
        }
        _ => Err(bad("unknown message kind")),
    }
}

/// Fuzzing entry point (not part of the API): decodes `msg` for a tensor of `len` elements
/// and checks that what the decoder accepts is canonical: it re-encodes to the same bytes,
/// and a sparse message merges with itself into the same index set.
#[cfg(fuzzing)]
pub fn fuzz_decode(msg: &[u8], len: usize) -> Result<()> {
    let mut sparse = SparseGrad::default();
    let mut dense = Vec::new();
    let mut again = Vec::new();
    match decode(0, msg, len, &mut sparse, &mut dense)? {
        Kind::Sparse => {
            assert!(sparse.indices.len() <= len && sparse.values.len() == sparse.indices.len());
            encode_sparse(&sparse, len, &mut again);
            let mut m = SparseGrad::default();
            merge(&sparse, &sparse, &mut m);
            assert_eq!(m.indices, sparse.indices, "self-merge keeps the index set");
        }
        Kind::Dense => {
            assert_eq!(dense.len(), len);
            encode_dense(&dense, &mut again);
        }
    }
    assert_eq!(
        again, msg,
        "an accepted message re-encodes to the same bytes"
    );
    Ok(())
}

/// Merges two sorted sparse vectors into `out` (cleared first), adding values at common
/// indices (`a + b`, commutative, so both partners of an exchange get the same bits).
pub(crate) fn merge(a: &SparseGrad, b: &SparseGrad, out: &mut SparseGrad) {
    out.clear();
    let (mut i, mut j) = (0, 0);
    let (ai, bi) = (&a.indices, &b.indices);
    while i < ai.len() && j < bi.len() {
        match ai[i].cmp(&bi[j]) {
            std::cmp::Ordering::Less => {
                out.indices.push(ai[i]);
                out.values.push(a.values[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.indices.push(bi[j]);
                out.values.push(b.values[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.indices.push(ai[i]);
                out.values.push(a.values[i] + b.values[j]);
                i += 1;
                j += 1;
            }
        }
    }
    out.indices.extend_from_slice(&ai[i..]);
    out.values.extend_from_slice(&a.values[i..]);
    out.indices.extend_from_slice(&bi[j..]);
    out.values.extend_from_slice(&b.values[j..]);
}

/// Size of the union of two sorted index lists.
pub(crate) fn union_len(a: &[u32], b: &[u32]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    // Branch-free steps: the lower index advances, both on a tie (one union element each).
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        i += usize::from(x <= y);
        j += usize::from(y <= x);
        n += 1;
    }
    n + (a.len() - i) + (b.len() - j)
}

/// Adds a sparse vector into a dense one.
pub(crate) fn scatter_add(s: &SparseGrad, dense: &mut [f32]) {
    for (&i, &v) in s.indices.iter().zip(&s.values) {
        dense[i as usize] += v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sg(pairs: &[(u32, f32)]) -> SparseGrad {
        SparseGrad {
            indices: pairs.iter().map(|p| p.0).collect(),
            values: pairs.iter().map(|p| p.1).collect(),
        }
    }

    proptest::proptest! {
        /// The union's size equals a set's, for any two sorted index lists (empty, equal,
        /// disjoint, overlapping).
        #[test]
        fn union_len_is_the_size_of_the_set_union(
            a in proptest::collection::btree_set(0u32..300, 0..120),
            b in proptest::collection::btree_set(0u32..300, 0..120),
        ) {
            let want = a.union(&b).count();
            let (a, b): (Vec<u32>, Vec<u32>) = (a.into_iter().collect(), b.into_iter().collect());
            proptest::prop_assert_eq!(union_len(&a, &b), want);
            proptest::prop_assert_eq!(union_len(&b, &a), want);
        }
    }

    #[test]
    fn round_trip_and_merge() {
        let a = sg(&[(1, 1.0), (4, 2.0), (9, 3.0)]);
        let b = sg(&[(0, 5.0), (4, 1.0)]);
        let mut m = SparseGrad::default();
        merge(&a, &b, &mut m);
        assert_eq!(m, sg(&[(0, 5.0), (1, 1.0), (4, 3.0), (9, 3.0)]));
        assert_eq!(union_len(&a.indices, &b.indices), 4);
        let mut wire = Vec::new();
        encode_sparse(&m, 10, &mut wire);
        let (mut s, mut d) = (SparseGrad::default(), Vec::new());
        assert!(matches!(
            decode(3, &wire, 10, &mut s, &mut d),
            Ok(Kind::Sparse)
        ));
        assert_eq!(s, m);
        encode_dense(&[1.0, 2.0], &mut wire);
        assert!(matches!(
            decode(3, &wire, 2, &mut s, &mut d),
            Ok(Kind::Dense)
        ));
        assert_eq!(d, [1.0, 2.0]);
    }

    /// Values of one magnitude travel as Strom's 32-bit sign words (4 bytes an entry, one
    /// tau), checked against a hand-written message; every truncation and corruption is an
    /// error or a canonical decode.
    #[test]
    fn equal_magnitudes_travel_as_sign_words() {
        let s = sg(&[(0, 0.5), (3, -0.5), (7, 0.5), (2_000_000_000, -0.5)]);
        let len = 2_000_000_001;
        let mut wire = Vec::new();
        encode_sparse(&s, len, &mut wire);
        let mut want = vec![0x53u8, 2, 0, 0, 4, 0, 0, 0];
        want.extend_from_slice(&(len as u64).to_le_bytes());
        want.extend_from_slice(&0.5f32.to_le_bytes());
        for w in [0u32, 3 * 2 + 1, 7 * 2, 4_000_000_001] {
            want.extend_from_slice(&w.to_le_bytes());
        }
        assert_eq!(wire, want);
        assert_eq!(wire.len(), HEADER + 4 + 4 * 4);
        let (mut got, mut d) = (SparseGrad::default(), Vec::new());
        assert!(matches!(
            decode(0, &wire, len, &mut got, &mut d),
            Ok(Kind::Sparse)
        ));
        assert_eq!(got, s);
        for cut in 0..wire.len() {
            assert!(decode(1, &wire[..cut], len, &mut got, &mut d).is_err());
        }
        for pos in 0..wire.len() {
            for v in [0u8, 1, 2, 0x53, 0x80, 0xff] {
                let mut w = wire.clone();
                w[pos] = v;
                // A corrupted message is refused or is canonical: it re-encodes as read.
                let mut again = Vec::new();
                match decode(1, &w, len, &mut got, &mut d) {
                    Ok(Kind::Sparse) => encode_sparse(&got, len, &mut again),
                    Ok(Kind::Dense) => encode_dense(&d, &mut again),
                    Err(_) => continue,
                }
                assert_eq!(again, w, "byte {pos} set to {v:#x}");
            }
        }
        // Mixed magnitudes, a zero, or an empty set stay pairs.
        for pairs in [vec![(1, 0.5), (2, 1.0)], vec![(1, 0.0)], vec![]] {
            encode_sparse(&sg(&pairs), 10, &mut wire);
            assert_eq!(wire[1], SPARSE, "{pairs:?}");
            assert_eq!(wire.len(), HEADER + 8 * pairs.len());
        }
        // Pairs that should have been signs, signs with a bad tau or no words: refused.
        let mut pairs = Vec::new();
        header(&mut pairs, SPARSE, 2, 10);
        for x in [1u32, 4] {
            pairs.extend_from_slice(&x.to_le_bytes());
        }
        for x in [0.25f32, -0.25] {
            pairs.extend_from_slice(&x.to_le_bytes());
        }
        assert!(decode(5, &pairs, 10, &mut got, &mut d).is_err());
        for tau in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
            let mut m = Vec::new();
            header(&mut m, SIGNS, 1, 10);
            m.extend_from_slice(&tau.to_le_bytes());
            m.extend_from_slice(&2u32.to_le_bytes());
            assert!(decode(5, &m, 10, &mut got, &mut d).is_err(), "{tau}");
        }
        let mut m = Vec::new();
        header(&mut m, SIGNS, 0, 10);
        m.extend_from_slice(&1f32.to_le_bytes());
        assert!(decode(5, &m, 10, &mut got, &mut d).is_err());
    }

    #[test]
    fn decode_is_total() {
        let mut wire = Vec::new();
        encode_sparse(&sg(&[(1, 1.0), (4, 2.0)]), 10, &mut wire);
        let (mut s, mut d) = (SparseGrad::default(), Vec::new());
        // Every truncation and every single-byte corruption is an error or a valid decode,
        // never a panic.
        for cut in 0..wire.len() {
            assert!(decode(1, &wire[..cut], 10, &mut s, &mut d).is_err());
        }
        for pos in 0..wire.len() {
            for v in [0u8, 1, 0x53, 0xff] {
                let mut w = wire.clone();
                w[pos] = v;
                let _ = decode(1, &w, 10, &mut s, &mut d);
            }
        }
        assert!(matches!(
            decode(1, &wire, 11, &mut s, &mut d),
            Err(Error::LengthMismatch { peer: 1, .. })
        ));
        // Unsorted indices are refused.
        encode_sparse(&sg(&[(4, 1.0), (1, 2.0)]), 10, &mut wire);
        assert!(matches!(
            decode(2, &wire, 10, &mut s, &mut d),
            Err(Error::Malformed { peer: 2, .. })
        ));
    }
}
