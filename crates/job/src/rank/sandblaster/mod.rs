//! DistBelief's Sandblaster L-BFGS (Dean et al. 2012, `gradwire_ps::sandblaster`) on the
//! models and data sets of a job (`--sync sandblaster`), with this process as the
//! coordinator ([`sandblaster`]).
//!
//! - **Processes**: the shards (started through the front end, or the plan's
//!   `--ps-servers`) hold the parameters, the gradient and the L-BFGS history; the
//!   coordinator runs the two-loop recursion as vector ops (dot, axpy, scale) executed on
//!   the shards, and `--workers` worker threads each have their own connection and fetch the
//!   parameters once per pass. Deviation from DistBelief: workers are threads of one process
//!   and hand their unit results to the coordinator in memory (the library's
//!   simplification), not processes pushing to the shards, so no launcher mode exists.
//! - **Objective**: the model's training loss over a full batch (the training set, or a
//!   seeded sample of `--sb-batch` examples), no regularizer
//!   (`gradwire_train::sandblaster::ModelObjective`).
//! - **Work units**: `--sb-unit` examples [default: batch / (16 x workers), so a unit is a
//!   16th of a worker's even share]; a worker that finishes takes the next one, and near the
//!   end of a pass idle workers get backup copies of running units (first result wins; off
//!   with `--sb-no-backups`).
//! - **L-BFGS**: history m = `--sb-history` [default: 10, the usual choice of Nocedal and
//!   Wright; DistBelief does not state one], backtracking Armijo line search (c = 1e-4) with
//!   the first trial step 1 (each trial is a pass).
//! - **Epoch**: `--sb-iters` accepted L-BFGS steps [default: 10]; `--epochs` of them. Each
//!   epoch's line is the other modes' record: `train_loss` is the full-batch loss after the
//!   epoch's last step, `test_accuracy` from the parameters on the shards, `compute_s` the
//!   time in gradient passes, `comm_s` the rest but evaluation (the coordinator's vector ops
//!   and the parameter fetch), `bytes_sent` / `bytes_pulled` the frame bytes written / read
//!   by the coordinator and all workers (measured, not estimated), plus `mode`, `servers`,
//!   `iterations`, `passes`, `units_run`, `backups_issued` and `backups_won`; `run.json`
//!   gets a `ps` object with the run's totals and every step's loss.

mod epoch;
mod error;
mod progress;

use std::sync::Arc;

use gradwire_ps::sandblaster::{run_observed, Progress, Report, SandblasterConfig};
use gradwire_ps::Key;
use gradwire_train::sandblaster::ModelObjective;

pub use error::SbError;
pub use progress::{SbEpochNews, SbProgress};

use crate::plot::human_bytes;
use crate::ps::{PsPlan, SbPlan};
use crate::rank::progress::Notes;
use crate::rank::{save_params, write_run};
use crate::shards::{ShardOptions, Shards, ShardsError};
use crate::Plan;
use epoch::{finish_epoch, Mark};

/// Work units per worker per pass when `--sb-unit` is not given.
pub const UNITS_PER_WORKER: usize = 16;

/// Starts `n` shard processes for `clients` clients with these options.
pub type StartShards<'a> =
    dyn FnMut(usize, usize, &ShardOptions) -> Result<Shards, ShardsError> + 'a;

/// The full batch, its units and the objective over them.
struct Batch {
    objective: Arc<ModelObjective>,
    batch: usize,
    unit: usize,
    units: usize,
}

/// Runs Sandblaster L-BFGS as `plan` says, this process being the coordinator; the shards
/// are the plan's, or `start_shards` starts them (stopped when the run ends).
///
/// Longer than 120 lines on purpose: the shards, the objective, the coordinator and its
/// workers are set up in the order each needs the one before, then the epochs run; each
/// step is a few lines.
pub fn sandblaster(
    plan: &Plan,
    ps: &PsPlan,
    sb: &SbPlan,
    start_shards: &mut StartShards<'_>,
    progress: &mut dyn SbProgress,
) -> Result<(), SbError> {
    gradwire_train::init_threads(plan.threads);
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .map_err(|source| SbError::Load {
            dataset: plan.dataset.name(),
            source,
        })?;
    let workers = plan.workers.max(1);
    let b = batch(plan, sb, &data, workers)?;
    let dim = b.objective.initial_params().len();
    let mut shards = None;
    let addrs = if ps.addrs.is_empty() {
        // The coordinator is one more client (worker id `workers`).
        let s = start_shards(ps.servers, workers + 1, &ShardOptions::for_run(&plan.out))?;
        let a = s.addrs.clone();
        shards = Some(s);
        a
    } else {
        ps.addrs.clone()
    };
    let cfg = SandblasterConfig {
        iterations: plan.train.epochs * sb.iters_per_epoch,
        history: sb.history,
        backups: sb.backups,
        max_copies: 2,
        unit_delay: Vec::new(),
        key: Key(1),
        chunk_elems: dim.div_ceil(addrs.len()).max(1),
    };
    announce(plan, sb, &b, &data, addrs.len(), progress);
    std::fs::create_dir_all(&plan.out).map_err(|source| SbError::Create {
        path: plan.out.clone(),
        source,
    })?;
    let _ = std::fs::remove_file(plan.out.join("metrics.jsonl"));
    let mut run = plan.run_record(workers, sb.iters_per_epoch);
    run.momentum_correction = None;
    let mut eval_model = plan.model.build(data.shape(), plan.train.seed)?;
    let mut failure: Option<SbError> = None;
    let mut mark = Mark::now();
    progress.started(sb.iters_per_epoch, plan.train.epochs);
    let mut observe = |p: &mut Progress<'_>| -> bool {
        if let Some(e) = b.objective.take_error() {
            failure = Some(SbError::Unit(e));
            return false;
        }
        if !p.loss.is_finite() {
            failure = Some(SbError::Diverged {
                loss: p.loss,
                iteration: p.iteration,
            });
            return false;
        }
        let within = (p.iteration - 1) % sb.iters_per_epoch;
        progress.step(within, p.loss, p.passes);
        if within + 1 != sb.iters_per_epoch {
            return true;
        }
        let epoch = p.iteration / sb.iters_per_epoch;
        let test = &data.test;
        match finish_epoch(
            p,
            plan,
            ps,
            test,
            &mut *eval_model,
            &mut mark,
            epoch,
            progress,
        ) {
            Ok(rec) => {
                run.epochs.push(rec);
                true
            }
            Err(e) => {
                failure = Some(e);
                false
            }
        }
    };
    let report = run_observed(
        addrs.clone(),
        b.objective.clone(),
        b.objective.initial_params(),
        workers,
        &cfg,
        &mut observe,
    )
    .map_err(SbError::Lbfgs)?;
    progress.finished();
    drop(shards);
    if let Some(e) = failure {
        return Err(e);
    }
    if let Some(p) = &plan.save_params {
        save_params(p, &report.params)?;
    }
    write_run(&run, &plan.out, &mut Notes(|l: &str| progress.note(l)))?;
    record_ps(plan, sb, &b, addrs.len(), &report)?;
    finished(plan, &report, progress);
    Ok(())
}

/// The full batch (`--sb-batch`, at most the training set), its units (`--sb-unit`, else
/// [`UNITS_PER_WORKER`] per worker) and the objective over them.
fn batch(
    plan: &Plan,
    sb: &SbPlan,
    data: &gradwire_train::data::Dataset,
    workers: usize,
) -> Result<Batch, SbError> {
    let batch = sb.batch.unwrap_or(usize::MAX).min(data.train.len());
    let unit = sb
        .unit
        .unwrap_or_else(|| batch.div_ceil(UNITS_PER_WORKER * workers))
        .max(1);
    let objective = ModelObjective::new(
        plan.model,
        data.shape(),
        plan.train.seed,
        data.train.clone(),
        Some(batch),
        unit,
    )
    .map_err(SbError::Objective)?;
    Ok(Batch {
        objective: Arc::new(objective),
        batch,
        unit,
        units: batch.div_ceil(unit),
    })
}

/// Adds the run's `ps` object to `run.json`: the settings, the totals and every step's loss.
fn record_ps(
    plan: &Plan,
    sb: &SbPlan,
    b: &Batch,
    servers: usize,
    report: &Report,
) -> Result<(), SbError> {
    let path = plan.out.join("run.json");
    let text = std::fs::read_to_string(&path).map_err(|source| SbError::Read {
        path: path.clone(),
        source,
    })?;
    let mut v: serde_json::Value = serde_json::from_str(&text)?;
    v["ps"] = serde_json::json!({
        "mode": "sandblaster",
        "servers": servers,
        "history": sb.history,
        "batch": b.batch,
        "unit": b.unit,
        "units": b.units,
        "backups": sb.backups,
        "iterations": report.losses.len().saturating_sub(1),
        "passes": report.passes,
        "units_run": report.units_run,
        "backups_issued": report.backups_issued,
        "backups_won": report.backups_won,
        "bytes_pushed": report.bytes.0,
        "bytes_pulled": report.bytes.1,
        "losses": report.losses,
    });
    std::fs::write(&path, serde_json::to_string_pretty(&v)? + "\n")
        .map_err(|source| SbError::Write { path, source })
}

/// The run's first lines: what trains on what, and a warning when the units are too few to
/// balance the load.
fn announce(
    plan: &Plan,
    sb: &SbPlan,
    b: &Batch,
    data: &gradwire_train::data::Dataset,
    servers: usize,
    progress: &mut dyn SbProgress,
) {
    let workers = plan.workers.max(1);
    progress.note(&format!(
        "{} on {} ({} train / {} held out), --sync sandblaster: L-BFGS m={} over a batch of {} in {} units of {}, {} worker thread(s), {} shard(s), backups {}, {} steps/epoch x {} epochs",
        plan.model.name(),
        plan.dataset.name(),
        data.train.len(),
        data.test.len(),
        sb.history,
        b.batch,
        b.units,
        b.unit,
        workers,
        servers,
        if sb.backups { "on" } else { "off" },
        sb.iters_per_epoch,
        plan.train.epochs
    ));
    if b.units < 4 * workers {
        progress.note(&format!(
            "warning: {} units for {workers} workers: Sandblaster balances \
             load with many units per worker (lower --sb-unit)",
            b.units
        ));
    }
}

/// The run's last line: its totals.
fn finished(plan: &Plan, report: &Report, progress: &mut dyn SbProgress) {
    progress.note(&format!(
        "sandblaster finished: {} steps, {} passes, {} units run ({} backups issued, {} won), wrote {} read {}, {:.1} s; wrote {}",
        report.losses.len().saturating_sub(1),
        report.passes,
        report.units_run,
        report.backups_issued,
        report.backups_won,
        human_bytes(report.bytes.0 as f64),
        human_bytes(report.bytes.1 as f64),
        report.elapsed.as_secs_f64(),
        plan.out.display()
    ));
}
