//! One rank of `gradwire train` under the all-reduce engine: the library's rank
//! ([`gradwire_job::rank::train_rank`]) with this front end's [`Shown`] progress: the
//! progress bar, each epoch's JSON line on standard output and its summary, and every note,
//! on standard error.

use anyhow::Result;
use gradwire_job::rank::{EpochNews, Progress};
use gradwire_job::Plan;
use gradwire_transport::Transport;
use indicatif::ProgressBar;

use super::output::progress_bar;
use gradwire_job::plot::human_bytes;

/// Trains on one rank ([`gradwire_job::rank::train_rank`]), showing the reporting rank's
/// progress unless `quiet`.
pub(super) fn run_linked<T: Transport + 'static>(t: T, plan: &Plan, quiet: bool) -> Result<()> {
    Ok(gradwire_job::rank::train_rank(
        t,
        plan,
        &mut Shown::new(quiet),
    )?)
}

/// What `gradwire train` shows of a rank: notes as `gradwire train: ...` lines, a progress
/// bar per epoch (unless quiet) with the loss, the last epoch's accuracy (or perplexity), the
/// time per step and the bytes sent, and per epoch its JSON line on standard output and a
/// summary line.
pub(crate) struct Shown {
    quiet: bool,
    bar: Option<ProgressBar>,
    last: String,
}

impl Shown {
    /// Shows progress (the bar only unless `quiet`).
    pub(crate) fn new(quiet: bool) -> Shown {
        Shown {
            quiet,
            bar: None,
            last: String::new(),
        }
    }
}

impl Progress for Shown {
    fn note(&mut self, line: &str) {
        eprintln!("gradwire train: {line}");
    }

    fn epoch_started(&mut self, epoch: usize, epochs: usize, steps: usize) {
        self.bar = (!self.quiet).then(|| progress_bar(steps, epoch, epochs));
    }

    fn step(&mut self, step: usize, loss: f32, ms_per_step: f64, bytes_sent: Option<u64>) {
        if let Some(b) = &self.bar {
            b.set_position(step as u64 + 1);
            let sent = bytes_sent.map_or(String::new(), |s| {
                format!(" | sent {}", human_bytes(s as f64))
            });
            b.set_message(format!(
                "loss {loss:.4}{} | {ms_per_step:.0} ms/step{sent}",
                self.last
            ));
        }
    }

    fn epoch_finished(&mut self, epoch: &EpochNews<'_>, epochs: usize) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        let rec = epoch.record;
        self.last = match (rec.test_accuracy, rec.val_perplexity) {
            (_, Some(p)) => format!(" | val ppl {p:.2}"),
            (Some(a), _) => format!(" | acc {:.2}%", a * 100.0),
            _ => String::new(),
        };
        println!("{}", epoch.line);
        let traffic = match epoch.bytes_pulled {
            Some(pulled) => format!(
                "(compute {:.1}, ps {:.1}) | pushed {} pulled {}",
                rec.compute_s,
                rec.comm_s,
                human_bytes(rec.bytes_sent as f64),
                human_bytes(pulled as f64)
            ),
            None => format!(
                "(compute {:.1}, comm {:.1}) | sent {} | ratio {:.1}x",
                rec.compute_s,
                rec.comm_s,
                human_bytes(rec.bytes_sent as f64),
                rec.compression_ratio
            ),
        };
        eprintln!(
            "epoch {}/{epochs}: loss {:.4}{} | {:.1} s {traffic}",
            rec.epoch, rec.train_loss, self.last, rec.wall_s,
        );
    }
}
