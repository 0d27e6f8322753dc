//! The time-to-accuracy chart of a report: per codec, training seconds to the target
//! against emulated link speed ([`plot_time_to_accuracy`]).

use std::path::Path;

use plotters::prelude::SeriesLabelPosition;

use super::chart::{draw_chart, ChartSpec, Marks, Series, XAxis};
use super::error::PlotError;
use super::units::codec_label;

/// Writes the time-to-accuracy chart to `out`: for each codec (`series`: its spec and, per
/// emulated link, bits per second and training seconds to the target), time (linear)
/// against link speed (log). `target` is the target as the title says it (`88.00%`). Links
/// without emulation and runs that missed the target have no point.
pub fn plot_time_to_accuracy(
    series: Vec<(String, Vec<(f64, f64)>)>,
    target: &str,
    out: &Path,
) -> Result<(), PlotError> {
    let series: Vec<Series> = series
        .into_iter()
        .map(|(name, points)| Series {
            name: codec_label(&name),
            points,
        })
        .collect();
    let title = format!("training time to {target} against link speed");
    let spec = ChartSpec {
        title: &title,
        x: XAxis::Bits,
        x_desc: "emulated link bandwidth",
        y_desc: "seconds to the target",
        marks: Marks::Lines,
        legend: SeriesLabelPosition::UpperRight,
    };
    draw_chart(out, &spec, &series)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_png, scratch_dir};
    use super::*;
    use gradwire_run::report::render::TIME_TO_ACCURACY_PNG;

    #[test]
    fn time_to_accuracy_plot_is_png() {
        let dir = scratch_dir("plot-tta");
        let out = dir.join(TIME_TO_ACCURACY_PNG);
        let series = vec![
            (
                "none".to_string(),
                vec![(1e8, 400.0), (1e9, 60.0), (1e10, 20.0)],
            ),
            (
                "dgc:ratio=0.001".to_string(),
                vec![(1e8, 40.0), (1e9, 30.0), (1e10, 29.0)],
            ),
            ("threshold".to_string(), vec![]),
        ];
        plot_time_to_accuracy(series, "88.00%", &out).unwrap();
        assert_png(&out);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_unwritable_chart_is_a_draw_error() {
        let dir = scratch_dir("plot-tta-blocked");
        let out = dir.join("missing").join(TIME_TO_ACCURACY_PNG);
        let series = vec![("none".to_string(), vec![(1e8, 400.0), (1e9, 60.0)])];
        let err = plot_time_to_accuracy(series, "88.00%", &out).unwrap_err();
        match err {
            PlotError::Draw { file, .. } => assert_eq!(file, out),
            other => panic!("{other}"),
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
