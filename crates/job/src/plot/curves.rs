//! One run's learning curves: training loss, and accuracy (or perplexity) where recorded,
//! against epochs and against cumulative bytes sent per worker ([`plot_run`]).

use std::path::{Path, PathBuf};

use plotters::prelude::SeriesLabelPosition;

use gradwire_run::report::records::{Metric, RunRecord};

use super::chart::{bytes_axis, draw_chart, ChartSpec, Marks, Series, XAxis};
use super::error::PlotError;

/// Writes the per-run charts into `out_dir` (created if missing) and returns their paths.
///
/// Always `loss_vs_epoch.png` and `loss_vs_bytes.png`; `accuracy_vs_epoch.png` and
/// `accuracy_vs_bytes.png` (or `perplexity_*` for language models) when the run recorded
/// the metric. Bytes are cumulative per worker, on a log axis when they span decades.
pub fn plot_run(run: &RunRecord, out_dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
    std::fs::create_dir_all(out_dir).map_err(|source| PlotError::CreateDir {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let cum = run.cumulative_bytes();
    let x_bytes = bytes_axis(&cum.iter().map(|&b| b as f64).collect::<Vec<_>>(), 100.0);
    let bytes_desc = "bytes sent per worker (cumulative)";
    let loss_epoch: Vec<_> = run
        .epochs
        .iter()
        .map(|e| (e.epoch as f64, e.train_loss))
        .collect();
    let loss_bytes: Vec<_> = run
        .epochs
        .iter()
        .zip(&cum)
        .map(|(e, &b)| (b as f64, e.train_loss))
        .collect();
    let metric = run.metric();
    let m_epoch: Vec<_> = run
        .epochs
        .iter()
        .filter_map(|e| metric.of(e).map(|m| (e.epoch as f64, m)))
        .collect();
    let m_bytes: Vec<_> = run
        .epochs
        .iter()
        .zip(&cum)
        .filter_map(|(e, &b)| metric.of(e).map(|m| (b as f64, m)))
        .collect();
    let (m_name, m_legend) = match metric {
        Metric::Accuracy => ("accuracy", SeriesLabelPosition::LowerRight),
        Metric::Perplexity => ("perplexity", SeriesLabelPosition::UpperRight),
    };
    let title = |what: &str| format!("{what}: {} on {} ({})", run.model, run.dataset, run.codec);
    let mut charts = vec![
        (
            "loss_vs_epoch.png".to_string(),
            title("training loss"),
            XAxis::Epoch,
            "train loss",
            loss_epoch,
            SeriesLabelPosition::UpperRight,
        ),
        (
            "loss_vs_bytes.png".to_string(),
            title("training loss"),
            x_bytes,
            "train loss",
            loss_bytes,
            SeriesLabelPosition::UpperRight,
        ),
    ];
    if !m_epoch.is_empty() {
        charts.push((
            format!("{m_name}_vs_epoch.png"),
            title(m_name),
            XAxis::Epoch,
            metric.label(),
            m_epoch,
            m_legend.clone(),
        ));
        charts.push((
            format!("{m_name}_vs_bytes.png"),
            title(m_name),
            x_bytes,
            metric.label(),
            m_bytes,
            m_legend,
        ));
    }
    let mut written = Vec::with_capacity(charts.len());
    for (file, title, x, y_desc, points, legend) in charts {
        let path = out_dir.join(file);
        let x_desc = match x {
            XAxis::Epoch => "epoch",
            XAxis::Bytes { .. } | XAxis::Bits => bytes_desc,
        };
        let spec = ChartSpec {
            title: &title,
            x,
            x_desc,
            y_desc,
            marks: Marks::Lines,
            legend,
        };
        let series = [Series {
            name: run.codec.clone(),
            points,
        }];
        draw_chart(&path, &spec, &series)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_png, sample_run, scratch_dir};
    use super::*;

    #[test]
    fn run_plots_are_pngs() {
        let dir = scratch_dir("plot-run");
        let run = sample_run("topk:0.01", &[0.6, 0.75, 0.8, 0.82], 40_000);
        let files = plot_run(&run, &dir).unwrap();
        let names: Vec<_> = files
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "loss_vs_epoch.png",
                "loss_vs_bytes.png",
                "accuracy_vs_epoch.png",
                "accuracy_vs_bytes.png"
            ]
        );
        files.iter().for_each(|p| assert_png(p));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_uncreatable_directory_is_a_typed_error() {
        let dir = scratch_dir("plot-run-blocked");
        let file = dir.join("not-a-dir");
        std::fs::write(&file, b"x").unwrap();
        let run = sample_run("none", &[0.5], 1_000);
        let err = plot_run(&run, &file.join("plots")).unwrap_err();
        assert!(matches!(err, PlotError::CreateDir { .. }), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
