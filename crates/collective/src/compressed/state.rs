//! The state the compressed all-reduces carry across steps, to and from bytes (a training
//! that stops resumes bit for bit).
//!
//! Layout: the codecs' own ([`StateWriter`], [`StateReader`]) under a 4-byte tag naming the
//! all-reduce (`GWQR` quantized ring, `GWSR` stripes, `GWPS` PowerSGD): its fields in the
//! order it writes them, little-endian: `u64`s, byte strings (a nested codec's
//! [`Codec::save_state`]) and `f32` vectors, each of the last two as a `u64` length followed
//! by the bytes or values. The reader is total: a wrong tag, a short buffer or a length larger
//! than what remains gives a [`DecodeError`], and it never allocates more than the bytes it
//! was given.

use gradwire_codec::{Codec, DecodeError, StateReader, StateWriter};

/// The tag of an all-reduce's state, with the reasons of the errors a load gives.
pub(crate) struct Tag {
    /// The 4-byte tag.
    pub tag: &'static [u8; 4],
    /// The reason when a state has another tag.
    pub not_ours: &'static str,
    /// The reason when a state was saved on a world of another size.
    pub other_world: &'static str,
}

/// The state of a two-leg all-reduce's codecs: `per_chunk` (one per chunk of the world, in
/// chunk order), then `last`. Layout: the tag, the world size as a `u64`, then each codec's
/// state ([`Codec::save_state`]) as a `u64` length and its bytes, `last`'s last.
pub(crate) fn save_codecs(tag: &Tag, per_chunk: &[Box<dyn Codec>], last: &dyn Codec) -> Vec<u8> {
    let mut w = StateWriter::tagged(tag.tag);
    w.u64(per_chunk.len() as u64);
    for c in per_chunk {
        w.bytes(&c.save_state());
    }
    w.bytes(&last.save_state()).finish()
}

/// Restores what [`save_codecs`] saved into the codecs of an all-reduce on a world of the
/// same size, all or nothing: bad input (another tag, another world size, truncated, or
/// refused by a codec) gives a [`DecodeError`] and leaves every codec as it was.
pub(crate) fn load_codecs(
    state: &[u8],
    tag: &Tag,
    per_chunk: &mut [Box<dyn Codec>],
    last: &mut Box<dyn Codec>,
) -> Result<(), DecodeError> {
    let mut r = StateReader::tagged(state, tag.tag, tag.not_ours)?;
    let world = per_chunk.len();
    if r.u64()? != world as u64 {
        return Err(DecodeError::invalid_state(tag.other_world));
    }
    let states = (0..=world)
        .map(|_| r.bytes())
        .collect::<Result<Vec<_>, _>>()?;
    r.finish()?;
    let mut codecs: Vec<&mut Box<dyn Codec>> = per_chunk.iter_mut().collect();
    codecs.push(last);
    load_all(&mut codecs, &states)
}

/// Loads `states[i]` into `codecs[i]`, all or nothing: when one refuses its state, those
/// already loaded get back what they held before (their own saved state), and the error is
/// returned.
fn load_all(codecs: &mut [&mut Box<dyn Codec>], states: &[&[u8]]) -> Result<(), DecodeError> {
    debug_assert_eq!(codecs.len(), states.len());
    let before: Vec<Vec<u8>> = codecs.iter().map(|c| c.save_state()).collect();
    for i in 0..codecs.len() {
        if let Err(e) = codecs[i].load_state(states[i]) {
            for (c, b) in codecs[..=i].iter_mut().zip(&before) {
                // A codec's own state, of its own configuration: loads back.
                let _ = c.load_state(b);
            }
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use gradwire_codec::{BuildContext, CodecConfig};

    use super::*;

    const TAG: Tag = Tag {
        tag: b"GWQR",
        not_ours: "not ours",
        other_world: "other world",
    };

    fn codecs(world: usize) -> (Vec<Box<dyn Codec>>, Box<dyn Codec>) {
        let cfg: CodecConfig = "onebit".parse().unwrap();
        let ctx = BuildContext::single(0);
        (
            (0..world).map(|_| cfg.build(&ctx)).collect(),
            cfg.build(&ctx),
        )
    }

    #[test]
    fn codecs_round_trip_and_refusals() {
        let (mut rs, mut last) = codecs(3);
        for (i, c) in rs.iter_mut().enumerate() {
            c.encode(&[i as f32 + 0.3, -0.1], &mut Vec::new());
        }
        last.encode(&[0.7, 0.2], &mut Vec::new());
        let s = save_codecs(&TAG, &rs, &*last);
        let (mut rs2, mut last2) = codecs(3);
        load_codecs(&s, &TAG, &mut rs2, &mut last2).unwrap();
        assert_eq!(save_codecs(&TAG, &rs2, &*last2), s);
        let other = Tag {
            tag: b"GWSR",
            ..TAG
        };
        assert!(matches!(
            load_codecs(&s, &other, &mut rs2, &mut last2),
            Err(DecodeError::InvalidField {
                reason: "not ours",
                ..
            })
        ));
        let (mut rs4, mut last4) = codecs(4);
        assert!(matches!(
            load_codecs(&s, &TAG, &mut rs4, &mut last4),
            Err(DecodeError::InvalidField {
                reason: "other world",
                ..
            })
        ));
        for cut in 0..s.len() {
            assert!(load_codecs(&s[..cut], &TAG, &mut rs2, &mut last2).is_err());
        }
        assert_eq!(
            save_codecs(&TAG, &rs2, &*last2),
            s,
            "refusals change nothing"
        );
    }
}
