//! The progress bar every kind of `gradwire train` shows per epoch.

use indicatif::{ProgressBar, ProgressStyle};

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
