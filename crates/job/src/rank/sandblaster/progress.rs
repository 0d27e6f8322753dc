//! What a Sandblaster run tells its front end ([`SbProgress`]): notes, each accepted
//! L-BFGS step within an epoch, each finished epoch ([`SbEpochNews`]), and the end.

use gradwire_run::report::records::EpochRecord;

use crate::rank::Silent;

/// A Sandblaster run's news, in the order it happens.
pub trait SbProgress {
    /// A line for the user: the run's summary at start, a warning, the end's totals.
    fn note(&mut self, line: &str);
    /// The run starts: `epochs` epochs of `steps` accepted L-BFGS steps each.
    fn started(&mut self, steps: usize, epochs: usize);
    /// Accepted step `step` (from 0) of the epoch ended with the full-batch `loss`, after
    /// `passes` gradient passes in all.
    fn step(&mut self, step: usize, loss: f64, passes: usize);
    /// An epoch of `epochs` ended.
    fn epoch_finished(&mut self, epoch: &SbEpochNews<'_>, epochs: usize);
    /// The last step is done (or the run stopped early).
    fn finished(&mut self);
}

/// A finished Sandblaster epoch.
#[derive(Debug, Clone, Copy)]
pub struct SbEpochNews<'a> {
    /// The epoch's record (in `run.json`).
    pub record: &'a EpochRecord,
    /// Its line in `metrics.jsonl` (JSON text): the record with `servers`, `mode`,
    /// `bytes_pulled`, `iterations`, `passes`, `units_run`, `backups_issued` and
    /// `backups_won`.
    pub line: &'a str,
    /// Gradient passes so far.
    pub passes: usize,
    /// Units computed so far.
    pub units_run: usize,
    /// Units won by a backup copy so far.
    pub backups_won: usize,
    /// Bytes read in the epoch by the coordinator and the workers.
    pub bytes_pulled: u64,
}

impl SbProgress for Silent {
    fn note(&mut self, _: &str) {}
    fn started(&mut self, _: usize, _: usize) {}
    fn step(&mut self, _: usize, _: f64, _: usize) {}
    fn epoch_finished(&mut self, _: &SbEpochNews<'_>, _: usize) {}
    fn finished(&mut self) {}
}
