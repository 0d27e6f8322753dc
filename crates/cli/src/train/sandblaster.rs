//! `gradwire train --sync sandblaster --workers N --servers S`: DistBelief's Sandblaster
//! L-BFGS (Dean et al. 2012, `gradwire_ps::sandblaster`) on the models and data sets of
//! `gradwire train`.
//!
//! - **Processes**: this process starts `--servers` shards (`gradwire ps serve`, or uses
//!   `--ps-servers`) and runs the coordinator and `--workers` worker threads itself. The
//!   parameters, the gradient and the L-BFGS history live on the shards; the coordinator
//!   runs the two-loop recursion as vector ops (dot, axpy, scale) executed on the shards.
//!   Each worker has its own connection and fetches the parameters once per pass.
//!   Deviation from DistBelief: workers are threads of one process and hand their unit
//!   results to the coordinator in memory (the library's simplification), not processes
//!   pushing to the shards, so no launcher mode exists.
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
//!   epoch prints the same JSON line as the other modes: `train_loss` is the full-batch loss
//!   after the epoch's last step, `test_accuracy` from the parameters on the shards,
//!   `compute_s` the time in gradient passes, `comm_s` the rest but evaluation (the
//!   coordinator's vector ops and the parameter fetch), `bytes_sent` / `bytes_pulled` the
//!   frame bytes written / read by the coordinator and all workers (measured, not
//!   estimated), plus `mode`, `servers`, `iterations`, `passes`, `units_run`,
//!   `backups_issued` and `backups_won`.
//!
//! `--optimizer`, `--lr`, `--batch`, `--max-steps`, `--codec` and the Downpour flags do not
//! apply and are refused by name (`gradwire_job::ps`).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use gradwire_ps::sandblaster::{run_observed, Progress, SandblasterConfig};
use gradwire_ps::Key;
use gradwire_train::sandblaster::ModelObjective;
use gradwire_train::{evaluate, Eval};

use crate::ps::ShardOptions;
use crate::train::ps::{PsPlan, SbPlan};
use crate::train::Plan;
use gradwire_job::plot::human_bytes;
use gradwire_run::report::records::EpochRecord;

/// Work units per worker per pass when `--sb-unit` is not given.
const UNITS_PER_WORKER: usize = 16;

/// Runs Sandblaster L-BFGS as `plan` says (this process is the coordinator).
pub fn run(plan: &Plan, ps: &PsPlan, sb: &SbPlan, quiet: bool) -> Result<()> {
    gradwire_train::init_threads(plan.threads);
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .with_context(|| format!("loading {}", plan.dataset.name()))?;
    let workers = plan.workers.max(1);
    let batch = sb.batch.unwrap_or(usize::MAX).min(data.train.len());
    let unit = sb
        .unit
        .unwrap_or_else(|| batch.div_ceil(UNITS_PER_WORKER * workers))
        .max(1);
    let objective = Arc::new(
        ModelObjective::new(
            plan.model,
            data.shape(),
            plan.train.seed,
            data.train.clone(),
            Some(batch),
            unit,
        )
        .context("building the Sandblaster objective")?,
    );
    let units = batch.div_ceil(unit);
    let dim = objective.initial_params().len();
    let mut shards = None;
    let addrs = if ps.addrs.is_empty() {
        // The coordinator is one more client (worker id `workers`).
        let s =
            crate::ps::start_shards(ps.servers, workers + 1, &ShardOptions::for_run(&plan.out))?;
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
    let mode = "sandblaster";
    eprintln!(
        "gradwire train: {} on {} ({} train / {} held out), --sync {mode}: L-BFGS m={} over a batch of {batch} in {units} units of {unit}, {workers} worker thread(s), {} shard(s), backups {}, {} steps/epoch x {} epochs",
        plan.model.name(),
        plan.dataset.name(),
        data.train.len(),
        data.test.len(),
        sb.history,
        addrs.len(),
        if sb.backups { "on" } else { "off" },
        sb.iters_per_epoch,
        plan.train.epochs
    );
    if units < 4 * workers {
        eprintln!(
            "gradwire train: warning: {units} units for {workers} workers: Sandblaster balances \
             load with many units per worker (lower --sb-unit)"
        );
    }
    std::fs::create_dir_all(&plan.out)
        .with_context(|| format!("creating {}", plan.out.display()))?;
    let _ = std::fs::remove_file(plan.out.join("metrics.jsonl"));
    let mut run = plan.run_record(workers, sb.iters_per_epoch);
    run.momentum_correction = None;
    let mut eval_model = plan.model.build(data.shape(), plan.train.seed)?;
    let mut failure: Option<anyhow::Error> = None;
    let mut mark = (Instant::now(), (0u64, 0u64), std::time::Duration::ZERO);
    let bar =
        (!quiet).then(|| crate::train::progress_bar(sb.iters_per_epoch, 0, plan.train.epochs));
    let mut observe = |p: &mut Progress<'_>| -> bool {
        if let Some(e) = objective.take_error() {
            failure = Some(anyhow::Error::new(e).context("a work unit failed"));
            return false;
        }
        if !p.loss.is_finite() {
            failure = Some(anyhow::anyhow!(
                "the full-batch loss is {} after L-BFGS step {}",
                p.loss,
                p.iteration
            ));
            return false;
        }
        let within = (p.iteration - 1) % sb.iters_per_epoch;
        if let Some(b) = &bar {
            b.set_position(within as u64 + 1);
            b.set_message(format!("loss {:.4} | {} passes", p.loss, p.passes));
        }
        if within + 1 != sb.iters_per_epoch {
            return true;
        }
        let epoch = p.iteration / sb.iters_per_epoch;
        match epoch_line(p, plan, ps, &data.test, &mut *eval_model, &mut mark, epoch) {
            Ok(rec) => {
                run.epochs.push(rec);
                if let Some(b) = &bar {
                    if epoch < plan.train.epochs {
                        b.reset();
                    }
                }
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
        objective.clone(),
        objective.initial_params(),
        workers,
        &cfg,
        &mut observe,
    )
    .context("Sandblaster L-BFGS")?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    drop(shards);
    if let Some(e) = failure {
        return Err(e);
    }
    if let Some(p) = &plan.save_params {
        crate::train::ps::save_params(p, &report.params)?;
    }
    crate::train::write_run(&run, &plan.out)?;
    let path = plan.out.join("run.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    v["ps"] = serde_json::json!({
        "mode": mode,
        "servers": addrs.len(),
        "history": sb.history,
        "batch": batch,
        "unit": unit,
        "units": units,
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
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "gradwire train: sandblaster finished: {} steps, {} passes, {} units run ({} backups issued, {} won), wrote {} read {}, {:.1} s; wrote {}",
        report.losses.len().saturating_sub(1),
        report.passes,
        report.units_run,
        report.backups_issued,
        report.backups_won,
        human_bytes(report.bytes.0 as f64),
        human_bytes(report.bytes.1 as f64),
        report.elapsed.as_secs_f64(),
        plan.out.display()
    );
    Ok(())
}

/// Evaluates the shards' parameters at the end of an epoch and prints its line.
#[allow(clippy::too_many_arguments)]
fn epoch_line(
    p: &mut Progress<'_>,
    plan: &Plan,
    ps: &PsPlan,
    test: &gradwire_train::data::Split,
    model: &mut dyn gradwire_train::Model,
    mark: &mut (Instant, (u64, u64), std::time::Duration),
    epoch: usize,
) -> Result<EpochRecord> {
    let (start, bytes0, pass0) = *mark;
    let params = p.params().context("fetching the parameters")?;
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
    let mut line = serde_json::to_value(&rec)?;
    line["servers"] = ps.addrs.len().max(ps.servers).into();
    line["mode"] = "sandblaster".into();
    line["bytes_pulled"] = bytes.1.saturating_sub(bytes0.1).into();
    line["iterations"] = p.iteration.into();
    line["passes"] = p.passes.into();
    line["units_run"] = p.units_run.into();
    line["backups_issued"] = p.backups_issued.into();
    line["backups_won"] = p.backups_won.into();
    println!("{}", serde_json::to_string(&line)?);
    eprintln!(
        "epoch {}/{}: loss {:.4} | acc {:.2}% | {:.1} s (passes {:.1}) | {} passes, {} units ({} backups won) | wrote {} read {}",
        epoch,
        plan.train.epochs,
        p.loss,
        e.accuracy() * 100.0,
        wall_s,
        compute_s,
        p.passes,
        p.units_run,
        p.backups_won,
        human_bytes(line["bytes_sent"].as_f64().unwrap_or(0.0)),
        human_bytes(line["bytes_pulled"].as_f64().unwrap_or(0.0))
    );
    let append = |path: &std::path::Path| -> Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        writeln!(f, "{line}").with_context(|| format!("writing {}", path.display()))
    };
    append(&plan.out.join("metrics.jsonl"))?;
    if let Some(j) = &plan.json {
        append(j)?;
    }
    // The next epoch's clock starts after this one's evaluation.
    *mark = (Instant::now(), bytes, p.pass_time);
    Ok(rec)
}
