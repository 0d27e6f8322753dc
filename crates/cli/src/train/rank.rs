//! One rank's training: the rank's transport behind the emulated link and split into groups
//! under model parallelism ([`run_linked`]), the engine it starts ([`engine_config`]), its
//! epochs, checkpoints, timeline and, on the reporting rank, the run's records.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use gradwire_train::{EngineConfig, EngineSync, GradientSync, MomentumConfig, StepInfo, Trainer};
use gradwire_transport::link::Throttled;
use gradwire_transport::Transport;

use super::output::{progress_bar, record, write_run};
use crate::plot::human_bytes;
use crate::records::{append_jsonl, RunRecord};
use gradwire_job::Plan;

/// Trains on one rank, behind the emulated link when the plan has one. Under model
/// parallelism the world first splits into this rank's replica and partition group (both
/// behind the link), and stays open, unused, until the run ends.
pub(super) fn run_linked<T: Transport + 'static>(mut t: T, plan: &Plan, quiet: bool) -> Result<()> {
    if let Some(mp) = &plan.model_parallel {
        let crate::train_parallel::RankGroups {
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
        let kept = run_rank(group, plan, quiet, Some((index, replica)))?;
        if let Some(path) = &plan.save_params {
            crate::train_parallel::save_whole(&mut t, mp, plan, kept, path)?;
        }
        return Ok(());
    }
    match &plan.link {
        Some(cfg) => run_rank(Throttled::new(t, cfg), plan, quiet, None).map(drop),
        None => run_rank(t, plan, quiet, None).map(drop),
    }
}

/// Trains on one rank over `t`; rank 0 reports. With `partition` (model parallelism: this
/// rank's partition index and its replica's transport), `t` is the partition group and the
/// model is that partition of the whole; partition 0 of replica 0 reports, and replica 0's
/// partitions return their final parameters when the plan saves them.
fn run_rank<T: Transport + 'static>(
    t: T,
    plan: &Plan,
    quiet: bool,
    partition: Option<(usize, Box<dyn Transport>)>,
) -> Result<Option<Vec<f32>>> {
    gradwire_train::init_threads(plan.threads);
    let (rank, world) = (t.rank(), t.world_size());
    let part_index = partition.as_ref().map(|(j, _)| *j);
    let resume = match &plan.resume {
        Some(dir) => Some(gradwire_job::checkpoint::load(dir, plan, rank, world)?),
        None => None,
    };
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .with_context(|| format!("rank {rank}: loading {}", plan.dataset.name()))?;
    let model = match (partition, &plan.model_parallel) {
        (Some((j, replica)), Some(mp)) => {
            crate::train_parallel::build(mp, plan.model, data.shape(), plan.train.seed, j, replica)?
        }
        _ => plan.model.build(data.shape(), plan.train.seed)?,
    };
    // The engine's schedules (DGC's warm-up in epochs) need at least one step per epoch.
    let steps_guess = gradwire_train::steps_per_epoch(data.train.len(), world, &plan.train).max(1);
    // The host hierarchy is the world's; a partition group's ranks are spread over it.
    let hosts = match part_index {
        None => crate::hier::engine_hosts(rank, world)?,
        Some(_) => None,
    };
    let engine = engine_config(plan, hosts);
    let sync = EngineSync::new(t, engine, &model.tensors(), steps_guess)
        .with_context(|| format!("rank {rank}: starting the engine"))?;
    let mut trainer = Trainer::new(model, sync, plan.train.clone(), data.train.len())?;
    if let Some(ck) = &resume {
        trainer
            .restore(ck)
            .with_context(|| format!("rank {rank}: resuming from step {}", ck.global_step))?;
        gradwire_job::checkpoint::agree(&mut trainer, ck.global_step)?;
    }
    let steps = trainer.steps_per_epoch(data.train.len());
    let reporting = rank == 0 && part_index.unwrap_or(0) == 0;
    if reporting {
        let workers = match &plan.model_parallel {
            Some(mp) => format!(
                "{world} replica(s) x {} partitions ({})",
                mp.partitions, mp.split
            ),
            None => format!("{world} worker(s)"),
        };
        eprintln!(
            "gradwire train: {} on {} ({} train / {} held out), {workers}, codec {}{}, {} steps/epoch x {} epochs, batch {} per worker",
            plan.model,
            plan.dataset.name(),
            data.train.len(),
            data.test.len(),
            match &plan.codec_choice {
                Some(c) => format!("auto ({})", c.summary()),
                None => plan.codec.to_string(),
            },
            plan.momentum_correction
                .map_or(String::new(), |(b, _)| format!(" (momentum correction {b})")),
            steps,
            plan.train.epochs,
            plan.train.batch_size
        );
        if let Some(w) = plan.momentum_warning() {
            eprintln!("gradwire train: warning: {w}");
        }
    }
    let mut run = plan.run_record(world, steps);
    if reporting {
        record_partition_plan(plan, data.shape(), &mut run)?;
    }
    if reporting {
        // A resumed run's metrics continue the finished epochs' lines (read before
        // metrics.jsonl is started afresh: --out may be the resumed folder).
        let done = match (&resume, &plan.resume) {
            (Some(ck), Some(dir)) => gradwire_job::checkpoint::finished_epochs(dir, ck.epoch)?,
            _ => Vec::new(),
        };
        std::fs::create_dir_all(&plan.out)
            .with_context(|| format!("creating {}", plan.out.display()))?;
        let _ = std::fs::remove_file(plan.out.join("metrics.jsonl"));
        if !done.is_empty() {
            let lines: String = done.iter().map(|(l, _)| format!("{l}\n")).collect();
            let path = plan.out.join("metrics.jsonl");
            std::fs::write(&path, lines).with_context(|| format!("writing {}", path.display()))?;
        }
        run.epochs = done.into_iter().map(|(_, r)| r).collect();
    }
    if let (Some(ck), Some(dir), true) = (&resume, &plan.resume, reporting) {
        eprintln!(
            "gradwire train: resumed from {} at step {} (epoch {}, step {} of it)",
            dir.display(),
            ck.global_step,
            ck.epoch + 1,
            ck.step_in_epoch
        );
    }
    let (mut ckpt_n, mut ckpt_s) = (0u32, 0.0f64);
    let mut last_acc = String::new();
    let mut total_bytes = 0u64;
    while (trainer.epoch() as usize) < plan.train.epochs {
        let epoch = trainer.epoch() as usize;
        let bar = (reporting && !quiet).then(|| progress_bar(steps, epoch, plan.train.epochs));
        let start = Instant::now();
        let mut epoch_bytes = 0u64;
        let mut on_step = |s: &StepInfo| {
            epoch_bytes += s.sync.bytes_sent;
            if let Some(b) = &bar {
                b.set_position(s.step as u64 + 1);
                let ms = start.elapsed().as_secs_f64() * 1e3 / (s.step + 1) as f64;
                b.set_message(format!(
                    "loss {:.4}{last_acc} | {ms:.0} ms/step | sent {}",
                    s.loss,
                    human_bytes((total_bytes + epoch_bytes) as f64)
                ));
            }
        };
        let every = plan.checkpoint_every;
        let stats = loop {
            let pause = (every > 0).then(|| (trainer.global_step() / every + 1) * every);
            match trainer.run_epoch_until(&data, &mut on_step, pause)? {
                Some(stats) => break stats,
                None => {
                    ckpt_s += gradwire_job::checkpoint::save(&mut trainer, plan, world)?;
                    ckpt_n += 1;
                }
            }
        };
        total_bytes += stats.bytes_sent;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if reporting {
            let rec = record(&stats);
            last_acc = match (rec.test_accuracy, rec.val_perplexity) {
                (_, Some(p)) => format!(" | val ppl {p:.2}"),
                (Some(a), _) => format!(" | acc {:.2}%", a * 100.0),
                _ => String::new(),
            };
            println!("{}", serde_json::to_string(&rec)?);
            eprintln!(
                "epoch {}/{}: loss {:.4}{last_acc} | {:.1} s (compute {:.1}, comm {:.1}) | sent {} | ratio {:.1}x",
                rec.epoch,
                plan.train.epochs,
                rec.train_loss,
                rec.wall_s,
                rec.compute_s,
                rec.comm_s,
                human_bytes(rec.bytes_sent as f64),
                rec.compression_ratio
            );
            append_jsonl(&plan.out.join("metrics.jsonl"), &rec)?;
            if let Some(j) = &plan.json {
                append_jsonl(j, &rec)?;
            }
            run.epochs.push(rec);
        }
    }
    if reporting && ckpt_n > 0 {
        eprintln!(
            "gradwire train: {ckpt_n} checkpoint(s) in {}, {:.1} ms each on rank 0",
            gradwire_job::checkpoint::dir(&plan.out).display(),
            ckpt_s * 1e3 / f64::from(ckpt_n)
        );
    }
    let mut kept = None;
    match (&plan.save_params, rank, part_index) {
        (Some(p), 0, None) => crate::train_ps::save_params(p, trainer.params())?,
        (Some(_), 0, Some(_)) => kept = Some(trainer.params().to_vec()),
        _ => {}
    }
    let (_, mut sync) = trainer.into_parts();
    let stats = sync.stats();
    if let Some(path) = &plan.timeline {
        let mine = rank_path(path, rank);
        sync.write_timeline(&mine)
            .with_context(|| format!("writing {}", mine.display()))?;
        // Every rank's file is written before rank 0 merges them.
        sync.average_metrics(&mut [0.0])?;
        if rank == 0 {
            let files: Vec<PathBuf> = (0..world).map(|r| rank_path(path, r)).collect();
            let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
            gradwire_engine::merge_traces(&refs, path)
                .with_context(|| format!("merging the timeline into {}", path.display()))?;
            let png = path.with_extension("png");
            match crate::plot_timeline::plot_step(path, &png) {
                Ok(()) => eprintln!(
                    "gradwire train: timeline in {} (open in Perfetto), one step drawn in {}",
                    path.display(),
                    png.display()
                ),
                Err(e) => eprintln!(
                    "gradwire train: timeline in {} (open in Perfetto); step chart not drawn ({e:#})",
                    path.display()
                ),
            }
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
        write_run(&run, &plan.out)?;
        eprintln!("gradwire train: wrote {}", plan.out.display());
    }
    sync.shutdown()?;
    Ok(kept)
}

/// The engine's settings for `plan`, with the host hierarchy `hosts` (if any).
pub(crate) fn engine_config(
    plan: &Plan,
    hosts: Option<gradwire_engine::HostConfig>,
) -> EngineConfig {
    EngineConfig {
        codec: plan.codec.clone(),
        strategy: plan.sync,
        rules: plan.rules.clone(),
        momentum: plan
            .momentum_correction
            .map(|(beta, nesterov)| MomentumConfig {
                beta: beta as f32,
                nesterov,
                masking: true,
            }),
        fusion_bytes: plan.fusion_bytes,
        seed: plan.train.seed,
        timeline: plan.timeline.is_some(),
        hosts,
        ..EngineConfig::default()
    }
}

/// Under model parallelism: prints the partition plan and keeps it in `run` (with every
/// rank counted in `workers`); nothing otherwise. The reporting rank's, before training.
pub(crate) fn record_partition_plan(
    plan: &Plan,
    shape: gradwire_train::data::DataShape,
    run: &mut RunRecord,
) -> Result<()> {
    if let Some(mp) = &plan.model_parallel {
        let split = mp
            .spec(plan.model, shape, plan.train.seed)
            .plan(plan.train.batch_size)?;
        eprintln!("gradwire train: partition plan\n{split}");
        run.workers = plan.workers;
        run.model_parallel = Some(serde_json::to_value(&split)?);
    }
    Ok(())
}

/// `FILE` with `.rankN` before its extension (`trace.json` -> `trace.rank2.json`).
fn rank_path(path: &Path, rank: usize) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or("timeline".into(), |s| s.to_string_lossy());
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}
