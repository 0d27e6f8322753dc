//! Reproducible randomness for stochastic codecs.
//!
//! Each encode draws a fresh ChaCha8 stream keyed by `(seed, rank, step, call)`: `step` comes
//! from [`crate::Codec::set_progress`], `call` counts the encodes within that step. Runs and
//! tests are therefore reproducible, and a codec restored from its saved state continues the
//! exact same streams. Per-element uniforms come from a counter-based hash of the element
//! index keyed by that stream ([`uniform`]), which the compiler vectorizes; ChaCha only
//! supplies the keys.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{DecodeError, StateReader, StateWriter};

/// The position of a stochastic codec's random streams: `(seed, rank, step, call)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRng {
    seed: u64,
    rank: u64,
    step: u64,
    call: u64,
}

impl StepRng {
    /// Streams for `rank` of a run seeded with `seed`, at step 0.
    pub fn new(seed: u64, rank: usize) -> Self {
        StepRng {
            seed,
            rank: rank as u64,
            step: 0,
            call: 0,
        }
    }

    /// Moves to optimizer step `step` (a new step restarts the call counter).
    pub fn set_step(&mut self, step: u64) {
        if step != self.step {
            self.step = step;
            self.call = 0;
        }
    }

    /// The ChaCha8 stream of the next encode call.
    pub fn next_stream(&mut self) -> ChaCha8Rng {
        let mut key = [0u8; 32];
        for (i, v) in [self.seed, self.rank, self.step, self.call]
            .iter()
            .enumerate()
        {
            key[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        self.call += 1;
        ChaCha8Rng::from_seed(key)
    }

    /// The 32-bit key of the next encode call's per-element uniforms.
    pub fn next_key(&mut self) -> u32 {
        self.next_stream().next_u32()
    }

    /// Appends the position to a state.
    pub fn save(&self, w: &mut StateWriter) {
        w.u64(self.step).u64(self.call);
    }

    /// Restores the position saved by [`StepRng::save`].
    pub fn load(&mut self, r: &mut StateReader<'_>) -> Result<(), DecodeError> {
        self.step = r.u64()?;
        self.call = r.u64()?;
        Ok(())
    }

    /// This RNG at the position [`StepRng::save`] saved (for a `load_state` that changes
    /// nothing until every field has been read).
    pub fn loaded(&self, r: &mut StateReader<'_>) -> Result<StepRng, DecodeError> {
        let mut rng = self.clone();
        rng.load(r)?;
        Ok(rng)
    }
}

/// A bijective 32-bit mix of element index `i` under `key` (lowbias32 finalizer).
#[inline(always)]
pub(crate) fn hash32(key: u32, i: u32) -> u32 {
    let mut x = i.wrapping_mul(0x9E37_79B9) ^ key;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// A uniform in `[0, 1)` on a 2^-24 grid for element `i` under `key`.
///
/// `P(uniform < p) = ceil(p * 2^24) / 2^24`, so a Bernoulli draw `uniform < p` is unbiased up
/// to 2^-24 (below the f32 rounding of `p` itself).
#[inline(always)]
pub(crate) fn uniform(key: u32, i: u32) -> f32 {
    (hash32(key, i) >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let mut a = StepRng::new(1, 0);
        let mut b = StepRng::new(1, 0);
        assert_eq!(a.next_key(), b.next_key());
        assert_ne!(a.next_key(), StepRng::new(1, 1).next_key());
        a.set_step(3);
        let k = a.next_key();
        b.set_step(3);
        assert_eq!(k, b.next_key());
        assert_ne!(k, a.next_key());
    }

    #[test]
    fn uniform_mean_and_range() {
        let n = 100_000u32;
        let mut sum = 0.0f64;
        for i in 0..n {
            let u = uniform(12345, i);
            assert!((0.0..1.0).contains(&u));
            sum += u as f64;
        }
        assert!((sum / n as f64 - 0.5).abs() < 0.005);
    }
}
