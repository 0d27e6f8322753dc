//! What a run leaves behind and shows: its epoch records, `run.json` and the plots, the
//! progress bar.

use std::path::Path;

use anyhow::{Context, Result};
use gradwire_train::EpochStats;
use indicatif::{ProgressBar, ProgressStyle};

use crate::records::{EpochRecord, RunRecord};

/// An epoch's statistics as its JSON line records them (epochs counted from 1).
pub(crate) fn record(s: &EpochStats) -> EpochRecord {
    EpochRecord {
        epoch: s.epoch as usize + 1,
        train_loss: s.train_loss,
        test_accuracy: s.test_accuracy,
        val_perplexity: s.val_perplexity,
        wall_s: s.wall_s,
        eval_s: s.eval_s,
        compute_s: s.compute_s,
        comm_s: s.comm_s,
        bytes_sent: s.bytes_sent,
        compression_ratio: s.compression_ratio,
    }
}

/// Writes `run.json` and the plots of a finished run.
pub fn write_run(run: &RunRecord, out: &Path) -> Result<()> {
    std::fs::write(
        out.join("run.json"),
        serde_json::to_string_pretty(run)? + "\n",
    )
    .with_context(|| format!("writing {}", out.join("run.json").display()))?;
    // Plots are best-effort: a missing font or an unwritable image warns, the run stands.
    if let Err(e) = crate::plot::plot_run(run, out) {
        tracing::warn!("plots of {} not drawn: {e:#}", out.display());
        eprintln!("gradwire train: warning: plots not drawn ({e:#}); run.json is written");
    }
    Ok(())
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
