//! One training step of a merged timeline (Chrome trace JSON from `train --timeline`) drawn
//! as a PNG: per rank a compute lane (FORWARD, BACKWARD, UPDATE) and a communication lane
//! (NEGOTIATE, QUEUE, FUSE, ENCODE, WIRE, DECODE, UNFUSE), on one time axis, so overlap and
//! the rank that arrived last are seen at a glance.

use std::path::Path;

use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde_json::Value;

/// A complete span of the trace.
#[derive(Debug, Clone)]
struct Event {
    rank: usize,
    phase: String,
    start_us: f64,
    end_us: f64,
}

const COMPUTE: [&str; 3] = ["FORWARD", "BACKWARD", "UPDATE"];
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

fn events(trace: &Value) -> Result<Vec<Event>> {
    let list = trace
        .get("traceEvents")
        .and_then(Value::as_array)
        .context("no traceEvents array")?;
    Ok(list
        .iter()
        .filter(|e| e.get("ph").and_then(Value::as_str) == Some("X"))
        .filter_map(|e| {
            let ts = e.get("ts")?.as_f64()?;
            Some(Event {
                rank: e.get("pid")?.as_u64()? as usize,
                phase: e.get("name")?.as_str()?.to_string(),
                start_us: ts,
                end_us: ts + e.get("dur")?.as_f64()?,
            })
        })
        .collect())
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
pub fn plot_step(trace: &Path, png: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(trace).with_context(|| format!("reading {}", trace.display()))?;
    let doc: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", trace.display()))?;
    let ev = events(&doc)?;
    let Some((t0, t1)) = step_window(&ev) else {
        bail!("{} holds no spans", trace.display());
    };
    let ranks = ev.iter().map(|e| e.rank + 1).max().unwrap_or(1);
    let span_ms = ((t1 - t0) / 1e3).max(1e-3);
    let root = BitMapBackend::new(png, (1100, 120 + 70 * ranks as u32)).into_drawing_area();
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
    root.present()
        .with_context(|| format!("writing {}", png.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
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
}
