//! The comparison chart of a report: each run's final accuracy (or perplexity) against the
//! bytes it sent per step per worker, one coloured, labelled point per codec
//! ([`plot_comparison`]).

use std::path::Path;

use plotters::prelude::SeriesLabelPosition;

use gradwire_run::report::records::{common_metric, Metric, RunRecord};

use super::chart::{bytes_axis, draw_chart, ChartSpec, Marks, Series};
use super::error::PlotError;
use super::units::codec_label;

/// Writes one chart to `out` (its directory created if missing): final accuracy (or
/// perplexity) against bytes per step per worker (log x when they span a decade or more),
/// one coloured, labelled point per codec. Runs without the final metric have no point.
pub fn plot_comparison(runs: &[RunRecord], out: &Path) -> Result<(), PlotError> {
    let metric = common_metric(runs);
    let mut series: Vec<Series> = Vec::new();
    for run in runs {
        let Some(m) = run.final_metric(metric) else {
            continue;
        };
        let p = (run.bytes_per_step(), m);
        let name = codec_label(&run.codec);
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push(p),
            None => series.push(Series {
                name,
                points: vec![p],
            }),
        }
    }
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    let title = match runs.first() {
        Some(r) => format!(
            "final {} vs bytes: {} on {}",
            metric.label(),
            r.model,
            r.dataset
        ),
        None => format!("final {} vs bytes", metric.label()),
    };
    let spec = ChartSpec {
        title: &title,
        x: bytes_axis(&xs, 1.0),
        x_desc: "bytes sent per step per worker",
        y_desc: &format!("final {}", metric.label()),
        marks: Marks::LabelledPoints,
        legend: match metric {
            Metric::Accuracy => SeriesLabelPosition::LowerRight,
            Metric::Perplexity => SeriesLabelPosition::UpperRight,
        },
    };
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| PlotError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    draw_chart(out, &spec, &series)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_png, sample_run, scratch_dir};
    use super::*;
    use gradwire_run::report::render::COMPARISON_PNG;

    #[test]
    fn comparison_plot_is_png() {
        let dir = scratch_dir("plot-cmp");
        let runs = [
            sample_run("dense", &[0.7, 0.85], 4_000_000),
            sample_run("onebit", &[0.68, 0.84], 125_000),
            sample_run("topk:0.01", &[0.65, 0.83], 80_000),
        ];
        let out = dir.join(COMPARISON_PNG);
        plot_comparison(&runs, &out).unwrap();
        assert_png(&out);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
