//! What a rank tells its front end while it trains ([`Progress`]): news lines, each step of
//! an epoch, each finished epoch. Only the reporting rank calls it; a front end draws its
//! progress bar and prints from it, a library user may ignore it ([`Silent`]).

use gradwire_run::report::records::EpochRecord;

/// The reporting rank's news, in the order it happens.
pub trait Progress {
    /// A line for the user: the run's summary at start, warnings (`warning: ...`), a resume,
    /// the partition plan, checkpoints and files written at the end.
    fn note(&mut self, line: &str);
    /// Epoch `epoch` (from 0) of `epochs` starts, with `steps` steps.
    fn epoch_started(&mut self, epoch: usize, epochs: usize, steps: usize);
    /// Step `step` (from 0) of the epoch ended with `loss`; `ms_per_step` is the epoch's
    /// mean so far, `bytes_sent` the run's total (`None` where the sync mode counts none per
    /// step: parameter servers).
    fn step(&mut self, step: usize, loss: f32, ms_per_step: f64, bytes_sent: Option<u64>);
    /// An epoch of `epochs` ended.
    fn epoch_finished(&mut self, epoch: &EpochNews<'_>, epochs: usize);
}

/// A finished epoch, as the reporting rank records it.
#[derive(Debug, Clone, Copy)]
pub struct EpochNews<'a> {
    /// The epoch's record (in `run.json`).
    pub record: &'a EpochRecord,
    /// Its line in `metrics.jsonl` (JSON text): the record, with a parameter server's
    /// `servers`, `mode` and `bytes_pulled`.
    pub line: &'a str,
    /// Bytes pulled from parameter servers in the epoch (`None` under the all-reduce engine).
    pub bytes_pulled: Option<u64>,
}

/// A [`Progress`] that shows nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Progress for Silent {
    fn note(&mut self, _: &str) {}
    fn epoch_started(&mut self, _: usize, _: usize, _: usize) {}
    fn step(&mut self, _: usize, _: f32, _: f64, _: Option<u64>) {}
    fn epoch_finished(&mut self, _: &EpochNews<'_>, _: usize) {}
}

/// A [`Progress`] that passes its notes to a function and shows nothing else: for the
/// library's writers that note (`write_run`) under a front end of another kind.
pub(crate) struct Notes<F: FnMut(&str)>(pub(crate) F);

impl<F: FnMut(&str)> Progress for Notes<F> {
    fn note(&mut self, line: &str) {
        (self.0)(line);
    }
    fn epoch_started(&mut self, _: usize, _: usize, _: usize) {}
    fn step(&mut self, _: usize, _: f32, _: f64, _: Option<u64>) {}
    fn epoch_finished(&mut self, _: &EpochNews<'_>, _: usize) {}
}
