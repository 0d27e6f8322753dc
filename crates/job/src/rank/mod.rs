//! One rank of a data-parallel job under the all-reduce engine: the rank's transport behind
//! the emulated link and split into groups under model parallelism ([`train_rank`]), the
//! engine it starts ([`engine_config`]), its epochs, on-disk checkpoints and timeline and,
//! on the reporting rank, the run's records (`metrics.jsonl`, `--json`, `run.json`, plots)
//! and its news to the front end ([`Progress`]); one worker of an elastic run
//! ([`elastic`]); Sandblaster L-BFGS, this process the coordinator ([`sandblaster`]).

use std::path::{Path, PathBuf};

use gradwire_run::report::records::{EpochRecord, RunRecord};
use gradwire_train::data::Dataset;
use gradwire_train::{Checkpoint, EngineSync, GradientSync, StepInfo, Trainer};
use gradwire_transport::link::Throttled;
use gradwire_transport::Transport;

use crate::checkpoint;
use crate::model_parallel::RankGroups;
use crate::Plan;

pub mod elastic;
mod engine;
mod epochs;
mod error;
mod output;
mod parallel;
mod progress;
mod ps;
pub mod sandblaster;

pub use engine::{engine_config, record_partition_plan};
pub use error::RankError;
pub use output::{rank_path, record, save_params, write_run};
pub use parallel::{build, save_whole};
pub use progress::{EpochNews, Progress, Silent};
pub use ps::{merge_worker_reports, ps_partition, ps_worker, worker_file, PsWorker};

use epochs::{run_epochs, Course, Mode};

/// Trains on one rank, behind the emulated link when the plan has one; the reporting rank
/// tells `progress`. Under model parallelism the world first splits into this rank's replica
/// and partition group (both behind the link), and stays open, unused, until the run ends.
pub fn train_rank<T: Transport + 'static>(
    mut t: T,
    plan: &Plan,
    progress: &mut dyn Progress,
) -> Result<(), RankError> {
    if let Some(mp) = &plan.model_parallel {
        let RankGroups {
            index,
            replica,
            group,
        } = mp.split_world(&mut t)?;
        let (replica, group): (Box<dyn Transport>, Box<dyn Transport>) = match &plan.link {
            Some(cfg) => (
                Box::new(Throttled::new(replica, cfg)),
                Box::new(Throttled::new(group, cfg)),
            ),
            None => (replica, group),
        };
        let kept = run_rank(group, plan, progress, Some((index, replica)))?;
        if let Some(path) = &plan.save_params {
            save_whole(&mut t, mp, plan, kept, path)?;
        }
        return Ok(());
    }
    match &plan.link {
        Some(cfg) => run_rank(Throttled::new(t, cfg), plan, progress, None).map(drop),
        None => run_rank(t, plan, progress, None).map(drop),
    }
}

/// A rank's trainer over the engine, and what it started from.
struct Started {
    trainer: Trainer<EngineSync>,
    data: Dataset,
    resume: Option<Checkpoint>,
    rank: usize,
    world: usize,
    reporting: bool,
}

/// Trains on one rank over `t`; rank 0 reports. With `partition` (model parallelism: this
/// rank's partition index and its replica's transport), `t` is the partition group and the
/// model is that partition of the whole; partition 0 of replica 0 reports, and replica 0's
/// partitions return their final parameters when the plan saves them.
fn run_rank<T: Transport + 'static>(
    t: T,
    plan: &Plan,
    progress: &mut dyn Progress,
    partition: Option<(usize, Box<dyn Transport>)>,
) -> Result<Option<Vec<f32>>, RankError> {
    let part_index = partition.as_ref().map(|(j, _)| *j);
    let mut s = start(t, plan, partition)?;
    let steps = s.trainer.steps_per_epoch(s.data.train.len());
    let mut run = plan.run_record(s.world, steps);
    if s.reporting {
        announce(plan, &s, steps, progress);
        record_partition_plan(plan, s.data.shape(), &mut run, progress)?;
        run.epochs = start_metrics(plan, s.resume.as_ref())?;
        if let (Some(ck), Some(dir)) = (&s.resume, &plan.resume) {
            progress.note(&format!(
                "resumed from {} at step {} (epoch {}, step {} of it)",
                dir.display(),
                ck.global_step,
                ck.epoch + 1,
                ck.step_in_epoch
            ));
        }
    }
    epochs(&mut s, plan, steps, &mut run, progress)?;
    let kept = match (&plan.save_params, s.rank, part_index) {
        (Some(p), 0, None) => {
            save_params(p, s.trainer.params())?;
            None
        }
        (Some(_), 0, Some(_)) => Some(s.trainer.params().to_vec()),
        _ => None,
    };
    finish(s, plan, run, progress)?;
    Ok(kept)
}

/// Loads the data, builds the model (or this rank's partition of it), starts the engine and
/// the trainer, and restores the checkpoint being resumed.
fn start<T: Transport + 'static>(
    t: T,
    plan: &Plan,
    partition: Option<(usize, Box<dyn Transport>)>,
) -> Result<Started, RankError> {
    gradwire_train::init_threads(plan.threads);
    let (rank, world) = (t.rank(), t.world_size());
    let part_index = partition.as_ref().map(|(j, _)| *j);
    let resume = match &plan.resume {
        Some(dir) => Some(checkpoint::load(dir, plan, rank, world)?),
        None => None,
    };
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .map_err(|source| RankError::Load {
            rank,
            dataset: plan.dataset.name(),
            source,
        })?;
    let model = match (partition, &plan.model_parallel) {
        (Some((j, replica)), Some(mp)) => {
            build(mp, plan.model, data.shape(), plan.train.seed, j, replica)?
        }
        _ => plan.model.build(data.shape(), plan.train.seed)?,
    };
    // The engine's schedules (DGC's warm-up in epochs) need at least one step per epoch.
    let steps_guess = gradwire_train::steps_per_epoch(data.train.len(), world, &plan.train).max(1);
    // The host hierarchy is the world's; a partition group's ranks are spread over it.
    let hosts = match part_index {
        None => gradwire_engine::host_config_from_env(rank, world)?,
        Some(_) => None,
    };
    let sync = EngineSync::new(t, engine_config(plan, hosts), &model.tensors(), steps_guess)
        .map_err(|source| RankError::Engine { rank, source })?;
    let mut trainer = Trainer::new(model, sync, plan.train.clone(), data.train.len())?;
    if let Some(ck) = &resume {
        trainer.restore(ck).map_err(|source| RankError::Restore {
            rank,
            step: ck.global_step,
            source,
        })?;
        checkpoint::agree(&mut trainer, ck.global_step)?;
    }
    Ok(Started {
        trainer,
        data,
        resume,
        rank,
        world,
        reporting: rank == 0 && part_index.unwrap_or(0) == 0,
    })
}

/// The reporting rank's first lines: what trains on what, and the plan's warning if any.
fn announce(plan: &Plan, s: &Started, steps: usize, progress: &mut dyn Progress) {
    let workers = match &plan.model_parallel {
        Some(mp) => format!(
            "{} replica(s) x {} partitions ({})",
            s.world, mp.partitions, mp.split
        ),
        None => format!("{} worker(s)", s.world),
    };
    progress.note(&format!(
        "{} on {} ({} train / {} held out), {workers}, codec {}{}, {} steps/epoch x {} epochs, batch {} per worker",
        plan.model,
        plan.dataset.name(),
        s.data.train.len(),
        s.data.test.len(),
        match &plan.codec_choice {
            Some(c) => format!("auto ({})", c.summary()),
            None => plan.codec.to_string(),
        },
        plan.momentum_correction
            .map_or(String::new(), |(b, _)| format!(" (momentum correction {b})")),
        steps,
        plan.train.epochs,
        plan.train.batch_size
    ));
    if let Some(w) = plan.momentum_warning() {
        progress.note(&format!("warning: {w}"));
    }
}

/// Starts `metrics.jsonl` in `plan.out`: empty, or for a resumed run with the finished
/// epochs' lines of the run it continues (read before the file is started afresh: `--out`
/// may be the resumed folder). Those epochs' records.
fn start_metrics(
    plan: &Plan,
    resume: Option<&Checkpoint>,
) -> Result<Vec<gradwire_run::report::records::EpochRecord>, RankError> {
    let done = match (resume, &plan.resume) {
        (Some(ck), Some(dir)) => checkpoint::finished_epochs(dir, ck.epoch)?,
        _ => Vec::new(),
    };
    std::fs::create_dir_all(&plan.out).map_err(|source| RankError::Write {
        path: plan.out.clone(),
        source,
    })?;
    let path = plan.out.join("metrics.jsonl");
    let _ = std::fs::remove_file(&path);
    if !done.is_empty() {
        let lines: String = done.iter().map(|(l, _)| format!("{l}\n")).collect();
        std::fs::write(&path, lines).map_err(|source| RankError::Write { path, source })?;
    }
    Ok(done.into_iter().map(|(_, r)| r).collect())
}

/// The all-reduce engine's part in the epoch loop: a checkpoint every
/// `plan.checkpoint_every` steps, the bytes each step sent, the record as the epoch's line.
struct Dense<'a> {
    plan: &'a Plan,
    world: usize,
    checkpoints: u32,
    checkpoint_s: f64,
}

impl Mode<EngineSync> for Dense<'_> {
    fn pause_at(&self, trainer: &Trainer<EngineSync>) -> Option<u64> {
        let every = self.plan.checkpoint_every;
        (every > 0).then(|| (trainer.global_step() / every + 1) * every)
    }

    fn at_pause(&mut self, trainer: &mut Trainer<EngineSync>) -> Result<(), RankError> {
        self.checkpoint_s += checkpoint::save(trainer, self.plan, self.world)?;
        self.checkpoints += 1;
        Ok(())
    }

    fn step_bytes(&self, step: &StepInfo) -> Option<u64> {
        Some(step.sync.bytes_sent)
    }

    fn epoch_starts(&mut self, _: &Trainer<EngineSync>) {}

    fn line(
        &self,
        _: &Trainer<EngineSync>,
        record: &EpochRecord,
    ) -> Result<(String, Option<u64>), RankError> {
        let line = serde_json::to_string(record).map_err(|source| RankError::Json {
            what: "an epoch record",
            source,
        })?;
        Ok((line, None))
    }

    fn epoch_failed(&self, _: usize, source: gradwire_train::Error) -> RankError {
        RankError::Train(source)
    }
}

/// The epochs left, with a checkpoint every `plan.checkpoint_every` steps; the reporting rank
/// records each epoch in `run`, `metrics.jsonl` and `--json`.
fn epochs(
    s: &mut Started,
    plan: &Plan,
    steps: usize,
    run: &mut RunRecord,
    progress: &mut dyn Progress,
) -> Result<(), RankError> {
    let mut dense = Dense {
        plan,
        world: s.world,
        checkpoints: 0,
        checkpoint_s: 0.0,
    };
    let course = Course {
        plan,
        data: &s.data,
        steps,
        reporting: s.reporting,
    };
    run_epochs(&mut s.trainer, &course, run, progress, &mut dense)?;
    if s.reporting && dense.checkpoints > 0 {
        progress.note(&format!(
            "{} checkpoint(s) in {}, {:.1} ms each on rank 0",
            dense.checkpoints,
            checkpoint::dir(&plan.out).display(),
            dense.checkpoint_s * 1e3 / f64::from(dense.checkpoints)
        ));
    }
    Ok(())
}

/// After the last epoch: every rank's timeline (rank 0 merges them and draws one step),
/// the engine's statistics into `run.json` on the reporting rank, and the engine's shutdown.
fn finish(
    s: Started,
    plan: &Plan,
    mut run: RunRecord,
    progress: &mut dyn Progress,
) -> Result<(), RankError> {
    let (rank, world, reporting) = (s.rank, s.world, s.reporting);
    let (_, mut sync) = s.trainer.into_parts();
    let stats = sync.stats();
    if let Some(path) = &plan.timeline {
        let mine = rank_path(path, rank);
        sync.write_timeline(&mine)
            .map_err(|source| RankError::RankTimeline {
                path: mine.clone(),
                source,
            })?;
        // Every rank's file is written before rank 0 merges them.
        sync.average_metrics(&mut [0.0])?;
        if rank == 0 {
            merge_timeline(path, world, progress)?;
        }
    }
    if reporting {
        run.engine = Some(serde_json::json!({
            "bytes": stats.bytes,
            "compression_ratio": stats.bytes.compression_ratio(),
            "stragglers": {
                "collectives": stats.stragglers.collectives,
                "last_count": stats.stragglers.last_count,
                "mean_lag_us": stats.stragglers.mean_lag_us,
                "max_lag_us": stats.stragglers.max_lag_us,
            },
            "stalls": stats.stalls.len(),
            "negotiation_rounds": stats.cycles,
            "policies": sync
                .engine()
                .policies()
                .iter()
                .map(|p| format!("{}: {} @ {:?}", p.tensor.name, p.codec, p.strategy))
                .collect::<Vec<_>>(),
        }));
        write_run(&run, &plan.out, progress)?;
        progress.note(&format!("wrote {}", plan.out.display()));
    }
    sync.shutdown()?;
    Ok(())
}

/// Rank 0 merges every rank's timeline file into `path` and draws one step as `.png`.
fn merge_timeline(path: &Path, world: usize, progress: &mut dyn Progress) -> Result<(), RankError> {
    let files: Vec<PathBuf> = (0..world).map(|r| rank_path(path, r)).collect();
    let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    gradwire_engine::merge_traces(&refs, path).map_err(|source| RankError::Timeline {
        path: path.to_path_buf(),
        source,
    })?;
    let png = path.with_extension("png");
    progress.note(&match crate::plot::plot_step(path, &png) {
        Ok(()) => format!(
            "timeline in {} (open in Perfetto), one step drawn in {}",
            path.display(),
            png.display()
        ),
        Err(e) => format!(
            "timeline in {} (open in Perfetto); step chart not drawn ({e})",
            path.display()
        ),
    });
    Ok(())
}
