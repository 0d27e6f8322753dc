//! One training step of a merged timeline (Chrome trace JSON from `train --timeline`) drawn
//! as a PNG ([`plot_step`]): per rank a compute lane (FORWARD, BACKWARD, UPDATE) and a
//! communication lane (NEGOTIATE, QUEUE, FUSE, ENCODE, WIRE, DECODE, UNFUSE), on one time
//! axis, so overlap and the rank that arrived last are seen at a glance.
//!
//! The trace is untrusted input: it is read up to [`MAX_TRACE_BYTES`], events that are not
//! complete spans with a rank, a name and finite times are skipped, and at most
//! [`MAX_DRAWN_RANKS`] ranks are drawn; anything else is a [`PlotError`].

use std::io::Read;
use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

use super::chart::{draw_error, DrawResult};
use super::error::PlotError;

/// The largest trace file read, in bytes (512 MiB).
pub const MAX_TRACE_BYTES: u64 = 512 << 20;

/// The most ranks one step chart has lanes for (each rank adds 70 pixels of height).
pub const MAX_DRAWN_RANKS: usize = 256;

/// A complete span of the trace.
#[derive(Debug, Clone)]
struct Event {
    /// The rank (the trace's `pid`).
    rank: usize,
    /// The phase (the trace's `name`).
    phase: String,
    /// Start, in microseconds.
    start_us: f64,
    /// End, in microseconds.
    end_us: f64,
}

/// The phases drawn in the compute lane; every other phase goes in the communication lane.
const COMPUTE: [&str; 3] = ["FORWARD", "BACKWARD", "UPDATE"];
/// The phases drawn, in legend order, with their colours.
const PHASES: [(&str, RGBColor); 10] = [
    ("FORWARD", RGBColor(66, 133, 244)),
    ("BACKWARD", RGBColor(25, 78, 160)),
    ("UPDATE", RGBColor(120, 190, 255)),
    ("NEGOTIATE", RGBColor(251, 188, 5)),
    ("QUEUE", RGBColor(200, 200, 200)),
    ("FUSE", RGBColor(171, 71, 188)),
    ("ENCODE", RGBColor(255, 112, 67)),
    ("WIRE", RGBColor(52, 168, 83)),
    ("DECODE", RGBColor(233, 30, 99)),
    ("UNFUSE", RGBColor(141, 110, 99)),
];

/// The file at `path`, read up to [`MAX_TRACE_BYTES`].
fn read_bounded(path: &Path) -> Result<Vec<u8>, PlotError> {
    let io = |source| PlotError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(MAX_TRACE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_TRACE_BYTES {
        return Err(PlotError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_TRACE_BYTES,
        });
    }
    Ok(bytes)
}

/// The complete spans (`"ph": "X"`) of a trace; `None` when it has no `traceEvents` array.
fn events(trace: &Value) -> Option<Vec<Event>> {
    let list = trace.get("traceEvents")?.as_array()?;
    Some(
        list.iter()
            .filter(|e| e.get("ph").and_then(Value::as_str) == Some("X"))
            .filter_map(|e| {
                let ts = e.get("ts")?.as_f64()?;
                let end = ts + e.get("dur")?.as_f64()?;
                (ts.is_finite() && end.is_finite()).then_some(())?;
                Some(Event {
                    rank: usize::try_from(e.get("pid")?.as_u64()?).ok()?,
                    phase: e.get("name")?.as_str()?.to_string(),
                    start_us: ts,
                    end_us: end,
                })
            })
            .collect(),
    )
}

/// The window of one whole step: from one of rank 0's FORWARD starts to its next (the
/// second-to-last pair, so the step is complete); the whole trace when it has fewer.
fn step_window(ev: &[Event]) -> Option<(f64, f64)> {
    let mut starts: Vec<f64> = ev
        .iter()
        .filter(|e| e.rank == 0 && e.phase == "FORWARD")
        .map(|e| e.start_us)
        .collect();
    starts.sort_by(f64::total_cmp);
    if starts.len() >= 3 {
        let k = starts.len() - 2;
        return Some((starts[k - 1], starts[k]));
    }
    let lo = ev.iter().map(|e| e.start_us).min_by(f64::total_cmp)?;
    let hi = ev.iter().map(|e| e.end_us).max_by(f64::total_cmp)?;
    Some((lo, hi))
}

/// Draws one step of the merged trace at `trace` into `png`.
///
/// The step is the last complete one of rank 0 (between its second-to-last and last
/// FORWARD starts), or the whole trace when rank 0 has fewer than three.
pub fn plot_step(trace: &Path, png: &Path) -> Result<(), PlotError> {
    let bytes = read_bounded(trace)?;
    let doc: Value = serde_json::from_slice(&bytes).map_err(|source| PlotError::Parse {
        path: trace.to_path_buf(),
        source,
    })?;
    let ev = events(&doc).ok_or_else(|| PlotError::NoTraceEvents {
        path: trace.to_path_buf(),
    })?;
    let no_spans = || PlotError::NoSpans {
        path: trace.to_path_buf(),
    };
    let (t0, t1) = step_window(&ev).ok_or_else(no_spans)?;
    if !(t1 - t0).is_finite() {
        return Err(no_spans());
    }
    let ranks = ev
        .iter()
        .map(|e| e.rank.saturating_add(1))
        .max()
        .unwrap_or(1);
    if ranks > MAX_DRAWN_RANKS {
        return Err(PlotError::TooManyRanks {
            path: trace.to_path_buf(),
            ranks,
            limit: MAX_DRAWN_RANKS,
        });
    }
    draw_step(&ev, (t0, t1), ranks, png).map_err(|e| draw_error(png, e))
}

/// Draws the spans of `ev` within `(t0, t1)` (microseconds), two lanes for each of `ranks`
/// ranks, into `png`.
fn draw_step(ev: &[Event], (t0, t1): (f64, f64), ranks: usize, png: &Path) -> DrawResult {
    let span_ms = ((t1 - t0) / 1e3).max(1e-3);
    // At most MAX_DRAWN_RANKS ranks, so the height fits a u32.
    let height = 120 + 70 * ranks as u32;
    let root = BitMapBackend::new(png, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("one training step, {ranks} ranks ({span_ms:.1} ms)"),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(140)
        // Lane k is centred on y = k; the right quarter is left free for the legend.
        .build_cartesian_2d(0.0..span_ms * 1.3, -0.5..(2 * ranks) as f64 - 0.5)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(2 * ranks)
        .y_label_formatter(&|y| {
            let lane = y.round().max(0.0) as usize;
            let rank = lane / 2;
            if lane.is_multiple_of(2) {
                format!("rank {rank} compute")
            } else {
                format!("rank {rank} comm")
            }
        })
        .x_desc("ms since the step began (rank 0's forward pass)")
        .draw()?;
    for (name, color) in PHASES {
        let rects: Vec<_> = ev
            .iter()
            .filter(|e| e.phase == name && e.end_us > t0 && e.start_us < t1)
            .map(|e| {
                let lane = 2 * e.rank + usize::from(!COMPUTE.contains(&name));
                let (x0, x1) = (
                    (e.start_us.max(t0) - t0) / 1e3,
                    (e.end_us.min(t1) - t0) / 1e3,
                );
                let y = lane as f64;
                Rectangle::new(
                    [(x0, y + 0.15), (x1.max(x0 + span_ms * 1e-3), y + 0.85)],
                    color.filled(),
                )
            })
            .collect();
        chart
            .draw_series(rects)?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::{assert_png, scratch_dir};
    use super::*;

    #[test]
    fn picks_a_whole_step_of_rank_0() {
        let e = |rank, phase: &str, s: f64, d: f64| Event {
            rank,
            phase: phase.into(),
            start_us: s,
            end_us: s + d,
        };
        let ev = vec![
            e(0, "FORWARD", 0.0, 5.0),
            e(0, "FORWARD", 100.0, 5.0),
            e(1, "FORWARD", 150.0, 5.0),
            e(0, "FORWARD", 200.0, 5.0),
            e(0, "WIRE", 250.0, 5.0),
        ];
        assert_eq!(step_window(&ev), Some((0.0, 100.0)));
        assert_eq!(step_window(&ev[3..]), Some((200.0, 255.0)));
        assert_eq!(step_window(&[]), None);
    }

    /// Draws the trace `text` from a file in `dir`.
    fn plot_text(dir: &Path, text: &str) -> Result<(), PlotError> {
        let trace = dir.join("timeline.json");
        std::fs::write(&trace, text).unwrap();
        plot_step(&trace, &trace.with_extension("png"))
    }

    #[test]
    fn a_step_is_drawn_as_png() {
        let dir = scratch_dir("plot-step");
        let span = |pid, name, ts, dur| {
            format!(r#"{{"ph":"X","pid":{pid},"tid":0,"name":"{name}","ts":{ts},"dur":{dur}}}"#)
        };
        let spans = [
            span(0, "FORWARD", 0, 40),
            span(0, "BACKWARD", 40, 60),
            span(0, "WIRE", 60, 50),
            span(1, "FORWARD", 5, 40),
            span(1, "WIRE", 70, 40),
        ];
        let text = format!(r#"{{"traceEvents":[{}]}}"#, spans.join(","));
        plot_text(&dir, &text).unwrap();
        assert_png(&dir.join("timeline.png"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_traces_are_typed_errors() {
        let dir = scratch_dir("plot-step-bad");
        let missing = plot_step(&dir.join("none.json"), &dir.join("none.png"));
        assert!(matches!(missing, Err(PlotError::Io { .. })), "{missing:?}");
        for text in ["", "{\"traceEvents\":[", "\u{0}\u{1}garbage"] {
            let err = plot_text(&dir, text);
            assert!(matches!(err, Err(PlotError::Parse { .. })), "{err:?}");
        }
        for text in ["{}", "[]", "{\"traceEvents\":{}}", "7"] {
            let err = plot_text(&dir, text);
            assert!(
                matches!(err, Err(PlotError::NoTraceEvents { .. })),
                "{err:?}"
            );
        }
        for text in [
            r#"{"traceEvents":[]}"#,
            r#"{"traceEvents":[{"ph":"X","pid":-1,"name":"WIRE","ts":0,"dur":1}]}"#,
            r#"{"traceEvents":[{"ph":"X","pid":0,"name":"WIRE","ts":"0","dur":1}]}"#,
            r#"{"traceEvents":[{"ph":"B","pid":0,"name":"WIRE","ts":0}]}"#,
            r#"{"traceEvents":[{"ph":"X","pid":0,"name":"WIRE","ts":-1e308,"dur":1},
                               {"ph":"X","pid":0,"name":"WIRE","ts":1e308,"dur":1}]}"#,
        ] {
            let err = plot_text(&dir, text);
            assert!(matches!(err, Err(PlotError::NoSpans { .. })), "{err:?}");
        }
        let huge = r#"{"traceEvents":[{"ph":"X","pid":18446744073709551615,"name":"WIRE","ts":0,"dur":1}]}"#;
        let err = plot_text(&dir, huge);
        assert!(
            matches!(err, Err(PlotError::TooManyRanks { .. })),
            "{err:?}"
        );
        assert!(!dir.join("timeline.png").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
