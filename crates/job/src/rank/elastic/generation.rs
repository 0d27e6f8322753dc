//! One generation of an elastic run on one rank ([`generation`]): the generation's TCP
//! mesh, rank 0's commit broadcast and restored on every rank, the epochs with a commit
//! point every `--commit-every` steps (where a waiting joiner makes the world re-form),
//! and, once every epoch is done, rank 0's `run.json` with the membership events.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use gradwire_collective::broadcast::{broadcast_bytes, DEFAULT_MAX_BROADCAST_BYTES};
use gradwire_run::elastic::{Member, World};
use gradwire_run::launch::elastic::{membership_json, transport_timeout};
use gradwire_run::report::records::{append_jsonl, RunRecord};
use gradwire_train::data::Dataset;
use gradwire_train::elastic::Commit;
use gradwire_train::{EngineSync, GradientSync, StepInfo, Trainer};
use gradwire_transport::tcp::{Tcp, TcpConfig};

use super::{ElasticProgress, Kept, MemberError};
use crate::elastic::Elastic;
use crate::rank::progress::Notes;
use crate::rank::{engine_config, record, save_params, write_run, EpochNews};
use crate::Plan;

/// How one generation ended on this rank.
pub(super) enum End {
    /// Every epoch is done.
    Finished,
    /// The ranks agreed to admit a joiner at this commit.
    Grow,
}

/// What one generation trains: the plan, the data, the job's token, and the world the
/// coordinator formed.
pub(super) struct Generation<'a> {
    pub(super) plan: &'a Plan,
    pub(super) elastic: &'a Elastic,
    pub(super) data: &'a Dataset,
    pub(super) token: &'a str,
    pub(super) world: &'a World,
}

impl Generation<'_> {
    /// This rank and the world size.
    fn rank_size(&self) -> (usize, usize) {
        (self.world.rank as usize, self.world.world_size as usize)
    }
}

/// Trains as rank `world.rank` of one generation.
pub(super) fn generation(
    g: &Generation<'_>,
    member: &mut Member,
    kept: &mut Kept,
    progress: &mut dyn ElasticProgress,
) -> Result<End, MemberError> {
    let (plan, world) = (g.plan, g.world);
    let (rank, size) = g.rank_size();
    let reporting = rank == 0;
    let mut trainer = join_world(g, kept, progress)?;
    kept.push(trainer.commit()?);
    let mut run = plan.run_record(size, trainer.steps_per_epoch(g.data.train.len()));
    if reporting {
        start_metrics(plan, world.generation, trainer.epoch())?;
        progress.note(&format!(
            "generation {}: {size} worker(s){}, codec {}, {} epochs, batch {} per worker",
            world.generation,
            world
                .restore_step
                .map_or(String::new(), |s| format!(" from step {s}")),
            plan.codec,
            plan.train.epochs,
            plan.train.batch_size
        ));
    }
    if let End::Grow = epochs(g, &mut trainer, member, kept, progress)? {
        return Ok(End::Grow);
    }
    // Every rank has finished before rank 0 reports the run done.
    trainer.sync_mut().average_metrics(&mut [0.0])?;
    if reporting {
        report(plan, &trainer, &mut run, member, kept, progress)?;
    }
    let (_, sync) = trainer.into_parts();
    sync.shutdown()?;
    Ok(End::Finished)
}

/// Joins the generation's mesh and starts the engine and the trainer; with a restore step,
/// rank 0 (a survivor whenever one exists) sends its commit to every rank and every rank
/// restores it (a survivor with its own codec state where it fits).
fn join_world(
    g: &Generation<'_>,
    kept: &Kept,
    progress: &mut dyn ElasticProgress,
) -> Result<Trainer<EngineSync>, MemberError> {
    let (plan, world, data) = (g.plan, g.world, g.data);
    let (rank, size) = g.rank_size();
    let master = world.master.parse().map_err(MemberError::Master)?;
    let mut cfg = TcpConfig::new(rank, size, master, g.token);
    cfg.job = world.job.clone();
    cfg.timeout = transport_timeout();
    let mut t = Tcp::connect(&cfg).map_err(|source| MemberError::Mesh {
        generation: world.generation,
        master,
        source,
    })?;
    let shared = match world.restore_step {
        None => None,
        Some(step) => {
            let mut bytes = match (rank, kept.at(step)) {
                (0, Some(c)) => c.to_bytes(),
                (0, None) => return Err(MemberError::NoCommit { step }),
                _ => Vec::new(),
            };
            broadcast_bytes(&mut t, &mut bytes, 0, 1 << 20, DEFAULT_MAX_BROADCAST_BYTES)
                .map_err(MemberError::Broadcast)?;
            Some(Commit::from_bytes(&bytes).map_err(MemberError::Commit)?)
        }
    };
    let model = plan.model.build(data.shape(), plan.train.seed)?;
    let steps_guess = gradwire_train::steps_per_epoch(data.train.len(), size, &plan.train).max(1);
    let sync = EngineSync::new(t, engine_config(plan, None), &model.tensors(), steps_guess)
        .map_err(|source| MemberError::Engine { rank, source })?;
    let mut trainer = Trainer::new(model, sync, plan.train.clone(), data.train.len())?;
    if let (Some(shared), Some(step)) = (&shared, world.restore_step) {
        let own = if (rank as u32) < world.survivors {
            kept.at(step)
        } else {
            None
        };
        let reset = trainer
            .restore_elsewhere(shared, own, data.train.len())
            .map_err(|source| MemberError::Restore { rank, step, source })?;
        if rank == 0 && !reset.is_empty() {
            progress.note(&format!(
                "codec state of {} tensor(s) does not fit {size} ranks and starts afresh: {}",
                reset.len(),
                reset.join(", ")
            ));
        }
    }
    Ok(trainer)
}

/// The epochs left, pausing every `--commit-every` steps at a commit point; rank 0 reports
/// each epoch (its line on the front end, in `metrics.jsonl` and `--json`).
fn epochs(
    g: &Generation<'_>,
    trainer: &mut Trainer<EngineSync>,
    member: &mut Member,
    kept: &mut Kept,
    progress: &mut dyn ElasticProgress,
) -> Result<End, MemberError> {
    let (plan, world, data) = (g.plan, g.world, g.data);
    let (rank, size) = g.rank_size();
    let reporting = rank == 0;
    let every = g.elastic.commit_every;
    let mut resumed_at: Option<f64> = None;
    let mut resumed_sent = world.generation == 0;
    let mut last_acc: Option<f64> = None;
    while (trainer.epoch() as usize) < plan.train.epochs {
        let steps = trainer.steps_per_epoch(data.train.len());
        if reporting {
            progress.epoch_started(trainer.epoch() as usize, plan.train.epochs, steps);
        }
        let start = Instant::now();
        let mut reached = kept.reached;
        let stats = loop {
            let mut on_step = |s: &StepInfo| {
                reached = s.global_step;
                resumed_at.get_or_insert_with(unix_now);
                if reporting {
                    let ms = start.elapsed().as_secs_f64() * 1e3 / (s.step + 1) as f64;
                    progress.step(s.step, s.loss, ms, last_acc);
                }
            };
            let pause = (trainer.global_step() / every + 1) * every;
            let done = trainer.run_epoch_until(data, &mut on_step, Some(pause));
            kept.reached = reached;
            if let (false, Some(at), true) = (resumed_sent, resumed_at, reporting) {
                member.resumed(world.generation, at)?;
                resumed_sent = true;
            }
            match done? {
                Some(stats) => break stats,
                None => {
                    if commit_point(trainer, member, kept, reporting)? {
                        if reporting {
                            progress.epoch_left();
                            progress.note(&format!(
                                "a worker waits to join: re-forming at step {}",
                                trainer.global_step()
                            ));
                        }
                        return Ok(End::Grow);
                    }
                }
            }
        };
        if reporting {
            let rec = record(&stats);
            last_acc = rec.test_accuracy;
            let line = serde_json::to_string(&rec)?;
            let news = EpochNews {
                record: &rec,
                line: &line,
                bytes_pulled: None,
            };
            progress.epoch_finished(&news, plan.train.epochs, size);
            append_jsonl(&plan.out.join("metrics.jsonl"), &rec)?;
            if let Some(j) = &plan.json {
                append_jsonl(j, &rec)?;
            }
        }
    }
    Ok(End::Finished)
}

/// A commit point: every rank commits its state in memory and the ranks agree on whether
/// rank 0 saw a joiner waiting. Whether one waits (the world re-forms to admit it).
fn commit_point(
    trainer: &mut Trainer<EngineSync>,
    member: &mut Member,
    kept: &mut Kept,
    reporting: bool,
) -> Result<bool, MemberError> {
    let t0 = Instant::now();
    kept.push(trainer.commit()?);
    let ask = reporting
        && member
            .pending()
            .map_err(|source| MemberError::Coordinator {
                what: "asking for joiners",
                source,
            })?;
    let mut flag = [if ask { 1.0 } else { 0.0 }];
    trainer.sync_mut().average_metrics(&mut flag)?;
    kept.commit_n += 1;
    kept.commit_s += t0.elapsed().as_secs_f64();
    Ok(flag[0] > 0.0)
}

/// Rank 0 after the last epoch: the final parameters, `run.json` with every epoch of the
/// run and the membership events, and the commits' cost.
fn report(
    plan: &Plan,
    trainer: &Trainer<EngineSync>,
    run: &mut RunRecord,
    member: &mut Member,
    kept: &Kept,
    progress: &mut dyn ElasticProgress,
) -> Result<(), MemberError> {
    if let Some(p) = &plan.save_params {
        save_params(p, trainer.params())?;
    }
    run.epochs = crate::checkpoint::finished_epochs(&plan.out, u64::MAX)?
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    let events = member.events().map_err(|source| MemberError::Coordinator {
        what: "asking for the membership events",
        source,
    })?;
    run.membership = Some(membership_json(&events));
    write_run(run, &plan.out, &mut Notes(|l: &str| progress.note(l)))?;
    if kept.commit_n > 0 {
        progress.note(&format!(
            "{} commit(s), {:.2} ms each on rank 0 (the copy in memory and the check for joiners)",
            kept.commit_n,
            kept.commit_s * 1e3 / kept.commit_n as f64
        ));
    }
    progress.note(&format!("wrote {}", plan.out.display()));
    Ok(())
}

/// Rank 0 of a generation: starts metrics.jsonl afresh in generation 0; later, keeps the
/// lines of the epochs finished before the one being run (an epoch re-run after a restore
/// replaces its line).
fn start_metrics(plan: &Plan, generation: u64, epoch: u64) -> Result<(), MemberError> {
    std::fs::create_dir_all(&plan.out).map_err(|source| MemberError::Create {
        path: plan.out.clone(),
        source,
    })?;
    let path = plan.out.join("metrics.jsonl");
    let keep = if generation == 0 {
        Vec::new()
    } else {
        crate::checkpoint::finished_epochs(&plan.out, epoch)?
    };
    let lines: String = keep
        .iter()
        .filter(|(_, r)| (r.epoch as u64) <= epoch)
        .map(|(l, _)| format!("{l}\n"))
        .collect();
    std::fs::write(&path, lines).map_err(|source| MemberError::Write { path, source })
}

/// Seconds since the Unix epoch (0 where the clock is before it).
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
