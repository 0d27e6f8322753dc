//! What a run leaves behind and shows: `run.json` and the plots, the progress bar.

use std::path::Path;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};

use gradwire_run::report::records::RunRecord;

/// Writes `run.json` and the plots of a finished run ([`gradwire_job::rank::write_run`]),
/// a plot that cannot be drawn noted on standard error.
pub fn write_run(run: &RunRecord, out: &Path) -> Result<()> {
    Ok(gradwire_job::rank::write_run(
        run,
        out,
        &mut super::rank::Shown::new(true),
    )?)
}

/// The progress bar of one epoch of `steps` steps (`epoch` counted from 0).
pub(crate) fn progress_bar(steps: usize, epoch: usize, epochs: usize) -> ProgressBar {
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{}/{}", epoch + 1, epochs));
    bar
}
