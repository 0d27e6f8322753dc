//! The one chart every line and point plot is: a titled PNG of named (x, y) series, its x
//! axis epochs, byte counts or link bandwidths (log when they span decades), drawn by
//! [`draw_chart`].

use std::path::Path;

use plotters::prelude::*;

use super::error::PlotError;
use super::units::{human_bits, human_bytes};

/// Pixel size of every chart.
const SIZE: (u32, u32) = (900, 600);
/// Font family of every label; resolved by fontconfig.
pub(crate) const FONT: &str = "sans-serif";

/// The x axis of a chart.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum XAxis {
    /// Epoch numbers, linear.
    Epoch,
    /// Byte counts; `log` plots log10 of the count and labels ticks with the count.
    Bytes {
        /// Whether the axis is logarithmic.
        log: bool,
    },
    /// Link bandwidths in bits per second, on a log scale.
    Bits,
}

/// A bytes axis, logarithmic when the positive values span at least `min_span` (a ratio).
pub(crate) fn bytes_axis(xs: &[f64], min_span: f64) -> XAxis {
    let pos = xs.iter().copied().filter(|&x| x > 0.0);
    let lo = pos.clone().fold(f64::INFINITY, f64::min);
    let hi = pos.fold(0.0, f64::max);
    XAxis::Bytes {
        log: lo.is_finite() && hi / lo >= min_span,
    }
}

/// How series are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Marks {
    /// Lines with a dot on every point.
    Lines,
    /// Dots, each labelled with its series name.
    LabelledPoints,
}

/// One named series of (x, y) points, x in data units (bytes, not log10).
pub(crate) struct Series {
    /// Legend and point label.
    pub(crate) name: String,
    /// The points.
    pub(crate) points: Vec<(f64, f64)>,
}

/// Everything about a chart but its data.
pub(crate) struct ChartSpec<'a> {
    /// Caption.
    pub(crate) title: &'a str,
    /// Kind of x axis.
    pub(crate) x: XAxis,
    /// X axis description.
    pub(crate) x_desc: &'a str,
    /// Y axis description.
    pub(crate) y_desc: &'a str,
    /// How the series are drawn.
    pub(crate) marks: Marks,
    /// Where the legend goes.
    pub(crate) legend: SeriesLabelPosition,
}

/// What plotters' bitmap drawing returns.
pub(crate) type DrawResult =
    Result<(), DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>>;

/// plotters' error while drawing `file`, as a [`PlotError::Draw`].
pub(crate) fn draw_error(file: &Path, e: impl std::fmt::Display) -> PlotError {
    PlotError::Draw {
        file: file.to_path_buf(),
        message: e.to_string(),
    }
}

/// Draws `series` as a PNG at `path`.
pub(crate) fn draw_chart(
    path: &Path,
    spec: &ChartSpec<'_>,
    series: &[Series],
) -> Result<(), PlotError> {
    draw(path, spec, series).map_err(|e| draw_error(path, e))
}

/// [`draw_chart`] with plotters' own error.
fn draw(path: &Path, spec: &ChartSpec<'_>, series: &[Series]) -> DrawResult {
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

    #[test]
    fn bytes_axis_is_log_when_the_counts_span_decades() {
        assert_eq!(bytes_axis(&[1e3, 1e6], 100.0), XAxis::Bytes { log: true });
        assert_eq!(bytes_axis(&[1e3, 4e3], 100.0), XAxis::Bytes { log: false });
        assert_eq!(bytes_axis(&[0.0], 1.0), XAxis::Bytes { log: false });
    }

    #[test]
    fn ranges_are_padded_and_never_empty() {
        assert_eq!(padded_range(std::iter::empty(), 0.0), (0.0, 1.0));
        assert_eq!(padded_range([2.0].into_iter(), 0.0), (1.5, 2.5));
        let (lo, hi) = padded_range([0.0, 10.0].into_iter(), 0.0);
        assert!((lo + 0.5).abs() < 1e-12 && (hi - 10.5).abs() < 1e-12);
    }
}
