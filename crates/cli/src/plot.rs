//! PNG charts of training runs, drawn by `gradwire_job::plot`: the comparison and
//! time-to-accuracy charts of `report`, and the byte counts of progress lines.

use std::path::Path;

pub use gradwire_job::plot::{human_bytes, plot_comparison};

/// Writes the time-to-accuracy chart ([`gradwire_job::plot::plot_time_to_accuracy`]) for
/// the report's `anyhow` flow.
pub fn plot_time_to_accuracy(
    series: Vec<(String, Vec<(f64, f64)>)>,
    target: &str,
    out: &Path,
) -> anyhow::Result<()> {
    Ok(gradwire_job::plot::plot_time_to_accuracy(
        series, target, out,
    )?)
}
