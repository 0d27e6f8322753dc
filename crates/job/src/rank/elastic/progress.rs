//! What an elastic worker tells its front end ([`ElasticProgress`]): notes (each
//! generation, re-forms, joiners, commits), each step of an epoch on the reporting rank,
//! an epoch left when the world re-forms in its middle, and each finished epoch with the
//! world size that trained it.

use super::super::{EpochNews, Silent};

/// An elastic worker's news, in the order it happens. Only rank 0 of a generation reports
/// steps and epochs; every rank notes its re-forms.
pub trait ElasticProgress {
    /// A line for the user: a generation formed, codec state started afresh, a joiner
    /// waiting, this rank re-forming the world, the commits and the files written at the end.
    fn note(&mut self, line: &str);
    /// Epoch `epoch` (from 0) of `epochs` starts, with `steps` steps.
    fn epoch_started(&mut self, epoch: usize, epochs: usize, steps: usize);
    /// Step `step` (from 0) of the epoch ended with `loss`; `ms_per_step` is the epoch's
    /// mean so far, `accuracy` the test accuracy of the last epoch this generation finished.
    fn step(&mut self, step: usize, loss: f32, ms_per_step: f64, accuracy: Option<f64>);
    /// The epoch stops before its end: the world re-forms to admit a joiner.
    fn epoch_left(&mut self);
    /// An epoch of `epochs` ended, trained by `ranks` ranks.
    fn epoch_finished(&mut self, epoch: &EpochNews<'_>, epochs: usize, ranks: usize);
}

impl ElasticProgress for Silent {
    fn note(&mut self, _: &str) {}
    fn epoch_started(&mut self, _: usize, _: usize, _: usize) {}
    fn step(&mut self, _: usize, _: f32, _: f64, _: Option<f64>) {}
    fn epoch_left(&mut self) {}
    fn epoch_finished(&mut self, _: &EpochNews<'_>, _: usize, _: usize) {}
}
