//! Checkpoints of `gradwire train` (`--checkpoint-every N`, `--resume DIR`): what the run's
//! configuration is as a checkpoint records it, writing one checkpoint with every rank
//! (each rank's file, a barrier, rank 0's completion marker, pruning), and reading the one
//! to resume from, refused when it belongs to another configuration.
//!
//! The files and their format are gradwire-train's ([`gradwire_train::checkpoint`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gradwire_train::checkpoint::store;
use gradwire_train::{Checkpoint, GradientSync, Trainer};
use serde_json::Value;

use crate::records::EpochRecord;
use crate::train::Plan;

/// The checkpoint folder of a run's `--out` folder.
pub fn dir(out: &Path) -> PathBuf {
    out.join("checkpoints")
}

/// Everything that decides a run's trajectory, as JSON: a resumed run must match it
/// (the evaluation, output and thread settings may differ).
pub fn config_json(plan: &Plan, world: usize) -> String {
    let t = &plan.train;
    serde_json::json!({
        "model": plan.model.to_string(),
        "dataset": plan.dataset.name(),
        "codec": plan.codec.to_string(),
        "sync": format!("{:?}", plan.sync),
        "rules": plan.rules.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "momentum_correction": plan.momentum_correction,
        "optimizer": t.optimizer.to_string(),
        "local_clip": t.local_clip,
        "batch": t.batch_size,
        "epochs": t.epochs,
        "max_steps": t.max_steps_per_epoch,
        "seed": t.seed,
        "seq_len": plan.seq_len,
        "overlap_steps": t.overlap_steps,
        "world_size": world,
    })
    .to_string()
}

/// The software that writes a checkpoint: version and git revision.
pub fn software() -> String {
    format!(
        "gradwire {} ({})",
        env!("CARGO_PKG_VERSION"),
        gradwire_run::GIT_REV
    )
}

/// The settings where `saved` and `current` (both [`config_json`]) differ, as
/// `key: checkpoint X, this run Y`.
fn differences(saved: &str, current: &str) -> Result<Vec<String>> {
    let saved: Value = serde_json::from_str(saved).context("the checkpoint's configuration")?;
    let current: Value = serde_json::from_str(current).expect("config_json is JSON");
    let (Value::Object(s), Value::Object(c)) = (&saved, &current) else {
        bail!("the checkpoint's configuration is not a JSON object");
    };
    let mut keys: Vec<&String> = s.keys().chain(c.keys()).collect();
    keys.sort();
    keys.dedup();
    Ok(keys
        .into_iter()
        .filter(|k| s.get(*k) != c.get(*k))
        .map(|k| {
            let show = |v: Option<&Value>| v.map_or("(absent)".into(), Value::to_string);
            format!(
                "{k}: checkpoint {}, this run {}",
                show(s.get(k)),
                show(c.get(k))
            )
        })
        .collect())
}

/// This rank's checkpoint of the newest complete step in `resume`'s checkpoint folder,
/// checked against this run's configuration.
pub fn load(resume: &Path, plan: &Plan, rank: usize, world: usize) -> Result<Checkpoint> {
    let dir = dir(resume);
    let steps = store::complete_steps(&dir)?;
    let Some(&step) = steps.last() else {
        bail!(
            "--resume {}: no complete checkpoint in {} (was the run started with --checkpoint-every?)",
            resume.display(),
            dir.display()
        );
    };
    let ckpt = store::read_rank(&dir, step, rank)
        .with_context(|| format!("--resume {}: step {step}", resume.display()))?;
    let diff = differences(&ckpt.config, &config_json(plan, world))?;
    if !diff.is_empty() {
        bail!(
            "--resume {}: the checkpoint of step {step} ({}) belongs to another configuration: {}",
            resume.display(),
            store::rank_file(&dir, step, rank).display(),
            diff.join("; ")
        );
    }
    Ok(ckpt)
}

/// After [`Trainer::restore`] on every rank: checks that all resumed the same step.
pub fn agree<S: GradientSync>(trainer: &mut Trainer<S>, step: u64) -> Result<()> {
    let mut v = [step as f64];
    trainer.sync_mut().average_metrics(&mut v)?;
    if v[0] != step as f64 {
        bail!("the ranks resumed from different checkpoints (this rank: step {step})");
    }
    Ok(())
}

/// Writes this rank's checkpoint of the current step into `out`'s checkpoint folder; once
/// every rank's is written (a barrier), rank 0 marks the step complete and prunes the older
/// ones. Its seconds on this rank.
pub fn save<S: GradientSync>(trainer: &mut Trainer<S>, plan: &Plan, world: usize) -> Result<f64> {
    let t0 = Instant::now();
    let dir = dir(&plan.out);
    let (rank, step) = (trainer.sync().rank(), trainer.global_step());
    let written = trainer
        .checkpoint(config_json(plan, world), software())
        .map_err(anyhow::Error::from)
        .and_then(|c| Ok(store::write_rank(&dir, step, rank, &c)?));
    let mut ok = [if written.is_ok() { 1.0 } else { 0.0 }];
    trainer.sync_mut().average_metrics(&mut ok)?;
    written.with_context(|| format!("rank {rank}: writing the checkpoint of step {step}"))?;
    if ok[0] != 1.0 {
        bail!("another rank failed to write its checkpoint of step {step}");
    }
    if rank == 0 {
        store::write_marker(&dir, step, world)?;
        store::prune(&dir)?;
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// The lines of `resume`'s `metrics.jsonl` for the epochs a checkpoint at `epoch`
/// (0-based, the one being run) has finished, as written (byte for byte) and as records;
/// none when the file is absent.
pub fn finished_epochs(resume: &Path, epoch: u64) -> Result<Vec<(String, EpochRecord)>> {
    let path = resume.join("metrics.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut done = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let rec: EpochRecord = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        if (rec.epoch as u64) <= epoch {
            done.push((line.to_string(), rec));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::differences;

    #[test]
    fn differences_name_each_setting() {
        let d = differences(
            r#"{"world_size":4,"codec":"none","seed":1}"#,
            r#"{"world_size":2,"codec":"none","seed":1}"#,
        )
        .unwrap();
        assert_eq!(d, vec!["world_size: checkpoint 4, this run 2".to_string()]);
    }
}
