//! A sparse codec's payload read back as the (index, value) pairs its `encode_sparse`
//! selects for the same step: the parser of untrusted payloads behind
//! [`crate::Engine::all_reduce_encoded`] under the sparse strategy. Total and bounds-checked:
//! every input gives the pairs or a typed error, never a panic, and it allocates nothing
//! beyond the pairs (at most one per element, after the header named the element count).
//!
//! What each codec's payload holds against its pairs (the codec crate's wire layouts):
//! - top-k, DGC: the shared sparse layout (index coding, value coding, `nnz`, the values in
//!   f32 or f16, the indices plain or delta-varint) is the pairs themselves; `encode_sparse`
//!   gives the values already rounded to f16 where the payload carries f16, so widening
//!   them back gives its values bit for bit.
//! - threshold: `tau` and one word per pair, `(index << 1) | sign`; `encode_sparse`'s value
//!   is `tau` with the sign of the residual, i.e. `tau` or `-tau` as the word says.
//! - random-k: the key, `k`, the scale and the `k` raw values; the indices are drawn from the
//!   key, by the codec's own decoder here: the payload with every value set to 1.0 is
//!   decoded into zeros (each drawn index then holds `scale > 0`, whatever the real value,
//!   so a kept 0.0 is not lost), and `encode_sparse`'s values are the raw ones times the
//!   scale (when it is not 1).
//!
//! Nothing is read through a dense buffer by dropping zeros: a kept value may be 0.0.

use gradwire_codec::{Codec, CodecId, DecodeError, Header, SparseGrad, HEADER_LEN};

use crate::error::EncodedRefusal;

/// The pairs of `payload`, a payload of `decoder`'s codec for `zeros.len()` elements,
/// exactly as that codec's `encode_sparse` gives them. `zeros` must hold zeros (random-k
/// decodes into it) and holds zeros again on return.
pub(crate) fn read_pairs(
    decoder: &dyn Codec,
    payload: Vec<u8>,
    zeros: &mut [f32],
) -> Result<SparseGrad, EncodedRefusal> {
    let n = zeros.len();
    let mut out = SparseGrad::default();
    let res = match decoder.id() {
        id @ (CodecId::TopK | CodecId::Dgc) => sparse_layout(&payload, id, n, &mut out),
        CodecId::Threshold => threshold(&payload, n, &mut out),
        CodecId::RandomK => random_k(decoder, payload, zeros, &mut out),
        other => return Err(EncodedRefusal::Unsupported(other.name().to_string())),
    };
    res.map_err(EncodedRefusal::Payload)?;
    Ok(out)
}

fn invalid(field: &'static str, reason: &'static str) -> DecodeError {
    DecodeError::InvalidField { field, reason }
}

/// The `N` bytes at `at`, or `Truncated`.
fn field<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], DecodeError> {
    b.get(at..at.saturating_add(N))
        .and_then(|s| s.try_into().ok())
        .ok_or(DecodeError::Truncated {
            need: at.saturating_add(N),
            have: b.len(),
        })
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, DecodeError> {
    field(b, at).map(u64::from_le_bytes)
}

fn f32_at(b: &[u8], at: usize) -> Result<f32, DecodeError> {
    field(b, at).map(f32::from_le_bytes)
}

/// A payload of `total` bytes is exactly `need` long.
fn exact_len(need: usize, total: usize) -> Result<(), DecodeError> {
    match total.cmp(&need) {
        std::cmp::Ordering::Less => Err(DecodeError::Truncated { need, have: total }),
        std::cmp::Ordering::Greater => Err(DecodeError::TrailingBytes {
            extra: total - need,
        }),
        std::cmp::Ordering::Equal => Ok(()),
    }
}

/// A count field that may not exceed the `n` elements, as a `usize`.
fn count_at(b: &[u8], at: usize, n: usize, name: &'static str) -> Result<usize, DecodeError> {
    let c = u64_at(b, at)?;
    if c > n as u64 {
        return Err(invalid(name, "more entries than elements"));
    }
    Ok(c as usize)
}

/// The next index of a strictly increasing run below `n` (`next`: one past the previous
/// index, 0 at first), as the pairs' `u32`.
fn push_index(
    out: &mut SparseGrad,
    index: u64,
    next: &mut u64,
    n: usize,
) -> Result<(), DecodeError> {
    if index >= n as u64 || index > u64::from(u32::MAX) {
        return Err(DecodeError::IndexOutOfRange { index, len: n });
    }
    if index < *next {
        return Err(invalid("index", "indices not strictly increasing"));
    }
    out.indices.push(index as u32);
    *next = index + 1;
    Ok(())
}

/// IEEE half `h` widened to f32, exactly (NaNs come back quiet, as the codec's reader
/// gives them).
pub(super) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: m * 2^-24, exact in f32.
            let v = m as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, 0) => sign | 0x7f80_0000,
        (0x1f, m) => sign | 0x7fc0_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// The shared sparse layout of top-k and DGC (the codec crate's `sparse/wire.rs`).
fn sparse_layout(p: &[u8], id: CodecId, n: usize, out: &mut SparseGrad) -> Result<(), DecodeError> {
    Header::check(p, id, n)?;
    let prefix = HEADER_LEN + 12;
    let [coding, values, r0, r1] = field::<4>(p, HEADER_LEN)?;
    let delta = match coding {
        0 => false,
        1 => true,
        _ => return Err(invalid("index_coding", "must be 0 (plain) or 1 (delta)")),
    };
    let half = match values {
        0 => false,
        1 => true,
        _ => return Err(invalid("value_coding", "must be 0 (fp32) or 1 (fp16)")),
    };
    if r0 != 0 || r1 != 0 {
        return Err(invalid("reserved", "must be zero"));
    }
    let nnz = count_at(p, HEADER_LEN + 4, n, "nnz")?;
    let width = if half { 2 } else { 4 };
    let vend = prefix + nnz * width;
    if p.len() < vend {
        return Err(DecodeError::Truncated {
            need: vend,
            have: p.len(),
        });
    }
    if !delta {
        exact_len(vend + 4 * nnz, p.len())?;
    } else if p.len() - vend > 5 * nnz {
        return Err(DecodeError::TrailingBytes {
            extra: p.len() - vend - 5 * nnz,
        });
    }
    out.values.reserve_exact(nnz);
    out.indices.reserve_exact(nnz);
    for c in p[prefix..vend].chunks_exact(width) {
        out.values.push(match *c {
            [a, b] => f16_to_f32(u16::from_le_bytes([a, b])),
            [a, b, c, d] => f32::from_le_bytes([a, b, c, d]),
            _ => return Err(invalid("value", "neither 2 nor 4 bytes")),
        });
    }
    let idx = &p[vend..];
    let mut next = 0u64;
    if delta {
        let mut pos = 0usize;
        for _ in 0..nnz {
            let mut v = 0u64;
            let mut shift = 0;
            loop {
                let byte = *idx.get(pos).ok_or(DecodeError::Truncated {
                    need: vend + pos + 1,
                    have: p.len(),
                })?;
                pos += 1;
                if shift == 28 && byte > 0x0f {
                    return Err(invalid("index", "varint longer than 32 bits"));
                }
                v |= u64::from(byte & 0x7f) << shift;
                if byte & 0x80 == 0 {
                    break;
                }
                shift += 7;
            }
            push_index(out, next + v, &mut next, n)?;
        }
        if pos != idx.len() {
            return Err(DecodeError::TrailingBytes {
                extra: idx.len() - pos,
            });
        }
    } else {
        for c in idx.chunks_exact(4) {
            let i = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            push_index(out, u64::from(i), &mut next, n)?;
        }
    }
    Ok(())
}

/// Strom's threshold words (the codec crate's `threshold.rs` and `sparse/words.rs`).
fn threshold(p: &[u8], n: usize, out: &mut SparseGrad) -> Result<(), DecodeError> {
    Header::check(p, CodecId::Threshold, n)?;
    let tau = f32_at(p, HEADER_LEN)?;
    if !(tau.is_finite() && tau > 0.0) {
        return Err(invalid("tau", "not a finite positive number"));
    }
    let count = count_at(p, HEADER_LEN + 4, n, "count")?;
    let width = if n as u64 > 1 << 31 { 8 } else { 4 };
    exact_len(HEADER_LEN + 12 + width * count, p.len())?;
    out.values.reserve_exact(count);
    out.indices.reserve_exact(count);
    let mut next = 0u64;
    for c in p[HEADER_LEN + 12..].chunks_exact(width) {
        let mut w = [0u8; 8];
        w[..width].copy_from_slice(c);
        let word = u64::from_le_bytes(w);
        push_index(out, word >> 1, &mut next, n)?;
        out.values.push(if word & 1 == 1 { -tau } else { tau });
    }
    Ok(())
}

/// Random-k (the codec crate's `randomk.rs`): the values from the payload, the indices from
/// `decoder` decoding the payload with every value set to 1.0 into `zeros`.
fn random_k(
    decoder: &dyn Codec,
    mut p: Vec<u8>,
    zeros: &mut [f32],
    out: &mut SparseGrad,
) -> Result<(), DecodeError> {
    let n = zeros.len();
    Header::check(&p, CodecId::RandomK, n)?;
    let k = count_at(&p, HEADER_LEN + 8, n, "k")?;
    let scale = f32_at(&p, HEADER_LEN + 16)?;
    if !(scale.is_finite() && scale > 0.0) {
        return Err(invalid("scale", "not a finite positive number"));
    }
    let start = HEADER_LEN + 20;
    exact_len(start + 4 * k, p.len())?;
    out.values.reserve_exact(k);
    out.indices.reserve_exact(k);
    for c in p[start..].chunks_exact_mut(4) {
        let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        out.values.push(if scale != 1.0 { v * scale } else { v });
        c.copy_from_slice(&1.0f32.to_le_bytes());
    }
    decoder.decode_add(&p, zeros)?;
    for (i, x) in zeros.iter_mut().enumerate() {
        if *x != 0.0 {
            out.indices.push(i as u32);
            *x = 0.0;
        }
    }
    if out.indices.len() != k {
        // The codec draws k distinct indices; anything else is not its payload.
        return Err(invalid(
            "k",
            "the drawn indices are not k distinct elements",
        ));
    }
    Ok(())
}

/// Differential check of [`read_pairs`] against the codecs' own decoders on `buf`: the codec
/// (top-k in f32 or f16, DGC, threshold, random-k) from its first byte, the element count
/// (1..=4096) from the next two, a valid header put in front of the rest when the fourth
/// byte is odd. Both must accept or both refuse, and what is accepted must be strictly
/// increasing indices below the count whose values, scattered into zeros, equal the
/// decoder's sum bit for bit (NaN for NaN).
#[cfg(any(test, fuzzing))]
pub(crate) fn check_against_decoder(buf: &[u8]) {
    use gradwire_codec::BuildContext;
    const SPECS: [&str; 5] = [
        "topk:ratio=0.1",
        "topk:ratio=0.1,values=fp16",
        "dgc:ratio=0.1",
        "threshold:tau=0.5",
        "randomk:ratio=0.1",
    ];
    let Some((&pick, rest)) = buf.split_first() else {
        return;
    };
    let (n, rest) = match rest {
        [a, b, rest @ ..] => (1 + usize::from(u16::from_le_bytes([*a, *b])) % 4096, rest),
        _ => return,
    };
    let Some((&framed, body)) = rest.split_first() else {
        return;
    };
    let cfg: gradwire_codec::CodecConfig = SPECS[usize::from(pick) % SPECS.len()]
        .parse()
        .expect("a valid spec");
    let decoder = cfg.build(&BuildContext::single(0));
    let mut payload = Vec::new();
    if framed % 2 == 1 {
        Header::write(&mut payload, decoder.id(), n);
    }
    payload.extend_from_slice(body);
    let mut zeros = vec![0.0f32; n];
    let got = read_pairs(&*decoder, payload.clone(), &mut zeros);
    assert!(
        zeros.iter().all(|x| x.to_bits() == 0),
        "the scratch is left zeroed"
    );
    let mut want = vec![0.0f32; n];
    let decoded = decoder.decode_add(&payload, &mut want);
    assert_eq!(
        got.is_ok(),
        decoded.is_ok(),
        "parser {got:?} against decoder {decoded:?}"
    );
    if let Ok(pairs) = got {
        assert_eq!(pairs.indices.len(), pairs.values.len());
        assert!(pairs.indices.windows(2).all(|w| w[0] < w[1]));
        let mut scattered = vec![0.0f32; n];
        for (&i, &v) in pairs.indices.iter().zip(&pairs.values) {
            scattered[i as usize] = 0.0 + v;
        }
        for (i, (a, b)) in scattered.iter().zip(&want).enumerate() {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "element {i}: pairs give {a}, the decoder {b}"
            );
        }
    }
}

/// Fuzzing entry: reads `buf` as a sparse payload of one of the sparse codecs (picked by its
/// first byte, see [`check_against_decoder`]); the parser must give pairs or a typed error,
/// never a panic, and agree with the codec's own decoder.
#[cfg(fuzzing)]
pub fn fuzz_encoded_pairs(buf: &[u8]) {
    check_against_decoder(buf);
}

#[cfg(test)]
mod tests {
    use gradwire_codec::{BuildContext, CodecConfig, Progress, TensorInfo, TensorRole};
    use rand::{Rng, SeedableRng};

    use super::*;

    const SPARSE: [&str; 7] = [
        "topk:ratio=0.05,scope=tensor",
        "topk:ratio=0.05,values=fp16",
        "dgc:ratio=0.01",
        "dgc:ratio=0.02,min_dense=10",
        "threshold:tau=0.3",
        "randomk:ratio=0.1",
        "randomk:ratio=0.1,scale=false",
    ];

    /// Values in [-1, 1) with every fourth one exactly zero.
    fn grad(n: usize, step: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(step);
        (0..n)
            .map(|i| {
                if i % 4 == (step as usize) % 4 {
                    0.0
                } else {
                    rng.gen_range(-1.0f32..1.0)
                }
            })
            .collect()
    }

    /// Two codecs in the same state, step after step: the pairs read off one's payload equal
    /// the other's `encode_sparse`, bit for bit (values included, zeros kept).
    #[test]
    fn pairs_equal_encode_sparse() {
        for spec in SPARSE {
            let cfg: CodecConfig = spec.parse().unwrap();
            let infos = vec![
                TensorInfo::new([20, 15], TensorRole::LinearWeight),
                TensorInfo::new([200], TensorRole::Bias),
            ];
            let ctx = BuildContext::new(5, 1, 3, vec![300, 200]).with_tensors(infos);
            let (mut a, mut b) = (cfg.build(&ctx), cfg.build(&ctx));
            let checker = cfg.build(&ctx);
            let mut zeros = vec![0.0f32; 500];
            let mut kept_zero = false;
            for step in 0..6 {
                let p = Progress {
                    step,
                    epoch: step as f32 * 0.4,
                };
                a.set_progress(p);
                b.set_progress(p);
                let g = grad(500, step);
                let mut payload = Vec::new();
                a.encode(&g, &mut payload);
                let mut want = SparseGrad::default();
                b.sparse_encode().unwrap().encode_sparse(&g, &mut want);
                let got = read_pairs(&*checker, payload, &mut zeros).unwrap();
                assert_eq!(got.indices, want.indices, "{spec} step {step}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got.values), bits(&want.values), "{spec} step {step}");
                assert!(zeros.iter().all(|x| x.to_bits() == 0));
                kept_zero |= got.values.contains(&0.0);
            }
            if spec.starts_with("randomk") || spec.starts_with("dgc:ratio=0.01") {
                assert!(kept_zero, "{spec}: a kept 0.0 was read back");
            }
        }
    }

    /// Every f16 widened here equals the codec's own reader's (its payload decoded into
    /// zeros), bit for bit; signed zeros and a signalling NaN by hand.
    #[test]
    fn f16_widening_matches_the_codec() {
        let n = 1 << 16;
        let mut p = Vec::new();
        Header::write(&mut p, CodecId::TopK, n);
        p.extend_from_slice(&[0, 1, 0, 0]);
        p.extend_from_slice(&(n as u64).to_le_bytes());
        for h in 0..=u16::MAX {
            p.extend_from_slice(&h.to_le_bytes());
        }
        for i in 0..n as u32 {
            p.extend_from_slice(&i.to_le_bytes());
        }
        let codec = "topk:ratio=0.1,values=fp16"
            .parse::<CodecConfig>()
            .unwrap()
            .build(&BuildContext::single(0));
        let mut acc = vec![0.0f32; n];
        codec.decode_add(&p, &mut acc).unwrap();
        for h in 0..=u16::MAX {
            let mine = 0.0 + f16_to_f32(h);
            assert_eq!(mine.to_bits(), acc[h as usize].to_bits(), "f16 {h:#06x}");
        }
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert_eq!(f16_to_f32(0x0000).to_bits(), 0);
        assert_eq!(f16_to_f32(0x7c01).to_bits(), 0x7fc0_2000);
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    }

    /// Valid payloads of every sparse codec, mutated, truncated and extended: the parser
    /// agrees with the codec's decoder on every one ([`check_against_decoder`]).
    #[test]
    fn mutated_payloads_agree_with_the_decoders() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let n = 300usize;
        let specs = [
            "topk:ratio=0.1",
            "topk:ratio=0.1,values=fp16",
            "dgc:ratio=0.1",
            "threshold:tau=0.5",
            "randomk:ratio=0.1",
        ];
        for (pick, spec) in specs.iter().enumerate() {
            let mut c = spec
                .parse::<CodecConfig>()
                .unwrap()
                .build(&BuildContext::single(2));
            let mut payload = Vec::new();
            c.encode(&grad(n, pick as u64), &mut payload);
            let frame = |body: &[u8]| {
                let mut b = vec![pick as u8];
                b.extend_from_slice(&((n - 1) as u16).to_le_bytes());
                b.push(0);
                b.extend_from_slice(body);
                b
            };
            check_against_decoder(&frame(&payload));
            for t in 0..1500 {
                let mut q = payload.clone();
                match t % 4 {
                    0 => {
                        let i = rng.gen_range(HEADER_LEN..q.len());
                        q[i] ^= 1 << rng.gen_range(0..8);
                    }
                    1 => {
                        let i = rng.gen_range(0..q.len());
                        q[i] = rng.gen();
                    }
                    2 => q.truncate(rng.gen_range(0..q.len())),
                    _ => q.extend((0..rng.gen_range(1..9)).map(|_| rng.gen::<u8>())),
                }
                check_against_decoder(&frame(&q));
            }
        }
        // Raw bytes behind a valid header, for every codec.
        for _ in 0..3000 {
            let len = rng.gen_range(0..64);
            let mut buf: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            if buf.len() > 3 {
                buf[1] = rng.gen_range(0..8);
                buf[2] = 0;
                buf[3] |= 1;
            }
            check_against_decoder(&buf);
        }
    }

    /// A codec whose payload this parser does not read is refused by name.
    #[test]
    fn other_codecs_are_refused() {
        let codec = "qsgd:bits=4"
            .parse::<CodecConfig>()
            .unwrap()
            .build(&BuildContext::single(0));
        let mut p = Vec::new();
        let mut c = "qsgd:bits=4"
            .parse::<CodecConfig>()
            .unwrap()
            .build(&BuildContext::single(0));
        c.encode(&[1.0, 2.0], &mut p);
        assert_eq!(
            read_pairs(&*codec, p, &mut [0.0; 2]),
            Err(EncodedRefusal::Unsupported("qsgd".into()))
        );
    }
}
