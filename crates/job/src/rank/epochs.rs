//! The epoch loop every trainer-driven sync mode shares (the all-reduce engine, parameter
//! servers): each epoch's steps with the front end told of each, pauses for what the mode
//! does between steps (on-disk checkpoints), and on the reporting rank the epoch's record
//! in `run.json`, its line in `metrics.jsonl` and `--json`, and the front end's news.

use std::time::Instant;

use gradwire_run::report::records::{EpochRecord, RunRecord};
use gradwire_train::data::Dataset;
use gradwire_train::{GradientSync, StepInfo, Trainer};

use super::{record, EpochNews, Progress, RankError};
use crate::Plan;

/// What a sync mode adds to the shared epoch loop.
pub(super) trait Mode<S: GradientSync> {
    /// The global step to pause at next (`None`: run the epoch through).
    fn pause_at(&self, trainer: &Trainer<S>) -> Option<u64>;
    /// At a pause: what the mode does (writes a checkpoint).
    fn at_pause(&mut self, trainer: &mut Trainer<S>) -> Result<(), RankError>;
    /// Bytes a step sent, for the front end's running total (`None`: the mode counts none
    /// per step).
    fn step_bytes(&self, step: &StepInfo) -> Option<u64>;
    /// Called before the epoch's first step.
    fn epoch_starts(&mut self, trainer: &Trainer<S>);
    /// The epoch's line in `metrics.jsonl` (the record and the mode's own fields, as JSON
    /// text), and the bytes pulled in it when the mode pulls.
    fn line(
        &self,
        trainer: &Trainer<S>,
        record: &EpochRecord,
    ) -> Result<(String, Option<u64>), RankError>;
    /// The error of a failed epoch (`epoch` from 1), naming the worker where the mode can.
    fn epoch_failed(&self, epoch: usize, source: gradwire_train::Error) -> RankError;
}

/// Where the epochs run: the plan, the data, the steps per epoch, and whether this rank
/// reports.
pub(super) struct Course<'a> {
    pub(super) plan: &'a Plan,
    pub(super) data: &'a Dataset,
    pub(super) steps: usize,
    pub(super) reporting: bool,
}

/// Runs the epochs left (from the trainer's current one); a `reporting` rank records them in
/// `run` and the files and tells `progress`. The bytes sent over the run.
pub(super) fn run_epochs<S: GradientSync>(
    trainer: &mut Trainer<S>,
    course: &Course<'_>,
    run: &mut RunRecord,
    progress: &mut dyn Progress,
    mode: &mut dyn Mode<S>,
) -> Result<u64, RankError> {
    let Course {
        plan,
        data,
        steps,
        reporting,
    } = *course;
    let mut total_bytes = 0u64;
    while (trainer.epoch() as usize) < plan.train.epochs {
        let epoch = trainer.epoch() as usize;
        if reporting {
            progress.epoch_started(epoch, plan.train.epochs, steps);
        }
        mode.epoch_starts(trainer);
        let start = Instant::now();
        let mut epoch_bytes = 0u64;
        let stats = loop {
            let pause = mode.pause_at(trainer);
            let counted = |s: &StepInfo| mode.step_bytes(s);
            let mut on_step = |s: &StepInfo| {
                let sent = counted(s).map(|b| {
                    epoch_bytes += b;
                    total_bytes + epoch_bytes
                });
                if reporting {
                    let ms = start.elapsed().as_secs_f64() * 1e3 / (s.step + 1) as f64;
                    progress.step(s.step, s.loss, ms, sent);
                }
            };
            match trainer
                .run_epoch_until(data, &mut on_step, pause)
                .map_err(|e| mode.epoch_failed(epoch + 1, e))?
            {
                Some(stats) => break stats,
                None => mode.at_pause(trainer)?,
            }
        };
        total_bytes += stats.bytes_sent;
        if reporting {
            let rec = record(&stats);
            let (line, bytes_pulled) = mode.line(trainer, &rec)?;
            progress.epoch_finished(
                &EpochNews {
                    record: &rec,
                    line: &line,
                    bytes_pulled,
                },
                plan.train.epochs,
            );
            append_line(&plan.out.join("metrics.jsonl"), &line)?;
            if let Some(j) = &plan.json {
                append_line(j, &line)?;
            }
            run.epochs.push(rec);
        }
    }
    Ok(total_bytes)
}

/// Appends one line of JSON text to `path` (created if absent).
fn append_line(path: &std::path::Path, v: &str) -> Result<(), RankError> {
    use std::io::Write;
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        writeln!(f, "{v}")
    };
    write().map_err(|source| RankError::Write {
        path: path.to_path_buf(),
        source,
    })
}
