//! PNG charts of training runs: quality against epochs and against bytes sent (plotters).
//!
//! Text is drawn with plotters' `ttf` feature, which finds a system sans-serif font through
//! fontconfig (Debian: `fontconfig` and `fonts-dejavu-core`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;

use gradwire_run::report::tta::human_bits;

use crate::records::{common_metric, Metric, RunRecord};

/// The byte counts of charts and progress lines (`crate::plot::human_bytes` for the CLI's
/// modules).
pub use gradwire_run::report::render::human_bytes;

/// Pixel size of every chart.
const SIZE: (u32, u32) = (900, 600);
/// Font family of every label; resolved by fontconfig.
const FONT: &str = "sans-serif";

/// Writes the per-run charts into `out_dir` and returns their paths.
///
/// Always `loss_vs_epoch.png` and `loss_vs_bytes.png`; `accuracy_vs_epoch.png` and
/// `accuracy_vs_bytes.png` (or `perplexity_*` for language models) when the run recorded
/// the metric. Bytes are cumulative per worker, on a log axis when they span decades.
pub fn plot_run(run: &RunRecord, out_dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out_dir)
        .with_context(|| format!("creating plot directory {}", out_dir.display()))?;
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
        draw_chart(&path, &spec, &series).with_context(|| format!("drawing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// A codec spec shortened for a chart: its name and the parameters that set its compression
/// (`topk:ratio=0.01,select=sampled,...` gives `topk ratio=0.01`).
fn short_label(spec: &str) -> String {
    const KEEP: [&str; 6] = ["ratio", "bits", "levels", "tau", "pi", "rank"];
    let (name, params) = spec.split_once(':').unwrap_or((spec, ""));
    let mut out = name.to_string();
    for kv in params.split(',') {
        if KEEP
            .iter()
            .any(|k| kv.split_once('=').is_some_and(|(key, _)| key == *k))
        {
            out.push(' ');
            out.push_str(kv);
        }
    }
    out
}

/// Writes one chart to `out`: final accuracy (or perplexity) against bytes per step per
/// worker (log x), one coloured, labelled point per codec.
pub fn plot_comparison(runs: &[RunRecord], out: &Path) -> Result<()> {
    let metric = common_metric(runs);
    let mut series: Vec<Series> = Vec::new();
    for run in runs {
        let Some(m) = run.final_metric(metric) else {
            continue;
        };
        let p = (run.bytes_per_step(), m);
        let name = short_label(&run.codec);
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
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating plot directory {}", dir.display()))?;
    }
    draw_chart(out, &spec, &series).with_context(|| format!("drawing {}", out.display()))
}

/// Writes the time-to-accuracy chart: for each codec (`series`: its name and, per emulated
/// link, bits per second and training seconds to the target), time (linear) against link
/// speed (log). Links without emulation and runs that missed the target have no point.
pub fn plot_time_to_accuracy(
    series: Vec<(String, Vec<(f64, f64)>)>,
    target: &str,
    out: &Path,
) -> Result<()> {
    let series: Vec<Series> = series
        .into_iter()
        .map(|(name, points)| Series {
            name: short_label(&name),
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
    draw_chart(out, &spec, &series).with_context(|| format!("drawing {}", out.display()))
}

/// The x axis of a chart.
#[derive(Clone, Copy, Debug, PartialEq)]
enum XAxis {
    /// Epoch numbers, linear.
    Epoch,
    /// Byte counts; `log` plots log10 of the count and labels ticks with the count.
    Bytes { log: bool },
    /// Link bandwidths in bits per second, on a log scale.
    Bits,
}

/// A bytes axis, logarithmic when the positive values span at least `min_span` (a ratio).
fn bytes_axis(xs: &[f64], min_span: f64) -> XAxis {
    let pos = xs.iter().copied().filter(|&x| x > 0.0);
    let lo = pos.clone().fold(f64::INFINITY, f64::min);
    let hi = pos.fold(0.0, f64::max);
    XAxis::Bytes {
        log: lo.is_finite() && hi / lo >= min_span,
    }
}

/// How series are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Marks {
    /// Lines with a dot on every point.
    Lines,
    /// Dots, each labelled with its series name.
    LabelledPoints,
}

/// One named series of (x, y) points, x in data units (bytes, not log10).
struct Series {
    /// Legend and point label.
    name: String,
    /// The points.
    points: Vec<(f64, f64)>,
}

/// Everything about a chart but its data.
struct ChartSpec<'a> {
    /// Caption.
    title: &'a str,
    /// Kind of x axis.
    x: XAxis,
    /// X axis description.
    x_desc: &'a str,
    /// Y axis description.
    y_desc: &'a str,
    /// How the series are drawn.
    marks: Marks,
    /// Where the legend goes.
    legend: SeriesLabelPosition,
}

/// Draws `series` as a PNG at `path`.
fn draw_chart(path: &Path, spec: &ChartSpec<'_>, series: &[Series]) -> Result<()> {
    let log = matches!(spec.x, XAxis::Bytes { log: true } | XAxis::Bits);
    let to_x = |x: f64| if log { x.log10() } else { x };
    let series: Vec<(&str, Vec<(f64, f64)>)> = series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .filter(|p| p.0.is_finite() && p.1.is_finite() && (!log || p.0 > 0.0))
                .map(|&(x, y)| (to_x(x), y))
                .collect();
            (s.name.as_str(), pts)
        })
        .collect();
    let all = || series.iter().flat_map(|s| s.1.iter());
    let (x0, x1) = padded_range(all().map(|p| p.0), if log { 0.3 } else { 0.0 });
    let (y0, y1) = padded_range(all().map(|p| p.1), 0.0);

    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(spec.title, (FONT, 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    let x_fmt = |v: &f64| match spec.x {
        XAxis::Epoch => format!("{v:.0}"),
        XAxis::Bytes { log: true } => human_bytes(10f64.powf(*v)),
        XAxis::Bytes { log: false } => human_bytes(*v),
        XAxis::Bits => human_bits(10f64.powf(*v)),
    };
    let x_labels = match spec.x {
        // One tick per whole epoch when there are few, so no fractional epochs appear.
        XAxis::Epoch => ((x1 - x0).ceil() as usize + 1).clamp(2, 10),
        XAxis::Bytes { .. } | XAxis::Bits => 8,
    };
    chart
        .configure_mesh()
        .x_desc(spec.x_desc)
        .y_desc(spec.y_desc)
        .x_labels(x_labels)
        .x_label_formatter(&x_fmt)
        .axis_desc_style((FONT, 18))
        .label_style((FONT, 14))
        .draw()?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let style = color.stroke_width(2);
        if spec.marks == Marks::Lines {
            chart.draw_series(LineSeries::new(pts.iter().copied(), style))?;
        }
        let labelled = spec.marks == Marks::LabelledPoints;
        chart
            .draw_series(pts.iter().map(|&p| {
                let text = if labelled { *name } else { "" };
                EmptyElement::at(p)
                    + Circle::new((0, 0), 5, color.filled())
                    + Text::new(text.to_string(), (8, -16), (FONT, 15))
            }))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(spec.legend.clone())
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Min and max of `vals`, widened by 5% (at least `min_pad` each side, and never empty).
fn padded_range(vals: impl Iterator<Item = f64>, min_pad: f64) -> (f64, f64) {
    let (lo, hi) = vals.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let span = hi - lo;
    let pad = if span > 0.0 {
        (span * 0.05).max(min_pad)
    } else {
        (lo.abs() * 0.1).max(min_pad).max(0.5)
    };
    (lo - pad, hi + pad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_run::report::records::testing::{sample_run, scratch_dir};
    use gradwire_run::report::render::{COMPARISON_PNG, TIME_TO_ACCURACY_PNG};

    #[test]
    fn chart_labels_keep_the_compression_setting() {
        assert_eq!(
            short_label("topk:ratio=0.01,select=sampled,scope=global,values=fp32,ef=true"),
            "topk ratio=0.01"
        );
        assert_eq!(
            short_label("qsgd:bits=4,bucket=512,norm=max,coding=fixed,ef=false"),
            "qsgd bits=4"
        );
        assert_eq!(short_label("none"), "none");
        assert_eq!(short_label("terngrad:clip=2.5,ef=false"), "terngrad");
    }

    const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

    fn assert_png(path: &Path) {
        let bytes = std::fs::read(path).unwrap();
        assert!(bytes.len() > 1000, "{} is too small", path.display());
        assert!(bytes.starts_with(PNG_SIGNATURE), "{}", path.display());
    }

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
    fn bytes_format_and_axis() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1_250_000.0), "1.25 MB");
        assert_eq!(human_bytes(40_000.0), "40.0 kB");
        assert_eq!(bytes_axis(&[1e3, 1e6], 100.0), XAxis::Bytes { log: true });
        assert_eq!(bytes_axis(&[1e3, 4e3], 100.0), XAxis::Bytes { log: false });
        assert_eq!(bytes_axis(&[0.0], 1.0), XAxis::Bytes { log: false });
    }
}
