//! Markdown report of several runs, in the style of the DGC / QSGD / TernGrad result tables.
//! The charts it links to ([`COMPARISON_PNG`], [`TIME_TO_ACCURACY_PNG`]) are drawn by the
//! front end beside the Markdown file.

use std::fmt::Write;

use super::records::{common_metric, Metric, RunRecord};
use super::tta::{human_bits, speedup_cell, GroupTime, SpeedupCurve, Target};

/// File name of the comparison chart that `report` writes beside its Markdown.
pub const COMPARISON_PNG: &str = "comparison.png";

/// File name of a report's time-to-accuracy chart across link speeds.
pub const TIME_TO_ACCURACY_PNG: &str = "time-to-accuracy.png";

/// A byte count in decimal units with three significant figures (`1.25 MB`).
pub fn human_bytes(b: f64) -> String {
    let (v, unit) = [(1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")]
        .into_iter()
        .find(|&(s, _)| b.abs() >= s)
        .map_or((b, "B"), |(s, u)| (b / s, u));
    let digits = if v.abs() >= 100.0 || unit == "B" {
        0
    } else if v.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$} {unit}")
}

/// One table row: the runs of one codec with one momentum setting (one per seed).
struct Row<'a> {
    runs: Vec<&'a RunRecord>,
}

impl Row<'_> {
    fn first(&self) -> &RunRecord {
        self.runs[0]
    }

    /// Mean, lowest and highest final metric over the runs that recorded it.
    fn metric(&self, metric: Metric) -> Option<(f64, f64, f64)> {
        let v: Vec<f64> = self
            .runs
            .iter()
            .filter_map(|r| r.final_metric(metric))
            .collect();
        if v.is_empty() {
            return None;
        }
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((v.iter().sum::<f64>() / v.len() as f64, lo, hi))
    }

    fn mean(&self, f: impl Fn(&RunRecord) -> f64) -> f64 {
        self.runs.iter().map(|r| f(r)).sum::<f64>() / self.runs.len() as f64
    }
}

/// Groups runs into rows by codec, momentum correction and link, in first-seen order.
fn rows(runs: &[RunRecord]) -> Vec<Row<'_>> {
    let mut rows: Vec<Row<'_>> = Vec::new();
    for run in runs {
        let key = |r: &RunRecord| {
            (
                r.codec.clone(),
                r.momentum_correction.map(f64::to_bits),
                r.link.clone(),
            )
        };
        match rows.iter_mut().find(|row| key(row.first()) == key(run)) {
            Some(row) => row.runs.push(run),
            None => rows.push(Row { runs: vec![run] }),
        }
    }
    rows
}

/// Renders the report: setup, the command that made it, one table row per codec and
/// momentum setting, and the comparison chart (`comparison.png`, expected beside the
/// Markdown file).
///
/// Runs of the same codec and momentum setting (several seeds) share a row: it gives the
/// mean and, in parentheses, the lowest and highest value; bytes, ratio and times are
/// means. The difference column compares means, in accuracy points or in percent of the
/// baseline's perplexity; it reads `n/a` when no run used `baseline_codec` (without
/// momentum correction, if such a run exists).
pub fn render_markdown(
    runs: &[RunRecord],
    baseline_codec: &str,
    command: &str,
    target: Option<f64>,
) -> String {
    let metric = common_metric(runs);
    let mut md = String::new();
    let title = match runs.first() {
        Some(r) => format!("{} on {}", r.model, r.dataset),
        None => "no runs".to_string(),
    };
    // Writing to a String cannot fail, so the fmt::Results below are ignored.
    let _ = writeln!(md, "# gradwire report: {title}\n");
    let _ = writeln!(md, "Made by:\n\n```sh\n{command}\n```\n");
    let _ = writeln!(md, "- model: {}", distinct(runs, |r| r.model.clone()));
    let _ = writeln!(md, "- data set: {}", distinct(runs, |r| r.dataset.clone()));
    let _ = writeln!(
        md,
        "- workers: {}",
        distinct(runs, |r| r.workers.to_string())
    );
    let _ = writeln!(
        md,
        "- epochs: {}",
        distinct(runs, |r| r.epochs.len().to_string())
    );
    let _ = writeln!(
        md,
        "- steps per epoch: {}",
        distinct(runs, |r| r.steps_per_epoch.to_string())
    );
    if runs.iter().any(|r| r.seed.is_some()) {
        let _ = writeln!(
            md,
            "- seeds: {}",
            distinct(runs, |r| r.seed.map_or("?".into(), |s| s.to_string()))
        );
    }
    let _ = writeln!(md, "- baseline: `{}`\n", escape(baseline_codec));
    if rows(runs).iter().any(|r| r.runs.len() > 1) {
        let _ = writeln!(
            md,
            "A row with several runs (seeds) gives the mean and, in parentheses, the lowest and \
             highest value; the other columns are means.\n"
        );
    }
    let base_runs = baseline_runs(runs, baseline_codec);
    let target = Target::choose(metric, &base_runs, target);
    if let Some(t) = &target {
        let _ = writeln!(
            md,
            "Time to target: training time (wall-clock without evaluation) until the end of the \
             first epoch at {} or better, {}; speedup: the baseline's time over the row's, \
             over the same link.\n",
            t.label(),
            t.how
        );
    }
    let links = links_of(runs);
    if links.len() == 1 && links[0].is_none() {
        table(&mut md, runs, baseline_codec, target.as_ref());
    } else {
        for link in &links {
            let subset: Vec<RunRecord> = runs.iter().filter(|r| &r.link == link).cloned().collect();
            let _ = writeln!(md, "## Over {}\n", link_title(link.as_deref()));
            table(&mut md, &subset, baseline_codec, target.as_ref());
            md.push('\n');
        }
        if let Some(t) = &target {
            across_links(&mut md, runs, baseline_codec, t, &links);
        }
    }
    if base_runs.is_empty() {
        let _ = writeln!(
            md,
            "\nNo run used the baseline codec `{}`, so there are no differences.",
            escape(baseline_codec)
        );
    }
    let _ = writeln!(
        md,
        "\n![final {} against bytes per step per worker]({COMPARISON_PNG})",
        metric.label()
    );
    md
}

/// The runs of the baseline codec: without momentum correction where such runs exist.
pub fn baseline_runs<'a>(runs: &'a [RunRecord], baseline_codec: &str) -> Vec<&'a RunRecord> {
    let all: Vec<&RunRecord> = runs.iter().filter(|r| r.codec == baseline_codec).collect();
    let plain: Vec<&RunRecord> = all
        .iter()
        .copied()
        .filter(|r| r.momentum_correction.is_none())
        .collect();
    if plain.is_empty() {
        all
    } else {
        plain
    }
}

/// The distinct links of the runs (`None`: no emulation), slowest first, loopback last.
pub fn links_of(runs: &[RunRecord]) -> Vec<Option<String>> {
    let mut links: Vec<Option<String>> = Vec::new();
    for r in runs {
        if !links.contains(&r.link) {
            links.push(r.link.clone());
        }
    }
    links.sort_by_key(|l| link_bits(l.as_deref()).unwrap_or(u64::MAX));
    links
}

/// The bandwidth of a recorded link in bits per second; `None` without emulation (or for a
/// label that does not parse).
pub fn link_bits(link: Option<&str>) -> Option<u64> {
    let cfg: gradwire_transport::link::LinkConfig = link?.parse().ok()?;
    Some(cfg.default.bandwidth.bits_per_sec())
}

/// A link as a section title.
fn link_title(link: Option<&str>) -> String {
    match link {
        None => "loopback, no link emulation".into(),
        Some(l) => match link_bits(Some(l)) {
            Some(b) => format!(
                "an emulated {} link (`{}`)",
                human_bits(b as f64),
                escape(l)
            ),
            None => format!("the link `{}`", escape(l)),
        },
    }
}

/// One table of final metrics, bytes, times and (with a target) time to target.
fn table(md: &mut String, runs: &[RunRecord], baseline_codec: &str, target: Option<&Target>) {
    let metric = common_metric(runs);
    let rows = rows(runs);
    let baseline_row = rows
        .iter()
        .filter(|r| r.first().codec == baseline_codec)
        .min_by_key(|r| r.first().momentum_correction.is_some());
    let baseline = baseline_row.and_then(|r| r.metric(metric)).map(|m| m.0);
    let base_time = match (baseline_row, target) {
        (Some(b), Some(t)) => Some(GroupTime::of(&b.runs, t)),
        _ => None,
    };
    let diff_head = match metric {
        Metric::Accuracy => format!("difference from {} (points)", escape(baseline_codec)),
        Metric::Perplexity => format!("difference from {} (%)", escape(baseline_codec)),
    };
    let tta_head = match target {
        Some(t) => format!(" time to {} (s) | speedup |", t.label()),
        None => String::new(),
    };
    let _ = writeln!(
        md,
        "| codec | final {} | {diff_head} | bytes per step per worker | compression ratio | total time (s) | comm time (s) |{tta_head}",
        metric.label()
    );
    let _ = writeln!(
        md,
        "|---|--:|--:|--:|--:|--:|--:|{}",
        if target.is_some() { "--:|--:|" } else { "" }
    );
    for row in &rows {
        let run = row.first();
        let value = row.metric(metric);
        let is_baseline = baseline_row.is_some_and(|b| std::ptr::eq(b.first(), run));
        let diff = if is_baseline {
            "(baseline)".to_string()
        } else {
            match (value, baseline) {
                (Some((v, _, _)), Some(b)) => difference(metric, v, b),
                _ => "n/a".to_string(),
            }
        };
        let shown = match value {
            None => "n/a".to_string(),
            Some((v, _, _)) if row.runs.len() == 1 => format!("{v:.2}"),
            Some((v, lo, hi)) => format!("{v:.2} ({lo:.2}–{hi:.2})"),
        };
        let tta = match target {
            Some(t) => {
                let time = GroupTime::of(&row.runs, t);
                let speedup = base_time.and_then(|b| time.speedup_over(&b));
                format!(" {} | {} |", time.cell(), speedup_cell(speedup))
            }
            None => String::new(),
        };
        let _ = writeln!(
            md,
            "| {}{}{} | {shown} | {diff} | {} | {:.1}× | {:.1} | {:.1} |{tta}",
            escape(&run.codec),
            run.momentum_correction
                .map_or(String::new(), |b| format!(" (momentum correction {b})")),
            if row.runs.len() > 1 {
                format!(" ×{} runs", row.runs.len())
            } else {
                String::new()
            },
            human_bytes(row.mean(RunRecord::bytes_per_step)),
            row.mean(RunRecord::compression_ratio),
            row.mean(RunRecord::total_wall_s),
            row.mean(RunRecord::total_comm_s),
        );
    }
}

/// One row per codec across the links: time to target and speedup at each, and the speed
/// above which the baseline wins.
fn across_links(
    md: &mut String,
    runs: &[RunRecord],
    baseline_codec: &str,
    target: &Target,
    links: &[Option<String>],
) {
    let _ = writeln!(md, "## Time to {} against link speed\n", target.label());
    let _ = writeln!(
        md,
        "Each cell: training seconds to the target (speedup over `{}` over the same link). \
         The last column is where the baseline starts to win, interpolated on log scales \
         between the measured speeds.\n",
        escape(baseline_codec)
    );
    let mut head = String::from("| codec |");
    let mut rule = String::from("|---|");
    for l in links {
        let name = match link_bits(l.as_deref()) {
            Some(b) => human_bits(b as f64),
            None if l.is_none() => "loopback".into(),
            None => escape(l.as_deref().unwrap_or_default()),
        };
        head.push_str(&format!(" {name} |"));
        rule.push_str("--:|");
    }
    let _ = writeln!(md, "{head} crossover |\n{rule}---|");
    let per_link: Vec<Vec<RunRecord>> = links
        .iter()
        .map(|l| runs.iter().filter(|r| &r.link == l).cloned().collect())
        .collect();
    let mut keys: Vec<(String, Option<f64>)> = Vec::new();
    for r in runs {
        let key = (r.codec.clone(), r.momentum_correction);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    for key in keys {
        let mut line = format!(
            "| {}{} |",
            escape(&key.0),
            key.1
                .map_or(String::new(), |b| format!(" (momentum correction {b})"))
        );
        let mut curve = SpeedupCurve { points: Vec::new() };
        for (l, subset) in links.iter().zip(&per_link) {
            let mine: Vec<&RunRecord> = subset
                .iter()
                .filter(|r| r.codec == key.0 && r.momentum_correction == key.1)
                .collect();
            let base: Vec<&RunRecord> = baseline_runs(subset, baseline_codec);
            if mine.is_empty() {
                line.push_str(" – |");
                continue;
            }
            let time = GroupTime::of(&mine, target);
            let base_time = GroupTime::of(&base, target);
            let speedup = time.speedup_over(&base_time);
            curve
                .points
                .push((link_bits(l.as_deref()), speedup, base_time.mean_s.is_some()));
            line.push_str(&format!(" {} ({}) |", time.cell(), speedup_cell(speedup)));
        }
        let cross = if key.0 == baseline_codec && key.1.is_none() {
            "(baseline)".to_string()
        } else {
            curve.crossover().cell()
        };
        let _ = writeln!(md, "{line} {cross} |");
    }
    let _ = writeln!(
        md,
        "\n![time to {} against link speed]({TIME_TO_ACCURACY_PNG})",
        target.label()
    );
}

/// `value` against `base`: signed accuracy points, or signed percent of the base perplexity.
fn difference(metric: Metric, value: f64, base: f64) -> String {
    match metric {
        Metric::Accuracy => format!("{:+.2}", value - base),
        Metric::Perplexity if base != 0.0 => format!("{:+.1}%", (value - base) / base * 100.0),
        Metric::Perplexity => "n/a".to_string(),
    }
}

/// The distinct values of `f` over the runs, in first-seen order, joined by ", ".
fn distinct(runs: &[RunRecord], f: impl Fn(&RunRecord) -> String) -> String {
    let mut seen: Vec<String> = Vec::new();
    for v in runs.iter().map(f) {
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    seen.join(", ")
}

/// Escapes the characters that would break a Markdown table cell.
fn escape(s: &str) -> String {
    s.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::super::records::testing::sample_run;
    use super::*;

    #[test]
    fn accuracy_table_numbers() {
        let runs = [
            sample_run("dense", &[0.70, 0.8512], 4_000_000),
            sample_run("topk:0.01", &[0.60, 0.8312], 40_000),
        ];
        let md = render_markdown(&runs, "dense", "gradwire train --codec topk:0.01", None);
        assert!(md.contains("gradwire train --codec topk:0.01"), "{md}");
        assert!(md.contains("- workers: 4"), "{md}");
        assert!(md.contains("- epochs: 2"), "{md}");
        // 200 steps, 8 MB in all: 40 kB per step; ratio 4e6 / 4e6 = 1.
        assert!(
            md.contains("| dense | 85.12 | (baseline) | 40.0 kB | 1.0× | 20.0 | 6.0 |"),
            "{md}"
        );
        // 83.12 - 85.12 = -2.00 points; 80 kB / 200 steps = 400 B; ratio 100.
        assert!(
            md.contains("| topk:0.01 | 83.12 | -2.00 | 400 B | 100.0× | 20.0 | 6.0 |"),
            "{md}"
        );
        assert!(md.contains("](comparison.png)"), "{md}");
    }

    #[test]
    fn perplexity_difference_is_percent() {
        let mut runs = [
            sample_run("dense", &[0.0], 1000),
            sample_run("qsgd", &[0.0], 100),
        ];
        for (run, ppl) in runs.iter_mut().zip([40.0, 42.0]) {
            run.epochs[0].test_accuracy = None;
            run.epochs[0].val_perplexity = Some(ppl);
        }
        let md = render_markdown(&runs, "dense", "gradwire report", None);
        assert!(md.contains("final val perplexity"), "{md}");
        assert!(md.contains("| qsgd | 42.00 | +5.0% |"), "{md}");
    }

    #[test]
    fn seeds_share_a_row_with_mean_and_range_and_mc_rows_stay_apart() {
        let mut runs = vec![
            sample_run("dense", &[0.80], 4_000_000),
            sample_run("dense", &[0.82], 4_000_000),
            sample_run("qsgd", &[0.70], 1_000_000),
            sample_run("qsgd", &[0.74], 3_000_000),
            sample_run("qsgd", &[0.78], 1_000_000),
            sample_run("qsgd", &[0.79], 1_000_000),
        ];
        runs[5].momentum_correction = Some(0.9);
        for (i, r) in runs.iter_mut().enumerate() {
            r.seed = Some(i as u64);
        }
        let md = render_markdown(&runs, "dense", "gradwire report --seeds 1,2,3", None);
        // dense: mean 81, range 80-82; baseline.
        assert!(
            md.contains("| dense ×2 runs | 81.00 (80.00–82.00) | (baseline) |"),
            "{md}"
        );
        // qsgd paper rows: mean (70+74+78)/3 = 74, -7 points; bytes mean 5e6/3/100 steps.
        assert!(
            md.contains("| qsgd ×3 runs | 74.00 (70.00–78.00) | -7.00 | 16.7 kB |"),
            "{md}"
        );
        // The momentum-correction run keeps its own row, against the same baseline mean.
        assert!(
            md.contains("| qsgd (momentum correction 0.9) | 79.00 | -2.00 | 10.0 kB |"),
            "{md}"
        );
        assert!(md.contains("- seeds: 0, 1, 2, 3, 4, 5"), "{md}");
    }

    #[test]
    fn missing_baseline_says_so() {
        let runs = [sample_run("onebit", &[0.5], 1000)];
        let md = render_markdown(&runs, "dense", "x", None);
        assert!(md.contains("| onebit | 50.00 | n/a |"), "{md}");
        assert!(
            md.contains("No run used the baseline codec `dense`"),
            "{md}"
        );
    }

    #[test]
    fn links_get_a_table_each_and_a_time_to_target_row_per_codec() {
        // dense reaches 88% in every epoch's second half; the codec is faster on the slow
        // link and slower on the fast one.
        let run = |codec: &str, link: &str, wall: [f64; 2]| {
            let mut r = sample_run(codec, &[0.70, 0.90], 1000);
            r.link = Some(link.to_string());
            for (e, w) in r.epochs.iter_mut().zip(wall) {
                e.wall_s = w;
                e.eval_s = 1.0;
            }
            r
        };
        let runs = [
            run("dense", "100mbit", [41.0, 41.0]),
            run("topk:ratio=0.01", "100mbit", [11.0, 11.0]),
            run("dense", "10gbit", [11.0, 11.0]),
            run("topk:ratio=0.01", "10gbit", [41.0, 41.0]),
        ];
        let md = render_markdown(
            &runs,
            "dense",
            "gradwire report --link 100mbit --link 10gbit",
            None,
        );
        // The target: dense's 90% minus half a point, reached at the end of epoch 2.
        assert!(md.contains("at 89.50% or better"), "{md}");
        assert!(md.contains("## Over an emulated 100 Mbit/s link"), "{md}");
        assert!(md.contains("## Over an emulated 10 Gbit/s link"), "{md}");
        // Slow link: dense 80 s, top-k 20 s, 4x; fast link: the reverse.
        assert!(md.contains("| 80.0 | 1.00× |"), "{md}");
        assert!(md.contains("| 20.0 | 4.00× |"), "{md}");
        assert!(md.contains("| 80.0 | 0.25× |"), "{md}");
        assert!(
            md.contains("| topk:ratio=0.01 | 20.0 (4.00×) | 80.0 (0.25×) | baseline faster above ~1 Gbit/s |"),
            "{md}"
        );
        assert!(md.contains("(time-to-accuracy.png)"), "{md}");
    }
}
