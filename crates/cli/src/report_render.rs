//! Markdown report of several runs, in the style of the DGC / QSGD / TernGrad result tables.

use std::fmt::Write;

use crate::plot::{human_bytes, COMPARISON_PNG};
use crate::records::{common_metric, Metric, RunRecord};

/// Renders the report: setup, the command that made it, one table row per run, and the
/// comparison chart (`comparison.png`, expected beside the Markdown file).
///
/// The difference column is in accuracy points, or in percent of the baseline's perplexity;
/// it reads `n/a` when no run used `baseline_codec`.
pub fn render_markdown(runs: &[RunRecord], baseline_codec: &str, command: &str) -> String {
    let metric = common_metric(runs);
    let baseline = runs
        .iter()
        .find(|r| r.codec == baseline_codec)
        .and_then(|r| r.final_metric(metric));
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
    let _ = writeln!(md, "- baseline: `{}`\n", escape(baseline_codec));

    let diff_head = match metric {
        Metric::Accuracy => format!("difference from {} (points)", escape(baseline_codec)),
        Metric::Perplexity => format!("difference from {} (%)", escape(baseline_codec)),
    };
    let _ = writeln!(
        md,
        "| codec | final {} | {diff_head} | bytes per step per worker | compression ratio | total time (s) | comm time (s) |",
        metric.label()
    );
    let _ = writeln!(md, "|---|--:|--:|--:|--:|--:|--:|");
    for run in runs {
        let value = run.final_metric(metric);
        let diff = if run.codec == baseline_codec {
            "(baseline)".to_string()
        } else {
            match (value, baseline) {
                (Some(v), Some(b)) => difference(metric, v, b),
                _ => "n/a".to_string(),
            }
        };
        let _ = writeln!(
            md,
            "| {}{} | {} | {diff} | {} | {:.1}× | {:.1} | {:.1} |",
            escape(&run.codec),
            run.momentum_correction
                .map_or(String::new(), |b| format!(" (momentum correction {b})")),
            value.map_or("n/a".to_string(), |v| format!("{v:.2}")),
            human_bytes(run.bytes_per_step()),
            run.compression_ratio(),
            run.total_wall_s(),
            run.total_comm_s(),
        );
    }
    if baseline.is_none() {
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
    use super::*;
    use crate::records::tests::sample_run;

    #[test]
    fn accuracy_table_numbers() {
        let runs = [
            sample_run("dense", &[0.70, 0.8512], 4_000_000),
            sample_run("topk:0.01", &[0.60, 0.8312], 40_000),
        ];
        let md = render_markdown(&runs, "dense", "gradwire train --codec topk:0.01");
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
        let md = render_markdown(&runs, "dense", "gradwire report");
        assert!(md.contains("final val perplexity"), "{md}");
        assert!(md.contains("| qsgd | 42.00 | +5.0% |"), "{md}");
    }

    #[test]
    fn missing_baseline_says_so() {
        let runs = [sample_run("onebit", &[0.5], 1000)];
        let md = render_markdown(&runs, "dense", "x");
        assert!(md.contains("| onebit | 50.00 | n/a |"), "{md}");
        assert!(
            md.contains("No run used the baseline codec `dense`"),
            "{md}"
        );
    }
}
