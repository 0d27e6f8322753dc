//! PNG charts of what a training job leaves behind, drawn with plotters:
//!
//! - [`curves`]: one run's loss and accuracy (or perplexity) against epochs and against
//!   bytes sent ([`plot_run`]);
//! - [`comparison`]: the report's chart of several runs, final quality against bytes per
//!   step, one point per codec ([`plot_comparison`]);
//! - [`time_to_accuracy`]: the report's training time to a target against link speed
//!   ([`plot_time_to_accuracy`]);
//! - [`timeline`]: one step of a merged Chrome trace, a compute and a communication lane
//!   per rank ([`plot_step`]);
//! - [`units`]: how byte counts, bandwidths and codecs are written on a chart;
//! - [`error`]: what can go wrong ([`PlotError`]), each error naming its file.
//!
//! Text is drawn with plotters' `ttf` feature, which finds a system sans-serif font through
//! fontconfig (Debian: `fontconfig` and `fonts-dejavu-core`); without one, drawing fails
//! with [`PlotError::Draw`].

mod chart;
pub mod comparison;
pub mod curves;
pub mod error;
pub mod time_to_accuracy;
pub mod timeline;
pub mod units;

pub use comparison::plot_comparison;
pub use curves::plot_run;
pub use error::PlotError;
pub use time_to_accuracy::plot_time_to_accuracy;
pub use timeline::{plot_step, MAX_TRACE_BYTES};
pub use units::{codec_label, human_bits, human_bytes};

#[cfg(test)]
pub(crate) mod testing;
