//! Time to accuracy in a report: the target a run must reach, each run's training time until
//! it first does, the speedup over the baseline codec, and, across emulated link speeds, the
//! speed above which the baseline (dense) wins.
//!
//! Training time is wall-clock time without evaluation (`wall_s - eval_s` summed over the
//! epochs up to the first one that reaches the target), so the evaluation schedule does not
//! count against a codec. The target is checked at the end of each epoch; `--max-steps`
//! makes epochs shorter for a finer grain.

use super::records::{Metric, RunRecord};
use super::render::{baseline_runs, link_bits, links_of};

/// Accuracy points under the baseline's final accuracy that the default target allows.
pub const ACCURACY_SLACK_POINTS: f64 = 0.5;
/// Fraction over the baseline's final perplexity that the default target allows.
pub const PERPLEXITY_SLACK: f64 = 0.02;

/// What a run must reach.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The metric compared.
    pub metric: Metric,
    /// The value to reach, in display units (accuracy in percent).
    pub value: f64,
    /// How the value was chosen, for the report.
    pub how: String,
}

impl Target {
    /// `given` if set, else the mean final metric of the baseline runs minus
    /// [`ACCURACY_SLACK_POINTS`] (accuracy) or plus [`PERPLEXITY_SLACK`] of it
    /// (perplexity); `None` when neither exists.
    pub fn choose(
        metric: Metric,
        baseline_runs: &[&RunRecord],
        given: Option<f64>,
    ) -> Option<Target> {
        if let Some(value) = given {
            return Some(Target {
                metric,
                value,
                how: "given with --target".into(),
            });
        }
        let finals: Vec<f64> = baseline_runs
            .iter()
            .filter_map(|r| r.final_metric(metric))
            .collect();
        if finals.is_empty() {
            return None;
        }
        let mean = finals.iter().sum::<f64>() / finals.len() as f64;
        Some(match metric {
            Metric::Accuracy => Target {
                metric,
                value: mean - ACCURACY_SLACK_POINTS,
                how: format!(
                    "the baseline's mean final accuracy ({mean:.2}%) minus {ACCURACY_SLACK_POINTS} points"
                ),
            },
            Metric::Perplexity => Target {
                metric,
                value: mean * (1.0 + PERPLEXITY_SLACK),
                how: format!(
                    "the baseline's mean final perplexity ({mean:.2}) plus {:.0}%",
                    PERPLEXITY_SLACK * 100.0
                ),
            },
        })
    }

    /// The target as a table header names it.
    pub fn label(&self) -> String {
        match self.metric {
            Metric::Accuracy => format!("{:.2}%", self.value),
            Metric::Perplexity => format!("perplexity {:.2}", self.value),
        }
    }
}

/// The time to target of a group of runs (one per seed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupTime {
    /// Mean training seconds to the target, when every run reached it.
    pub mean_s: Option<f64>,
    /// Runs that reached the target.
    pub reached: usize,
    /// Runs in the group.
    pub runs: usize,
}

impl GroupTime {
    /// The time to `target` of `runs`.
    pub fn of(runs: &[&RunRecord], target: &Target) -> GroupTime {
        let times: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.time_to(target.metric, target.value))
            .collect();
        GroupTime {
            mean_s: (times.len() == runs.len() && !runs.is_empty())
                .then(|| times.iter().sum::<f64>() / times.len() as f64),
            reached: times.len(),
            runs: runs.len(),
        }
    }

    /// The cell of a table: seconds, or how many runs did not get there.
    pub fn cell(&self) -> String {
        match self.mean_s {
            Some(t) => format!("{t:.1}"),
            None if self.runs > 1 => format!("not reached ({} of {})", self.reached, self.runs),
            None => "not reached".into(),
        }
    }

    /// How many times faster than `base` (its time over this one's).
    pub fn speedup_over(&self, base: &GroupTime) -> Option<f64> {
        match (base.mean_s, self.mean_s) {
            (Some(b), Some(t)) if t > 0.0 => Some(b / t),
            _ => None,
        }
    }
}

/// A speedup as a table cell.
pub fn speedup_cell(s: Option<f64>) -> String {
    s.map_or_else(|| "n/a".into(), |s| format!("{s:.2}×"))
}

/// One codec's speedup over the baseline at each link speed, ordered slow to fast;
/// `None` bandwidth is loopback without emulation (faster than any emulated speed).
/// A speedup of `None` means the codec did not reach the target while the baseline did
/// (it loses), or neither did (no verdict).
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedupCurve {
    /// (bits per second, speedup over the baseline, the baseline reached the target).
    pub points: Vec<(Option<u64>, Option<f64>, bool)>,
}

/// Where the baseline starts winning along a [`SpeedupCurve`].
#[derive(Debug, Clone, PartialEq)]
pub enum Crossover {
    /// The codec reaches the target sooner at every speed measured.
    CodecWinsEverywhere,
    /// The baseline is at least as fast at every speed measured.
    BaselineWinsEverywhere,
    /// The baseline wins above this speed (bits per second), interpolated on log scales
    /// between the last speed where the codec wins and the first where it loses.
    Above(f64),
    /// The codec wins at the first speed and does not reach the target at the second, so
    /// there is no speedup to interpolate: the baseline starts winning between them.
    Between(u64, u64),
    /// The codec wins up to the fastest emulated speed and loses on loopback, which has no
    /// bandwidth to interpolate to: the baseline wins somewhere above this speed.
    Beyond(u64),
    /// Wins and losses alternate, or a speed has no verdict: no single crossover.
    Unclear,
}

impl SpeedupCurve {
    /// Where the baseline starts to win.
    pub fn crossover(&self) -> Crossover {
        // true = the codec wins (speedup above 1), false = the baseline does.
        let mut verdicts = Vec::with_capacity(self.points.len());
        for &(bw, s, base_reached) in &self.points {
            let wins = match (s, base_reached) {
                (Some(s), _) => s > 1.0,
                (None, true) => false,
                (None, false) => return Crossover::Unclear,
            };
            verdicts.push((bw, s, wins));
        }
        if verdicts.is_empty() {
            return Crossover::Unclear;
        }
        if verdicts.iter().all(|v| v.2) {
            return Crossover::CodecWinsEverywhere;
        }
        if verdicts.iter().all(|v| !v.2) {
            return Crossover::BaselineWinsEverywhere;
        }
        let flip = verdicts.iter().position(|v| !v.2).unwrap_or(0);
        if flip == 0 || verdicts[flip..].iter().any(|v| v.2) {
            return Crossover::Unclear;
        }
        let (b0, s0) = (verdicts[flip - 1].0, verdicts[flip - 1].1);
        let (b1, s1) = (verdicts[flip].0, verdicts[flip].1);
        match (b0, s0, b1, s1) {
            (Some(b0), Some(s0), Some(b1), Some(s1)) if s0 > 1.0 && s1 > 0.0 => {
                // log(speedup) is linear in log(bandwidth) between the two points.
                let (l0, l1) = ((b0 as f64).ln(), (b1 as f64).ln());
                let (y0, y1) = (s0.ln(), s1.ln());
                let t = if y0 == y1 { 1.0 } else { y0 / (y0 - y1) };
                Crossover::Above((l0 + t * (l1 - l0)).exp())
            }
            (Some(b0), _, Some(b1), _) => Crossover::Between(b0, b1),
            (Some(b0), _, None, _) => Crossover::Beyond(b0),
            _ => Crossover::Unclear,
        }
    }
}

/// A bandwidth in bits per second as people write it (`100 Mbit/s`, `2.5 Gbit/s`).
pub fn human_bits(bps: f64) -> String {
    for (unit, scale) in [
        ("Tbit/s", 1e12),
        ("Gbit/s", 1e9),
        ("Mbit/s", 1e6),
        ("kbit/s", 1e3),
    ] {
        // A hair under a unit (an interpolated 999.99 Mbit/s) reads as that unit.
        if bps >= scale * 0.9995 {
            let v = bps / scale;
            if v >= 100.0 {
                return format!("{v:.0} {unit}");
            }
            let n = format!("{v:.3}");
            return format!("{} {unit}", n.trim_end_matches('0').trim_end_matches('.'));
        }
    }
    format!("{bps:.0} bit/s")
}

impl Crossover {
    /// The crossover as a table cell.
    pub fn cell(&self) -> String {
        match self {
            Crossover::CodecWinsEverywhere => "codec faster at every speed".into(),
            Crossover::BaselineWinsEverywhere => "baseline faster at every speed".into(),
            Crossover::Above(b) => format!("baseline faster above ~{}", human_bits(*b)),
            Crossover::Between(a, b) => format!(
                "baseline faster above a speed between {} and {}",
                human_bits(*a as f64),
                human_bits(*b as f64)
            ),
            Crossover::Beyond(b) => format!(
                "baseline faster above {} (on loopback)",
                human_bits(*b as f64)
            ),
            Crossover::Unclear => "no single crossover".into(),
        }
    }
}

/// One line of the time-to-accuracy chart: a codec row's name and its points (bits per
/// second, training seconds to the target).
pub type TimeSeries = (String, Vec<(f64, f64)>);

/// The data of the time-to-accuracy chart: per codec row (codec and momentum setting, in
/// first-seen order), training time to the target against the emulated link speed; runs
/// without emulation and runs that missed the target are left out. `None` when there is
/// no target: no `given` one and no baseline run.
pub fn time_series(
    runs: &[RunRecord],
    baseline: &str,
    given: Option<f64>,
) -> Option<(Target, Vec<TimeSeries>)> {
    let metric = super::records::common_metric(runs);
    let base = baseline_runs(runs, baseline);
    let target = Target::choose(metric, &base, given)?;
    let mut series: Vec<TimeSeries> = Vec::new();
    let mut keys: Vec<(String, Option<u64>)> = Vec::new();
    for r in runs {
        let key = (r.codec.clone(), r.momentum_correction.map(f64::to_bits));
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    for (codec, mc) in keys {
        let mut points = Vec::new();
        for link in links_of(runs) {
            let Some(bits) = link_bits(link.as_deref()) else {
                continue;
            };
            let mine: Vec<&RunRecord> = runs
                .iter()
                .filter(|r| {
                    r.link == link
                        && r.codec == codec
                        && r.momentum_correction.map(f64::to_bits) == mc
                })
                .collect();
            if let Some(t) = GroupTime::of(&mine, &target).mean_s {
                points.push((bits as f64, t));
            }
        }
        let name = if mc.is_some() {
            format!("{codec} +mc")
        } else {
            codec
        };
        series.push((name, points));
    }
    Some((target, series))
}

#[cfg(test)]
mod tests {
    use super::super::records::testing::sample_run;
    use super::*;

    fn with_times(mut run: RunRecord, wall: &[f64], eval: &[f64]) -> RunRecord {
        for ((e, &w), &v) in run.epochs.iter_mut().zip(wall).zip(eval) {
            e.wall_s = w;
            e.eval_s = v;
        }
        run
    }

    #[test]
    fn time_to_target_sums_training_time_without_evaluation() {
        let run = with_times(
            sample_run("none", &[0.50, 0.80, 0.86, 0.90], 1000),
            &[10.0, 12.0, 11.0, 9.0],
            &[1.0, 2.0, 1.0, 1.0],
        );
        // 86% is first reached at the end of epoch 3: (10-1) + (12-2) + (11-1) = 29 s.
        assert_eq!(run.time_to(Metric::Accuracy, 86.0), Some(29.0));
        assert_eq!(run.time_to(Metric::Accuracy, 50.0), Some(9.0));
        assert_eq!(run.time_to(Metric::Accuracy, 91.0), None);
    }

    #[test]
    fn default_target_is_the_baselines_mean_minus_half_a_point() {
        let a = sample_run("none", &[0.80, 0.88], 1000);
        let b = sample_run("none", &[0.80, 0.90], 1000);
        let t = Target::choose(Metric::Accuracy, &[&a, &b], None).unwrap();
        assert!((t.value - 88.5).abs() < 1e-9, "{t:?}");
        let given = Target::choose(Metric::Accuracy, &[], Some(70.0)).unwrap();
        assert_eq!(given.value, 70.0);
        assert!(Target::choose(Metric::Accuracy, &[], None).is_none());
    }

    #[test]
    fn a_group_has_a_time_only_when_every_seed_reached_the_target() {
        let fast = with_times(sample_run("q", &[0.9], 10), &[4.0], &[0.0]);
        let slow = with_times(sample_run("q", &[0.9], 10), &[6.0], &[0.0]);
        let never = sample_run("q", &[0.1], 10);
        let target = Target::choose(Metric::Accuracy, &[], Some(85.0)).unwrap();
        let both = GroupTime::of(&[&fast, &slow], &target);
        assert_eq!(both.mean_s, Some(5.0));
        let part = GroupTime::of(&[&fast, &never], &target);
        assert_eq!((part.mean_s, part.reached, part.runs), (None, 1, 2));
        assert_eq!(part.cell(), "not reached (1 of 2)");
        let dense = GroupTime {
            mean_s: Some(20.0),
            reached: 1,
            runs: 1,
        };
        assert_eq!(both.speedup_over(&dense), Some(4.0));
        assert_eq!(part.speedup_over(&dense), None);
    }

    #[test]
    fn the_crossover_is_interpolated_on_log_scales() {
        // Speedup 4 at 100 Mbit/s, 0.25 at 10 Gbit/s: log-symmetric, so 1 at 1 Gbit/s.
        let curve = SpeedupCurve {
            points: vec![
                (Some(100_000_000), Some(4.0), true),
                (Some(10_000_000_000), Some(0.25), true),
            ],
        };
        match curve.crossover() {
            Crossover::Above(b) => assert!((b / 1e9 - 1.0).abs() < 1e-6, "{b}"),
            c => panic!("{c:?}"),
        }
        let everywhere = SpeedupCurve {
            points: vec![(Some(1), Some(2.0), true), (None, Some(1.5), true)],
        };
        assert_eq!(everywhere.crossover(), Crossover::CodecWinsEverywhere);
        let loopback_loses = SpeedupCurve {
            points: vec![
                (Some(1_000_000_000), Some(2.0), true),
                (None, Some(0.8), true),
            ],
        };
        assert_eq!(loopback_loses.crossover(), Crossover::Beyond(1_000_000_000));
        // A codec that never reaches the target loses where the baseline does reach it.
        let never = SpeedupCurve {
            points: vec![(Some(1), None, true), (Some(2), None, true)],
        };
        assert_eq!(never.crossover(), Crossover::BaselineWinsEverywhere);
        let zigzag = SpeedupCurve {
            points: vec![
                (Some(1), Some(2.0), true),
                (Some(2), Some(0.5), true),
                (Some(3), Some(2.0), true),
            ],
        };
        assert_eq!(zigzag.crossover(), Crossover::Unclear);
    }

    #[test]
    fn bandwidths_read_as_people_write_them() {
        assert_eq!(human_bits(1e8), "100 Mbit/s");
        assert_eq!(human_bits(2.5e9), "2.5 Gbit/s");
        assert_eq!(human_bits(1e9), "1 Gbit/s");
    }
}
