//! `gradwire train --elastic MIN:MAX`: elastic all-reduce training (TorchElastic's
//! rendezvous, Horovod Elastic's `hvd.elastic.run` with `state.commit()`).
//!
//! The parent ([`run_parent`]) starts a membership coordinator (`gradwire_run::elastic`) and
//! `--workers` processes; each is one worker of the run,
//! [`gradwire_job::rank::elastic::run_member`] (what a generation is, commits, a rank's loss
//! and a joiner's admission are that module's docs), shown here ([`Shown`]): a progress bar
//! per epoch on rank 0, each epoch's JSON line on standard output and its summary with the
//! world size, and every note, on standard error.
//!
//! - **A process joins** (`gradwire train --join OUT`, OUT being the run's `--out`,
//!   [`join`]): it waits at the coordinator and is admitted at the next commit.
//! - Below `MIN` ranks the coordinator waits for joiners for its timeout, then the run
//!   fails.
//!
//! At the end the parent adds the membership events to run.json (`membership`).
//!
//! Not with parameter servers, model parallelism, `--overlap-steps 1`, on-disk checkpoints
//! (`--checkpoint-every`, `--resume`) or `--timeline`; only processes on this host (the
//! parent starts them; a joiner runs here too).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gradwire_job::plot::human_bytes;
use gradwire_job::rank::elastic::ElasticProgress;
use gradwire_job::rank::EpochNews;
use gradwire_run::elastic::Member;
use indicatif::ProgressBar;

use crate::launch::elastic::ElasticJob;
use crate::train::{progress_bar, worker_spec, Plan};

pub use gradwire_job::elastic::{Elastic, ElasticRange};

/// Where an elastic run's join file is: `OUT/elastic/join.json`.
fn join_file(out: &Path) -> PathBuf {
    out.join("elastic").join("join.json")
}

/// The parent of an elastic run: the coordinator and the workers until the run ends (the
/// last rank 0 writes the membership events into run.json).
pub fn run_parent(plan: &Plan, elastic: &Elastic) -> Result<()> {
    eprintln!(
        "gradwire train: elastic {}:{} ranks, commits every {} steps; add a worker with: gradwire train --join {}",
        elastic.range.min,
        elastic.range.max,
        elastic.commit_every,
        plan.out.display()
    );
    let spec = worker_spec(plan.workers, Vec::new())?;
    let join = join_file(&plan.out);
    crate::launch::elastic::run(&ElasticJob {
        spec: &spec,
        min: elastic.range.min,
        max: elastic.range.max,
        join_file: Some(&join),
        who: "gradwire train",
    })
    .map(drop)
}

/// `gradwire train --join DIR`: becomes one more worker of the elastic run whose `--out` is
/// DIR (replaces this process with the workers' command line).
pub fn join(dir: &Path) -> Result<()> {
    crate::launch::elastic::join(&join_file(dir))
        .with_context(|| format!("--join {}", dir.display()))
}

/// One worker of an elastic run ([`gradwire_job::rank::elastic::run_member`]), shown unless
/// `quiet` (the bar; the lines are always shown). `threads_given`: whether `--threads` was.
pub fn run_member(
    plan: &Plan,
    elastic: &Elastic,
    member: Member,
    quiet: bool,
    threads_given: bool,
) -> Result<()> {
    let mut shown = Shown {
        quiet,
        bar: None,
        last: String::new(),
    };
    Ok(gradwire_job::rank::elastic::run_member(
        plan,
        elastic,
        member,
        threads_given,
        &mut shown,
    )?)
}

/// What `gradwire train --elastic` shows of a worker: notes as `gradwire train: ...` lines,
/// a progress bar per epoch (unless quiet) with the loss, the generation's last accuracy and
/// the time per step, and per epoch its JSON line on standard output and a summary line
/// with the world size.
struct Shown {
    quiet: bool,
    bar: Option<ProgressBar>,
    /// The last epoch's accuracy, as the summary line shows it.
    last: String,
}

/// ` | acc X%`, or nothing without an accuracy.
fn acc(accuracy: Option<f64>) -> String {
    accuracy.map_or(String::new(), |a| format!(" | acc {:.2}%", a * 100.0))
}

impl ElasticProgress for Shown {
    fn note(&mut self, line: &str) {
        eprintln!("gradwire train: {line}");
    }

    fn epoch_started(&mut self, epoch: usize, epochs: usize, steps: usize) {
        self.bar = (!self.quiet).then(|| progress_bar(steps, epoch, epochs));
    }

    fn step(&mut self, step: usize, loss: f32, ms_per_step: f64, accuracy: Option<f64>) {
        if let Some(b) = &self.bar {
            b.set_position(step as u64 + 1);
            b.set_message(format!(
                "loss {loss:.4}{} | {ms_per_step:.0} ms/step",
                acc(accuracy)
            ));
        }
    }

    fn epoch_left(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }

    fn epoch_finished(&mut self, epoch: &EpochNews<'_>, epochs: usize, ranks: usize) {
        self.epoch_left();
        let rec = epoch.record;
        self.last = acc(rec.test_accuracy);
        println!("{}", epoch.line);
        eprintln!(
            "epoch {}/{epochs}: loss {:.4}{} | {:.1} s | {ranks} ranks | sent {}",
            rec.epoch,
            rec.train_loss,
            self.last,
            rec.wall_s,
            human_bytes(rec.bytes_sent as f64)
        );
    }
}
