//! `gradwire train --sync sandblaster --workers N --servers S`: DistBelief's Sandblaster
//! L-BFGS ([`gradwire_job::rank::sandblaster`]: this process the coordinator with `--workers`
//! worker threads, the shards `gradwire ps serve` processes of this binary unless
//! `--ps-servers` names them), shown here: a progress bar of each epoch's L-BFGS steps,
//! each epoch's JSON line on standard output and its summary, and every note, on standard
//! error.
//!
//! `--optimizer`, `--lr`, `--batch`, `--max-steps`, `--codec` and the Downpour flags do not
//! apply and are refused by name (`gradwire_job::ps`).

use anyhow::{Context, Result};
use gradwire_job::plot::human_bytes;
use gradwire_job::rank::sandblaster::{SbEpochNews, SbProgress};
use gradwire_job::shards::{ShardOptions, Shards};
use indicatif::ProgressBar;

use crate::train::ps::{PsPlan, SbPlan};
use crate::train::Plan;

/// Runs Sandblaster L-BFGS as `plan` says (this process is the coordinator).
pub fn run(plan: &Plan, ps: &PsPlan, sb: &SbPlan, quiet: bool) -> Result<()> {
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
    let mut start = |n, clients, opts: &ShardOptions| {
        Shards::start(&exe, n, clients, opts, crate::ps::restart_note())
    };
    let mut shown = Shown { quiet, bar: None };
    Ok(gradwire_job::rank::sandblaster::sandblaster(
        plan, ps, sb, &mut start, &mut shown,
    )?)
}

/// What `gradwire train --sync sandblaster` shows: notes as `gradwire train: ...` lines,
/// one progress bar (unless quiet) over each epoch's steps with the loss and the passes,
/// and per epoch its JSON line on standard output and a summary line.
struct Shown {
    quiet: bool,
    bar: Option<ProgressBar>,
}

impl SbProgress for Shown {
    fn note(&mut self, line: &str) {
        eprintln!("gradwire train: {line}");
    }

    fn started(&mut self, steps: usize, epochs: usize) {
        self.bar = (!self.quiet).then(|| crate::train::progress_bar(steps, 0, epochs));
    }

    fn step(&mut self, step: usize, loss: f64, passes: usize) {
        if let Some(b) = &self.bar {
            b.set_position(step as u64 + 1);
            b.set_message(format!("loss {loss:.4} | {passes} passes"));
        }
    }

    fn epoch_finished(&mut self, e: &SbEpochNews<'_>, epochs: usize) {
        let rec = e.record;
        println!("{}", e.line);
        eprintln!(
            "epoch {}/{epochs}: loss {:.4} | acc {:.2}% | {:.1} s (passes {:.1}) | {} passes, {} units ({} backups won) | wrote {} read {}",
            rec.epoch,
            rec.train_loss,
            rec.test_accuracy.unwrap_or(0.0) * 100.0,
            rec.wall_s,
            rec.compute_s,
            e.passes,
            e.units_run,
            e.backups_won,
            human_bytes(rec.bytes_sent as f64),
            human_bytes(e.bytes_pulled as f64)
        );
        if let Some(b) = &self.bar {
            if rec.epoch < epochs {
                b.reset();
            }
        }
    }

    fn finished(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}
