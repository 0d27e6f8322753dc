//! A sparse codec's payload read back as the (index, value) pairs its `encode_sparse`
//! selects for the same step, for [`crate::Engine::all_reduce_encoded`] under the sparse
//! strategy. The codec reads its own wire format
//! ([`gradwire_codec::SparseEncode::decode_pairs`]: exact pairs, a kept 0.0 included, typed
//! errors, at most one pair per element); this file owns only what the engine makes of it:
//! a codec without a sparse form is [`EncodedRefusal::Unsupported`], a payload it refuses is
//! [`EncodedRefusal::Payload`].

use gradwire_codec::{Codec, SparseGrad};

use crate::error::EncodedRefusal;

/// The pairs of `payload`, a payload of `decoder`'s codec for `n` elements, exactly as that
/// codec's `encode_sparse` gives them.
pub(crate) fn read_pairs(
    decoder: &mut dyn Codec,
    payload: &[u8],
    n: usize,
) -> Result<SparseGrad, EncodedRefusal> {
    let id = decoder.id();
    let sparse = decoder
        .sparse_encode()
        .ok_or_else(|| EncodedRefusal::Unsupported(id.name().to_string()))?;
    let mut out = SparseGrad::default();
    sparse
        .decode_pairs(payload, n, &mut out)
        .map_err(EncodedRefusal::Payload)?;
    Ok(out)
}

/// Fuzzing entry: reads `buf` as a sparse payload of one of the sparse codecs (picked by its
/// first byte, see `gradwire_codec::fuzz_decode_pairs`): the codec's reader of its pairs,
/// which [`read_pairs`] runs, must give pairs or a typed error, never a panic, and agree
/// with the codec's own decoder.
#[cfg(fuzzing)]
pub fn fuzz_encoded_pairs(buf: &[u8]) {
    gradwire_codec::fuzz_decode_pairs(buf);
}

#[cfg(test)]
mod tests {
    use gradwire_codec::{BuildContext, CodecConfig, DecodeError};

    use super::*;

    fn build(spec: &str) -> Box<dyn Codec> {
        spec.parse::<CodecConfig>()
            .unwrap()
            .build(&BuildContext::single(0))
    }

    /// The pairs of a sparse codec's payload are its `encode_sparse`'s; its refusals come
    /// back as payload refusals.
    #[test]
    fn sparse_payloads_give_their_pairs() {
        let g: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) * 0.01).collect();
        let (mut a, mut b) = (build("topk:ratio=0.1"), build("topk:ratio=0.1"));
        let mut p = Vec::new();
        a.encode(&g, &mut p);
        let mut want = SparseGrad::default();
        b.sparse_encode().unwrap().encode_sparse(&g, &mut want);
        let mut checker = build("topk:ratio=0.1");
        assert_eq!(read_pairs(&mut *checker, &p, 100), Ok(want));
        p.push(0);
        assert_eq!(
            read_pairs(&mut *checker, &p, 100),
            Err(EncodedRefusal::Payload(DecodeError::TrailingBytes {
                extra: 1
            }))
        );
    }

    /// A codec without a sparse form is refused by name.
    #[test]
    fn other_codecs_are_refused() {
        let mut p = Vec::new();
        build("qsgd:bits=4").encode(&[1.0, 2.0], &mut p);
        assert_eq!(
            read_pairs(&mut *build("qsgd:bits=4"), &p, 2),
            Err(EncodedRefusal::Unsupported("qsgd".into()))
        );
    }
}
