//! The timing discipline every measurement shares: untimed warm-up passes, then the median of
//! enough timed passes to be steady on a shared machine.
//!
//! This file owns the pass counts and the median; what a pass is (a training step, a codec
//! run) belongs to the caller.

use std::time::Instant;

/// Untimed passes before any timing (first-touch page faults, allocator and cache warm-up).
pub const WARMUP_PASSES: usize = 2;
/// Timed passes of each measurement at least (compute steps, codec runs, engine steps).
pub const MIN_PASSES: usize = 10;
/// Timed passes at most, while a measurement has run shorter than [`MIN_SECONDS`].
pub const MAX_PASSES: usize = 100;
/// Seconds each measurement runs at least (unless it reaches [`MAX_PASSES`] first): on a
/// shared machine single passes of a few milliseconds vary by 2x, their median over half a
/// second does not (measured in the validation at `2bdd68f`, 2026-12-03).
pub const MIN_SECONDS: f64 = 0.5;

/// The median of `v`: its middle element once sorted (the upper of the two middle ones when
/// `v` has an even length).
///
/// # Panics
///
/// If `v` is empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median of `pass`'s timings: [`WARMUP_PASSES`] untimed, then at least [`MIN_PASSES`]
/// timed until [`MIN_SECONDS`] have passed or [`MAX_PASSES`] have run. `pass` returns the
/// seconds of the part it times; its first error ends the measurement.
pub fn median_of_passes<E>(
    pass: impl FnMut() -> std::result::Result<f64, E>,
) -> std::result::Result<f64, E> {
    median_within(Passes::STEADY, pass)
}

/// How long a measurement runs: at least `min` timed passes, more (up to [`MAX_PASSES`])
/// while fewer than `min_seconds` have passed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Passes {
    /// Timed passes at least.
    pub min: usize,
    /// Seconds the timed passes run at least, unless [`MAX_PASSES`] come first.
    pub min_seconds: f64,
}

impl Passes {
    /// [`MIN_PASSES`] over [`MIN_SECONDS`]: steady on a shared machine.
    pub const STEADY: Passes = Passes {
        min: MIN_PASSES,
        min_seconds: MIN_SECONDS,
    };
}

/// The median of `pass`'s timings: [`WARMUP_PASSES`] untimed, then as many timed as
/// `passes` asks (at least one). `pass` returns the seconds of the part it times; its first
/// error ends the measurement.
pub fn median_within<E>(
    passes: Passes,
    mut pass: impl FnMut() -> std::result::Result<f64, E>,
) -> std::result::Result<f64, E> {
    for _ in 0..WARMUP_PASSES {
        pass()?;
    }
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < passes.min.max(1)
        || (times.len() < MAX_PASSES && start.elapsed().as_secs_f64() < passes.min_seconds)
    {
        times.push(pass()?);
    }
    Ok(median(times))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_once_sorted() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        // Even lengths: the upper of the two middle elements.
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(vec![7.0]), 7.0);
    }

    #[test]
    fn passes_warm_up_then_time_at_least_the_minimum() {
        // Passes that return their index: the warm-up ones are not in the median.
        let mut calls = 0usize;
        let m = median_of_passes::<()>(|| {
            calls += 1;
            Ok(calls as f64)
        })
        .unwrap();
        let timed = calls - WARMUP_PASSES;
        assert!((MIN_PASSES..=MAX_PASSES).contains(&timed), "{timed}");
        assert_eq!(m, (WARMUP_PASSES + timed / 2 + 1) as f64);
    }

    #[test]
    fn the_first_error_ends_the_measurement() {
        let mut calls = 0;
        let r = median_of_passes(|| {
            calls += 1;
            if calls == 3 {
                Err("third")
            } else {
                Ok(1.0)
            }
        });
        assert_eq!(r, Err("third"));
        assert_eq!(calls, 3);
    }
}
