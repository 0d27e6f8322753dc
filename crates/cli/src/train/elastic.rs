//! `gradwire train --elastic MIN:MAX`: elastic all-reduce training (TorchElastic's
//! rendezvous, Horovod Elastic's `hvd.elastic.run` with `state.commit()`).
//!
//! The parent starts a membership coordinator (`gradwire_run::elastic`) and `--workers`
//! processes. The coordinator forms each *generation* of the world: every process learns its
//! rank and world size from it and builds a fresh TCP mesh under the generation's job id and
//! the job's token. Every `--commit-every` steps each rank commits its state in memory
//! (`Trainer::commit`: parameters, optimizer, codec residuals, the epoch's order; the two
//! newest are kept).
//!
//! - **A rank dies** (or stalls past the transport's deadline): the survivors' collectives
//!   fail naming it, each asks the coordinator for the next world with the steps of the
//!   commits it holds; the coordinator forms a generation of the survivors (and any waiting
//!   joiner) at the newest step all of them committed. Rank 0 broadcasts its commit, every
//!   rank restores it (`Trainer::restore_elsewhere`: its own codec state where it fits, the
//!   epoch's untaken samples, the lost rank's too, dealt over the new world) and training
//!   goes on with fewer ranks, losing at most the steps since the last commit. A lost
//!   rank's codec residual is lost with it (see `gradwire_train::elastic`).
//! - **A process joins** (`gradwire train --join OUT`, OUT being the run's `--out`): it waits
//!   at the coordinator; at the next commit rank 0 learns of it, the ranks agree, and the
//!   next generation admits it; it receives the state by the same broadcast and starts with
//!   fresh codec state.
//! - Below `MIN` ranks the coordinator waits for joiners for its timeout, then the run
//!   fails. The learning rate is kept as it is when the world (and so the global batch)
//!   changes, as Horovod Elastic does by default.
//!
//! Rank 0 of the current generation reports the epochs (metrics.jsonl continues across
//! generations; an epoch re-run after a restore replaces its line); at the end the parent
//! adds the membership events to run.json (`membership`: each generation's cause, world
//! sizes, restore step, steps lost, and the seconds from detection to the new world and to
//! training again).
//!
//! Not with parameter servers, model parallelism, `--overlap-steps 1`, on-disk checkpoints
//! (`--checkpoint-every`, `--resume`) or `--timeline`; only processes on this host (the
//! parent starts them; a joiner runs here too).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use gradwire_run::elastic::Member;
use gradwire_train::elastic::Commit;
use gradwire_train::{EngineSync, GradientSync, StepInfo, Trainer};
use gradwire_transport::tcp::{Tcp, TcpConfig};

use crate::launch::RankSpec;
use crate::launch::elastic::{membership_json, transport_timeout, ElasticJob};
use gradwire_job::plot::human_bytes;
use gradwire_run::report::records::append_jsonl;
use crate::train::{progress_bar, record, write_run, Plan};

/// Re-forms in a row without a training step after which a worker gives up.
const MAX_IDLE_REFORMS: u32 = 5;

pub use gradwire_job::elastic::{Elastic, ElasticRange};

/// Where an elastic run's join file is: `OUT/elastic/join.json`.
fn join_file(out: &Path) -> PathBuf {
    out.join("elastic").join("join.json")
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The parent of an elastic run: the coordinator and the workers until the run ends (the
/// last rank 0 writes the membership events into run.json).
pub fn run_parent(plan: &Plan, elastic: &Elastic) -> Result<()> {
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.push("--worker".into());
    eprintln!(
        "gradwire train: elastic {}:{} ranks, commits every {} steps; add a worker with: gradwire train --join {}",
        elastic.range.min,
        elastic.range.max,
        elastic.commit_every,
        plan.out.display()
    );
    let spec = RankSpec {
        np: plan.workers,
        master: None,
        timeout: None,
        program: exe.display().to_string(),
        args,
    };
    let join = join_file(&plan.out);
    crate::launch::elastic::run(&ElasticJob {
        spec: &spec,
        min: elastic.range.min,
        max: elastic.range.max,
        join_file: Some(&join),
        who: "gradwire train",
    })
    .map(drop)
}

/// `gradwire train --join DIR`: becomes one more worker of the elastic run whose `--out` is
/// DIR (replaces this process with the workers' command line).
pub fn join(dir: &Path) -> Result<()> {
    crate::launch::elastic::join(&join_file(dir))
        .with_context(|| format!("--join {}", dir.display()))
}

/// How one generation ended on this rank.
enum End {
    /// Every epoch is done.
    Finished,
    /// The ranks agreed to admit a joiner at this commit.
    Grow,
}

/// What a rank keeps across generations.
struct Kept {
    /// The two newest commits.
    commits: VecDeque<Commit>,
    /// The last global step completed.
    reached: u64,
    /// Commit points passed and their seconds on this rank (the copy, and the check for
    /// joiners with the agreement on it).
    commit_n: u64,
    commit_s: f64,
}

impl Kept {
    fn push(&mut self, c: Commit) {
        if self
            .commits
            .back()
            .is_some_and(|b| b.checkpoint.global_step == c.checkpoint.global_step)
        {
            self.commits.pop_back();
        }
        self.commits.push_back(c);
        while self.commits.len() > 2 {
            self.commits.pop_front();
        }
    }
    fn steps(&self) -> Vec<u64> {
        self.commits
            .iter()
            .map(|c| c.checkpoint.global_step)
            .collect()
    }
    fn at(&self, step: u64) -> Option<&Commit> {
        self.commits
            .iter()
            .find(|c| c.checkpoint.global_step == step)
    }
}

/// Whether `e` is a peer's failure (a transport error anywhere in its chain): the world is
/// re-formed. Anything else (divergence, a bad setting) ends this worker.
fn peer_failure(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<gradwire_transport::Error>().is_some()
            || c.downcast_ref::<gradwire_collective::Error>().is_some()
            || matches!(
                c.downcast_ref::<gradwire_train::Error>(),
                Some(gradwire_train::Error::Engine(_))
            )
    })
}

/// One worker of an elastic run, generation after generation, until the run ends.
/// `threads_given`: whether `--threads` was (else the host's cores are shared among the
/// launcher's processes, `GRADWIRE_LOCAL_SIZE`).
pub fn run_member(
    plan: &Plan,
    elastic: &Elastic,
    mut member: Member,
    quiet: bool,
    threads_given: bool,
) -> Result<()> {
    let local = std::env::var("GRADWIRE_LOCAL_SIZE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let threads = match local {
        Some(n) if !threads_given => gradwire_train::threads_per_worker(
            std::thread::available_parallelism().map_or(1, |c| c.get()),
            n,
        ),
        _ => plan.threads,
    };
    gradwire_train::init_threads(threads);
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .with_context(|| format!("loading {}", plan.dataset.name()))?;
    let token = std::env::var("GRADWIRE_TOKEN").unwrap_or_default();
    let mut kept = Kept {
        commits: VecDeque::new(),
        reached: 0,
        commit_n: 0,
        commit_s: 0.0,
    };
    // The longest a world may take to form: survivors awaited, then joiners awaited.
    let wait =
        3 * (transport_timeout() + crate::launch::elastic::EVICT_MARGIN) + Duration::from_secs(120);
    // Re-forms in a row without a step taken: a failure the peers did not cause (one that
    // recurs in every world) ends the worker instead of looping.
    let mut idle_reforms = 0;
    loop {
        let before = kept.reached;
        let world = member
            .next_world(&kept.steps(), kept.reached, wait)
            .context("asking the elastic coordinator for the next world")?;
        let outcome = generation(
            plan,
            elastic,
            &data,
            &token,
            &world,
            &mut member,
            &mut kept,
            quiet,
        );
        match outcome {
            Ok(End::Finished) => {
                member
                    .done()
                    .context("telling the coordinator the run is done")?;
                return Ok(());
            }
            Ok(End::Grow) => continue,
            Err(e) if peer_failure(&e) && idle_reforms < MAX_IDLE_REFORMS => {
                idle_reforms = if kept.reached > before {
                    0
                } else {
                    idle_reforms + 1
                };
                eprintln!(
                    "gradwire train: generation {} rank {}: {}; re-forming the world",
                    world.generation,
                    world.rank,
                    e.root_cause()
                );
            }
            Err(e) => return Err(e),
        }
    }
}

/// Trains as rank `world.rank` of one generation.
#[allow(clippy::too_many_arguments)]
fn generation(
    plan: &Plan,
    elastic: &Elastic,
    data: &gradwire_train::data::Dataset,
    token: &str,
    world: &gradwire_run::elastic::World,
    member: &mut Member,
    kept: &mut Kept,
    quiet: bool,
) -> Result<End> {
    let (rank, size) = (world.rank as usize, world.world_size as usize);
    let master = world
        .master
        .parse()
        .context("the generation's master address")?;
    let mut cfg = TcpConfig::new(rank, size, master, token);
    cfg.job = world.job.clone();
    cfg.timeout = transport_timeout();
    let mut t = Tcp::connect(&cfg).with_context(|| {
        format!(
            "generation {}: joining the mesh at {master}",
            world.generation
        )
    })?;
    // Rank 0 (a survivor whenever one exists) sends its commit to every rank.
    let shared = match world.restore_step {
        None => None,
        Some(step) => {
            let mut bytes = match (rank, kept.at(step)) {
                (0, Some(c)) => c.to_bytes(),
                (0, None) => bail!("rank 0 holds no commit of step {step}"),
                _ => Vec::new(),
            };
            gradwire_collective::broadcast::broadcast_bytes(
                &mut t,
                &mut bytes,
                0,
                1 << 20,
                gradwire_collective::broadcast::DEFAULT_MAX_BROADCAST_BYTES,
            )
            .context("receiving rank 0's commit")?;
            Some(Commit::from_bytes(&bytes).context("rank 0's commit")?)
        }
    };
    let reporting = rank == 0;
    let model = plan.model.build(data.shape(), plan.train.seed)?;
    let steps_guess = gradwire_train::steps_per_epoch(data.train.len(), size, &plan.train).max(1);
    let engine = crate::train::engine_config(plan, None);
    let sync = EngineSync::new(t, engine, &model.tensors(), steps_guess)
        .with_context(|| format!("rank {rank}: starting the engine"))?;
    let mut trainer = Trainer::new(model, sync, plan.train.clone(), data.train.len())?;
    if let (Some(shared), Some(step)) = (&shared, world.restore_step) {
        let own = if (rank as u32) < world.survivors {
            kept.at(step)
        } else {
            None
        };
        let reset = trainer
            .restore_elsewhere(shared, own, data.train.len())
            .with_context(|| format!("rank {rank}: restoring step {step}"))?;
        if reporting && !reset.is_empty() {
            eprintln!(
                "gradwire train: codec state of {} tensor(s) does not fit {size} ranks and starts afresh: {}",
                reset.len(),
                reset.join(", ")
            );
        }
    }
    kept.push(trainer.commit()?);
    let mut run = plan.run_record(size, trainer.steps_per_epoch(data.train.len()));
    if reporting {
        start_metrics(plan, world.generation, trainer.epoch())?;
        eprintln!(
            "gradwire train: generation {}: {size} worker(s){}, codec {}, {} epochs, batch {} per worker",
            world.generation,
            world
                .restore_step
                .map_or(String::new(), |s| format!(" from step {s}")),
            plan.codec,
            plan.train.epochs,
            plan.train.batch_size
        );
    }
    let mut resumed_at: Option<f64> = None;
    let mut resumed_sent = world.generation == 0;
    let mut last_acc = String::new();
    while (trainer.epoch() as usize) < plan.train.epochs {
        let steps = trainer.steps_per_epoch(data.train.len());
        let epoch = trainer.epoch() as usize;
        let bar = (reporting && !quiet).then(|| progress_bar(steps, epoch, plan.train.epochs));
        let start = Instant::now();
        let mut reached = kept.reached;
        let stats = loop {
            let mut on_step = |s: &StepInfo| {
                reached = s.global_step;
                resumed_at.get_or_insert_with(unix_now);
                if let Some(b) = &bar {
                    b.set_position(s.step as u64 + 1);
                    let ms = start.elapsed().as_secs_f64() * 1e3 / (s.step + 1) as f64;
                    b.set_message(format!("loss {:.4}{last_acc} | {ms:.0} ms/step", s.loss));
                }
            };
            let pause = (trainer.global_step() / elastic.commit_every + 1) * elastic.commit_every;
            let done = trainer.run_epoch_until(data, &mut on_step, Some(pause));
            kept.reached = reached;
            if let (false, Some(at), true) = (resumed_sent, resumed_at, reporting) {
                member.resumed(world.generation, at)?;
                resumed_sent = true;
            }
            match done? {
                Some(stats) => break stats,
                None => {
                    let t0 = Instant::now();
                    kept.push(trainer.commit()?);
                    let ask = reporting && member.pending().context("asking for joiners")?;
                    let mut flag = [if ask { 1.0 } else { 0.0 }];
                    trainer.sync_mut().average_metrics(&mut flag)?;
                    kept.commit_n += 1;
                    kept.commit_s += t0.elapsed().as_secs_f64();
                    if flag[0] > 0.0 {
                        if let Some(b) = &bar {
                            b.finish_and_clear();
                        }
                        if reporting {
                            eprintln!(
                                "gradwire train: a worker waits to join: re-forming at step {}",
                                trainer.global_step()
                            );
                        }
                        return Ok(End::Grow);
                    }
                }
            }
        };
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if reporting {
            let rec = record(&stats);
            last_acc = rec
                .test_accuracy
                .map_or(String::new(), |a| format!(" | acc {:.2}%", a * 100.0));
            println!("{}", serde_json::to_string(&rec)?);
            eprintln!(
                "epoch {}/{}: loss {:.4}{last_acc} | {:.1} s | {size} ranks | sent {}",
                rec.epoch,
                plan.train.epochs,
                rec.train_loss,
                rec.wall_s,
                human_bytes(rec.bytes_sent as f64)
            );
            append_jsonl(&plan.out.join("metrics.jsonl"), &rec)?;
            if let Some(j) = &plan.json {
                append_jsonl(j, &rec)?;
            }
        }
    }
    // Every rank has finished before rank 0 reports the run done.
    trainer.sync_mut().average_metrics(&mut [0.0])?;
    if reporting {
        if let Some(p) = &plan.save_params {
            crate::train::ps::save_params(p, trainer.params())?;
        }
        run.epochs = gradwire_job::checkpoint::finished_epochs(&plan.out, u64::MAX)?
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        let events = member
            .events()
            .context("asking for the membership events")?;
        run.membership = Some(membership_json(&events));
        write_run(&run, &plan.out)?;
        if kept.commit_n > 0 {
            eprintln!(
                "gradwire train: {} commit(s), {:.2} ms each on rank 0 (the copy in memory and the check for joiners)",
                kept.commit_n,
                kept.commit_s * 1e3 / kept.commit_n as f64
            );
        }
        eprintln!("gradwire train: wrote {}", plan.out.display());
    }
    let (_, sync) = trainer.into_parts();
    sync.shutdown()?;
    Ok(End::Finished)
}

/// Rank 0 of a generation: starts metrics.jsonl afresh in generation 0; later, keeps the
/// lines of the epochs finished before the one being run (an epoch re-run after a restore
/// replaces its line).
fn start_metrics(plan: &Plan, generation: u64, epoch: u64) -> Result<()> {
    std::fs::create_dir_all(&plan.out)
        .with_context(|| format!("creating {}", plan.out.display()))?;
    let path = plan.out.join("metrics.jsonl");
    let keep = if generation == 0 {
        Vec::new()
    } else {
        gradwire_job::checkpoint::finished_epochs(&plan.out, epoch)?
    };
    let lines: String = keep
        .iter()
        .filter(|(_, r)| (r.epoch as u64) <= epoch)
        .map(|(l, _)| format!("{l}\n"))
        .collect();
    std::fs::write(&path, lines).with_context(|| format!("writing {}", path.display()))
}
