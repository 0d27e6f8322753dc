//! Checkpoints of a job (`--checkpoint-every N`, `--resume DIR`): the run's configuration
//! as a checkpoint records it, writing one checkpoint with every rank (each rank's file, a
//! barrier, rank 0's completion marker, pruning), and reading the one to resume from,
//! refused when it belongs to another configuration.
//!
//! The files and their format are gradwire-train's ([`gradwire_train::checkpoint`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use gradwire_run::report::records::EpochRecord;
use gradwire_train::checkpoint::store;
use gradwire_train::{Checkpoint, GradientSync, Trainer};
use serde_json::Value;

use crate::Plan;

/// The most bytes of a resumed run's `metrics.jsonl` read (one line per epoch).
pub const MAX_METRICS_BYTES: u64 = 64 << 20;

/// Why a checkpoint cannot be written or resumed from.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The checkpoint folder holds no complete step.
    #[error("--resume {resume}: no complete checkpoint in {dir} (was the run started with --checkpoint-every?)")]
    NoneComplete {
        /// The folder given to `--resume`.
        resume: PathBuf,
        /// Its checkpoint folder.
        dir: PathBuf,
    },
    /// This rank's file of the step cannot be read.
    #[error("--resume {resume}: step {step}: {source}")]
    Read {
        /// The folder given to `--resume`.
        resume: PathBuf,
        /// The step.
        step: u64,
        /// Why.
        source: gradwire_train::Error,
    },
    /// The checkpoint's configuration is not a JSON object.
    #[error("the checkpoint's configuration is not a JSON object")]
    Config,
    /// The checkpoint belongs to another configuration.
    #[error("--resume {resume}: the checkpoint of step {step} ({file}) belongs to another configuration: {}", differences.join("; "))]
    Mismatch {
        /// The folder given to `--resume`.
        resume: PathBuf,
        /// The step.
        step: u64,
        /// The rank's file.
        file: PathBuf,
        /// Each differing setting, `key: checkpoint X, this run Y`.
        differences: Vec<String>,
    },
    /// The ranks restored different steps.
    #[error("the ranks resumed from different checkpoints (this rank: step {0})")]
    Disagree(u64),
    /// Writing this rank's file failed.
    #[error("rank {rank}: writing the checkpoint of step {step}: {source}")]
    Write {
        /// This rank.
        rank: usize,
        /// The step.
        step: u64,
        /// Why.
        source: gradwire_train::Error,
    },
    /// Another rank failed to write its file.
    #[error("another rank failed to write its checkpoint of step {0}")]
    OtherRank(u64),
    /// The checkpoint folder or the ranks' agreement failed.
    #[error(transparent)]
    Train(#[from] gradwire_train::Error),
    /// The resumed run's metrics cannot be read.
    #[error("reading {path}: {source}")]
    Metrics {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The resumed run's metrics are larger than [`MAX_METRICS_BYTES`].
    #[error("{0}: larger than {MAX_METRICS_BYTES} bytes")]
    MetricsSize(PathBuf),
    /// A line of the resumed run's metrics is not an epoch record.
    #[error("{path} line {line}: {source}")]
    MetricsLine {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// Why.
        source: serde_json::Error,
    },
}

/// The checkpoint folder of a run's `--out` folder.
pub fn dir(out: &Path) -> PathBuf {
    out.join("checkpoints")
}

/// Everything that decides a run's trajectory, as JSON: a resumed run must match it
/// (the evaluation, output and thread settings may differ).
pub fn config_json(plan: &Plan, world: usize) -> String {
    config_value(plan, world).to_string()
}

fn config_value(plan: &Plan, world: usize) -> Value {
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
}

/// The software that writes a checkpoint: version and git revision.
pub fn software() -> String {
    format!(
        "gradwire {} ({})",
        env!("CARGO_PKG_VERSION"),
        gradwire_run::GIT_REV
    )
}

/// The settings where `saved` (a checkpoint's configuration, untrusted) and `current`
/// differ, as `key: checkpoint X, this run Y`.
fn differences(saved: &str, current: &Value) -> Result<Vec<String>, CheckpointError> {
    let saved: Value = serde_json::from_str(saved).map_err(|_| CheckpointError::Config)?;
    let (Value::Object(s), Value::Object(c)) = (&saved, current) else {
        return Err(CheckpointError::Config);
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
pub fn load(
    resume: &Path,
    plan: &Plan,
    rank: usize,
    world: usize,
) -> Result<Checkpoint, CheckpointError> {
    let dir = dir(resume);
    let steps = store::complete_steps(&dir)?;
    let Some(&step) = steps.last() else {
        return Err(CheckpointError::NoneComplete {
            resume: resume.to_path_buf(),
            dir,
        });
    };
    let ckpt = store::read_rank(&dir, step, rank).map_err(|source| CheckpointError::Read {
        resume: resume.to_path_buf(),
        step,
        source,
    })?;
    let differences = differences(&ckpt.config, &config_value(plan, world))?;
    if !differences.is_empty() {
        return Err(CheckpointError::Mismatch {
            resume: resume.to_path_buf(),
            step,
            file: store::rank_file(&dir, step, rank),
            differences,
        });
    }
    Ok(ckpt)
}

/// After [`Trainer::restore`] on every rank: checks that all resumed the same step.
pub fn agree<S: GradientSync>(trainer: &mut Trainer<S>, step: u64) -> Result<(), CheckpointError> {
    let mut v = [step as f64];
    trainer.sync_mut().average_metrics(&mut v)?;
    if v[0] != step as f64 {
        return Err(CheckpointError::Disagree(step));
    }
    Ok(())
}

/// Writes this rank's checkpoint of the current step into `plan.out`'s checkpoint folder;
/// once every rank's is written (a barrier), rank 0 marks the step complete and prunes the
/// older ones. Its seconds on this rank.
pub fn save<S: GradientSync>(
    trainer: &mut Trainer<S>,
    plan: &Plan,
    world: usize,
) -> Result<f64, CheckpointError> {
    let t0 = Instant::now();
    let dir = dir(&plan.out);
    let (rank, step) = (trainer.sync().rank(), trainer.global_step());
    let written = trainer
        .checkpoint(config_json(plan, world), software())
        .and_then(|c| store::write_rank(&dir, step, rank, &c));
    let mut ok = [if written.is_ok() { 1.0 } else { 0.0 }];
    trainer.sync_mut().average_metrics(&mut ok)?;
    written.map_err(|source| CheckpointError::Write { rank, step, source })?;
    if ok[0] != 1.0 {
        return Err(CheckpointError::OtherRank(step));
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
pub fn finished_epochs(
    resume: &Path,
    epoch: u64,
) -> Result<Vec<(String, EpochRecord)>, CheckpointError> {
    let path = resume.join("metrics.jsonl");
    let io = |source| CheckpointError::Metrics {
        path: path.clone(),
        source,
    };
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    let mut text = String::new();
    file.take(MAX_METRICS_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_METRICS_BYTES {
        return Err(CheckpointError::MetricsSize(path));
    }
    let mut done = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let rec: EpochRecord =
            serde_json::from_str(line).map_err(|source| CheckpointError::MetricsLine {
                path: path.clone(),
                line: i + 1,
                source,
            })?;
        if (rec.epoch as u64) <= epoch {
            done.push((line.to_string(), rec));
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_each_setting() {
        let current = serde_json::json!({"world_size": 2, "codec": "none", "seed": 1});
        let d = differences(r#"{"world_size":4,"codec":"none","seed":1}"#, &current).unwrap();
        assert_eq!(d, vec!["world_size: checkpoint 4, this run 2".to_string()]);
        let d = differences(r#"{"codec":"none","seed":1,"extra":true}"#, &current).unwrap();
        assert_eq!(
            d,
            vec![
                "extra: checkpoint true, this run (absent)".to_string(),
                "world_size: checkpoint (absent), this run 2".to_string()
            ]
        );
        assert!(matches!(
            differences("[1,2]", &current),
            Err(CheckpointError::Config)
        ));
        assert!(matches!(
            differences("{not json", &current),
            Err(CheckpointError::Config)
        ));
    }

    #[test]
    fn finished_epochs_keep_the_lines_up_to_the_checkpoint_and_refuse_bad_ones() {
        let dir = std::env::temp_dir().join(format!("gw-job-finished-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(
            finished_epochs(&dir, 3).unwrap().is_empty(),
            "no file, no epochs"
        );
        let line = |e: usize| {
            format!(
                r#"{{"epoch":{e},"train_loss":0.5,"wall_s":1.0,"compute_s":0.5,"comm_s":0.5,"bytes_sent":10,"compression_ratio":1.0}}"#
            )
        };
        std::fs::write(
            dir.join("metrics.jsonl"),
            format!("{}\n\n{}\n{}\n", line(1), line(2), line(3)),
        )
        .unwrap();
        let done = finished_epochs(&dir, 2).unwrap();
        assert_eq!(
            done.iter()
                .map(|(l, r)| (l.clone(), r.epoch))
                .collect::<Vec<_>>(),
            vec![(line(1), 1), (line(2), 2)]
        );
        std::fs::write(dir.join("metrics.jsonl"), "{\"epoch\": \"one\"}\n").unwrap();
        assert!(matches!(
            finished_epochs(&dir, 2),
            Err(CheckpointError::MetricsLine { line: 1, .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
