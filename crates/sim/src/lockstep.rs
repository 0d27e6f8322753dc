//! The summary of a shared-host step measurement (`gradwire simulate --host-cores`): the
//! ranks' timings, as [`crate::host`] carries them to rank 0, reduced to one [`HostStep`].
//!
//! A synchronous step waits for the last rank's gradient, so a step's compute is, per pass,
//! the slowest rank's ([`summarize`]); measuring the ranks is `gradwire_train::measure::host`'s.

use crate::host::{decode, TimingsError};

/// Compute per step of `workers` ranks sharing the host.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Lockstep {
    /// Ranks measured.
    pub workers: usize,
    /// Mean seconds of one rank's pass (what a rank's own compute timer reads).
    pub mean_s: f64,
    /// Mean over passes of the slowest rank's seconds (what the synchronous step waits for).
    pub slowest_s: f64,
}

/// Per pass, the slowest rank's time; then the mean over passes, and the mean of all passes.
/// `times[r][i]` is rank `r`'s pass `i`; every rank has the same number of passes. No ranks
/// or no passes give zeros.
pub fn summarize(times: &[Vec<f64>]) -> Lockstep {
    let workers = times.len();
    let passes = times.first().map_or(0, Vec::len);
    if workers == 0 || passes == 0 {
        return Lockstep {
            workers,
            mean_s: 0.0,
            slowest_s: 0.0,
        };
    }
    let slowest: f64 = (0..passes)
        .map(|i| times.iter().map(|t| t[i]).fold(0.0, f64::max))
        .sum::<f64>()
        / passes as f64;
    let mean = times.iter().flatten().sum::<f64>() / (workers * passes) as f64;
    Lockstep {
        workers,
        mean_s: mean,
        slowest_s: slowest,
    }
}

/// A whole step of `workers` ranks sharing the host, measured without a link.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostStep {
    /// Ranks measured.
    pub workers: usize,
    /// The codec (spec) the engine ran.
    pub codec: String,
    /// The compute of the step: per pass the slowest rank's compute, as in [`Lockstep`].
    pub compute: Lockstep,
    /// Seconds per step: the ranks' mean time from one pass's start to the next's.
    pub step_s: f64,
}

/// The [`HostStep`] of `workers` ranks running `codec` from every rank's message of timings
/// ([`crate::host::encode`], rank 0's first): the step the ranks' mean, the compute per pass
/// the slowest rank's ([`summarize`]).
pub fn host_step(all: &[Vec<u8>], codec: &str) -> Result<HostStep, TimingsError> {
    let (steps, times) = decode(all)?;
    let workers = steps.len();
    Ok(HostStep {
        workers,
        codec: codec.to_string(),
        compute: summarize(&times),
        step_s: steps.iter().sum::<f64>() / workers.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_waits_for_the_slowest_rank_of_each_pass() {
        // Two ranks, three passes: the slowest of each pass is 3, 5, 4 (mean 4); all six
        // passes average 3.
        let times = vec![vec![3.0, 1.0, 4.0], vec![2.0, 5.0, 3.0]];
        let l = summarize(&times);
        assert_eq!(l.workers, 2);
        assert!((l.slowest_s - 4.0).abs() < 1e-12, "{l:?}");
        assert!((l.mean_s - 3.0).abs() < 1e-12, "{l:?}");
        assert_eq!(summarize(&[]).slowest_s, 0.0);
        assert_eq!(summarize(&[vec![], vec![]]).mean_s, 0.0);
    }

    #[test]
    fn a_host_step_is_the_ranks_mean_step_and_slowest_compute() {
        use crate::host::encode;
        let all = [encode(1.0, &[3.0, 1.0]), encode(2.0, &[2.0, 5.0])];
        let h = host_step(&all, "fp16").unwrap();
        assert_eq!((h.workers, h.codec.as_str(), h.step_s), (2, "fp16", 1.5));
        // Slowest per pass: 3 and 5, mean 4; all passes average 2.75.
        assert_eq!((h.compute.slowest_s, h.compute.mean_s), (4.0, 2.75));
        assert!(host_step(&[], "none").is_err());
    }

    #[test]
    fn host_steps_keep_their_json_shape() {
        // Rank 0 prints this line and the launcher parses it; simulate's JSON embeds it.
        let h = HostStep {
            workers: 2,
            codec: "none".into(),
            compute: Lockstep {
                workers: 2,
                mean_s: 0.5,
                slowest_s: 0.75,
            },
            step_s: 1.0,
        };
        let s = serde_json::to_string(&h).unwrap();
        assert_eq!(
            s,
            r#"{"workers":2,"codec":"none","compute":{"workers":2,"mean_s":0.5,"slowest_s":0.75},"step_s":1.0}"#
        );
        assert_eq!(serde_json::from_str::<HostStep>(&s).unwrap(), h);
    }
}
