//! The residual a codec owns ([`crate::Feedback::Owned`]: top-k, threshold, random-k with
//! `ef`, adaptive quantization; DGC's momentum and velocity) and the generic wrapper's: sized
//! to the gradient, and saved with the codec's step RNG.

use crate::{CodecId, DecodeError, StateReader, StateWriter, StepRng};

/// Makes `r` hold `n` elements: unchanged when it already does, all zero otherwise (a
/// gradient of another length starts from an empty residual).
pub(crate) fn fit(r: &mut Vec<f32>, n: usize) {
    if r.len() != n {
        r.clear();
        r.resize(n, 0.0);
    }
}

/// The state of a codec that keeps a step RNG and a residual: tag, RNG, residual.
pub(crate) fn save_rng_residual(codec: CodecId, rng: &StepRng, residual: &[f32]) -> Vec<u8> {
    let mut w = StateWriter::new(codec);
    rng.save(&mut w);
    w.f32s(residual);
    w.finish()
}

/// Restores what [`save_rng_residual`] wrote; on error nothing changes.
pub(crate) fn load_rng_residual(
    state: &[u8],
    codec: CodecId,
    rng: &mut StepRng,
    residual: &mut Vec<f32>,
) -> Result<(), DecodeError> {
    let mut r = StateReader::new(state, codec)?;
    let new_rng = rng.loaded(&mut r)?;
    let new_residual = r.f32s()?;
    r.finish()?;
    *rng = new_rng;
    *residual = new_residual;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_keeps_or_zeroes() {
        let mut r = vec![1.0, 2.0];
        fit(&mut r, 2);
        assert_eq!(r, [1.0, 2.0]);
        fit(&mut r, 3);
        assert_eq!(r, [0.0; 3]);
    }

    #[test]
    fn rng_and_residual_round_trip() {
        let mut rng = StepRng::new(3, 1);
        rng.set_step(5);
        let _ = rng.next_stream();
        let s = save_rng_residual(CodecId::TopK, &rng, &[1.5, -2.0]);
        let (mut back, mut res) = (StepRng::new(3, 1), Vec::new());
        load_rng_residual(&s, CodecId::TopK, &mut back, &mut res).unwrap();
        assert_eq!(res, [1.5, -2.0]);
        assert_eq!(back, rng);
        for cut in 0..s.len() {
            assert!(load_rng_residual(&s[..cut], CodecId::TopK, &mut back, &mut res).is_err());
        }
        assert!(load_rng_residual(&s, CodecId::Adaptive, &mut back, &mut res).is_err());
        assert_eq!(res, [1.5, -2.0], "errors change nothing");
    }
}
