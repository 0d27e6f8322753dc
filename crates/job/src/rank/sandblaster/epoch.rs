//! The end of a Sandblaster epoch ([`finish_epoch`]): the shards' parameters evaluated, the
//! epoch's record and its line (with the Sandblaster counters), told to the front end and
//! appended to `metrics.jsonl` and `--json`.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use gradwire_ps::sandblaster::Progress;
use gradwire_run::report::records::EpochRecord;
use gradwire_train::{evaluate, Eval, Model};

use super::{SbEpochNews, SbError, SbProgress};
use crate::ps::PsPlan;
use crate::Plan;

/// Where the epoch's clock, byte counts and pass time started.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mark {
    start: Instant,
    bytes: (u64, u64),
    pass_time: Duration,
}

impl Mark {
    /// Now, with nothing sent or pulled and no pass made.
    pub(super) fn now() -> Mark {
        Mark {
            start: Instant::now(),
            bytes: (0, 0),
            pass_time: Duration::ZERO,
        }
    }
}

/// Evaluates the shards' parameters at the end of epoch `epoch` (from 1), tells `progress`
/// and appends its line; the next epoch's clock starts after this one's evaluation.
#[allow(clippy::too_many_arguments)]
pub(super) fn finish_epoch(
    p: &mut Progress<'_>,
    plan: &Plan,
    ps: &PsPlan,
    test: &gradwire_train::data::Split,
    model: &mut dyn Model,
    mark: &mut Mark,
    epoch: usize,
    progress: &mut dyn SbProgress,
) -> Result<EpochRecord, SbError> {
    let Mark {
        start,
        bytes: bytes0,
        pass_time: pass0,
    } = *mark;
    let params = p.params().map_err(SbError::Params)?;
    let t_eval = Instant::now();
    model.set_params(&params);
    let e: Eval = evaluate(
        &*model,
        test,
        plan.train.eval_batch_size,
        plan.train.eval_limit,
    )?;
    let eval_s = t_eval.elapsed().as_secs_f64();
    let wall_s = start.elapsed().as_secs_f64();
    let compute_s = p.pass_time.saturating_sub(pass0).as_secs_f64();
    let bytes = p.bytes;
    let rec = EpochRecord {
        epoch,
        train_loss: p.loss,
        test_accuracy: Some(e.accuracy()),
        val_perplexity: plan.model.is_language_model().then(|| e.perplexity()),
        wall_s,
        eval_s,
        compute_s,
        comm_s: (wall_s - compute_s - eval_s).max(0.0),
        bytes_sent: bytes.0.saturating_sub(bytes0.0),
        compression_ratio: 1.0,
    };
    let bytes_pulled = bytes.1.saturating_sub(bytes0.1);
    let mut line = serde_json::to_value(&rec)?;
    line["servers"] = ps.addrs.len().max(ps.servers).into();
    line["mode"] = "sandblaster".into();
    line["bytes_pulled"] = bytes_pulled.into();
    line["iterations"] = p.iteration.into();
    line["passes"] = p.passes.into();
    line["units_run"] = p.units_run.into();
    line["backups_issued"] = p.backups_issued.into();
    line["backups_won"] = p.backups_won.into();
    let text = serde_json::to_string(&line)?;
    let news = SbEpochNews {
        record: &rec,
        line: &text,
        passes: p.passes,
        units_run: p.units_run,
        backups_won: p.backups_won,
        bytes_pulled,
    };
    progress.epoch_finished(&news, plan.train.epochs);
    append(&plan.out.join("metrics.jsonl"), &text)?;
    if let Some(j) = &plan.json {
        append(j, &text)?;
    }
    *mark = Mark {
        start: Instant::now(),
        bytes,
        pass_time: p.pass_time,
    };
    Ok(rec)
}

/// Appends one line to `path` (created if absent).
fn append(path: &Path, line: &str) -> Result<(), SbError> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| SbError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    writeln!(f, "{line}").map_err(|source| SbError::Write {
        path: path.to_path_buf(),
        source,
    })
}
