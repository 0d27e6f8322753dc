//! Running a parameter-server `train`: as the parent (the shards, the worker processes,
//! the merged report) or as one worker (training against the shards; rank 0 reports).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gradwire_ps::{Consistency, DeadPolicy, UpdaterSpec};
use gradwire_train::{EvalMode, PsConfig, PsSync, StepInfo, Trainer};

use super::{PsMode, PsPlan};
use crate::launch::{describe, spawn_quiet, RankSpec};
use crate::plot::human_bytes;
use crate::ps::{ShardOptions, Shards};
use crate::train::{Plan, TrainArgs};

pub use gradwire_job::rank::save_params;

/// Runs a parameter-server `train` (parent, or one worker).
pub fn run(
    args: &TrainArgs,
    plan: &Plan,
    launched: Option<&gradwire_run::join::Launched>,
) -> Result<()> {
    let ps = plan.ps.as_ref().expect("a ps plan");
    if let Some(l) = launched {
        if plan.model_parallel.is_some() {
            return run_partition(args, l, plan, ps);
        }
        let (rank, world) = (l.config.rank, l.config.world_size);
        return run_worker(Worker::whole(rank, world), plan, ps, args.quiet).map(drop);
    }
    if args.worker {
        bail!("--worker is internal: it needs the environment `gradwire train` sets for its ranks");
    }
    if let Some(sb) = &ps.sb {
        return crate::train_sandblaster::run(plan, ps, sb, args.quiet);
    }
    let mut shards = None;
    // Under model parallelism every partition's table gets its own `--servers` shards, each
    // for the replicas (see `gradwire_train::sync::ps`).
    let k = plan.model_parallel.map_or(1, |mp| mp.partitions);
    let addrs = if ps.addrs.is_empty() {
        let opts = ShardOptions::for_run(&plan.out);
        let s = Shards::start(ps.servers * k, plan.workers / k, &opts)?;
        let a = s.addrs.clone();
        shards = Some(s);
        a
    } else {
        ps.addrs.clone()
    };
    let mut ps_run = ps.clone();
    ps_run.addrs = addrs.clone();
    if plan.workers == 1 {
        return run_worker(Worker::whole(0, 1), plan, &ps_run, args.quiet).map(drop);
    }
    std::fs::create_dir_all(&plan.out)
        .with_context(|| format!("creating {}", plan.out.display()))?;
    for r in 0..plan.workers {
        let _ = std::fs::remove_file(worker_file(&plan.out, r));
    }
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
    let mut child_args: Vec<String> = std::env::args().skip(1).collect();
    child_args.push("--worker".into());
    child_args.push(format!(
        "--ps-servers={}",
        addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    ));
    let spec = RankSpec {
        np: plan.workers,
        master: None,
        timeout: None,
        program: exe.display().to_string(),
        args: child_args,
    };
    let statuses = spawn_quiet(&spec)?.wait_all()?;
    let restarts = shards.as_ref().map_or_else(Vec::new, Shards::restarts);
    drop(shards);
    let lost: Vec<(usize, ExitStatus)> = statuses
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.success())
        .map(|(r, s)| (r, *s))
        .collect();
    for (r, s) in &lost {
        // Killed by a signal: lost; an exit code: it failed (its own error says why).
        let what = if s.code().is_none() {
            "was lost"
        } else {
            "failed"
        };
        eprintln!("gradwire train: worker {r} {what} ({})", describe(*s));
    }
    if let Some((_, s)) = lost.iter().find(|(r, _)| *r == 0) {
        bail!("worker 0 failed ({}): no report", describe(*s));
    }
    if ps.consistency == Consistency::Sync
        && ps.dead_policy == DeadPolicy::Strict
        && !lost.is_empty()
    {
        bail!(
            "worker {} failed under ps-sync ({})",
            lost[0].0,
            describe(lost[0].1)
        );
    }
    if !lost.is_empty() {
        eprintln!(
            "gradwire train: the other workers trained on without them (--sync {})",
            PsMode::Table(ps.consistency)
        );
    }
    merge_worker_reports(&plan.out, plan.workers, &lost, &restarts)
}

fn worker_file(out: &Path, rank: usize) -> PathBuf {
    out.join(format!("ps-worker-{rank}.json"))
}

/// Adds every finished worker's summary, the lost workers and each shard's restarts to
/// rank 0's run.json.
fn merge_worker_reports(
    out: &Path,
    workers: usize,
    lost: &[(usize, ExitStatus)],
    restarts: &[u32],
) -> Result<()> {
    let path = out.join("run.json");
    let mut run: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    let mut reports = Vec::new();
    let (mut pushed, mut pulled) = (0u64, 0u64);
    for r in 0..workers {
        if let Ok(text) = std::fs::read_to_string(worker_file(out, r)) {
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", worker_file(out, r).display()))?;
            pushed += v["bytes_pushed"].as_u64().unwrap_or(0);
            pulled += v["bytes_pulled"].as_u64().unwrap_or(0);
            reports.push(v);
        }
    }
    let ps = &mut run["ps"];
    ps["workers"] = serde_json::json!(reports);
    ps["workers_lost"] = serde_json::json!(lost
        .iter()
        .map(|(r, s)| serde_json::json!({"rank": r, "status": describe(*s)}))
        .collect::<Vec<_>>());
    ps["shard_restarts"] = serde_json::json!(restarts);
    ps["bytes_pushed_all"] = pushed.into();
    ps["bytes_pulled_all"] = pulled.into();
    std::fs::write(&path, serde_json::to_string_pretty(&run)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// One rank under model parallelism and a parameter server: joins the world mesh, splits
/// it (the replica group carries the partitioned model's activations; the partition group
/// stays unused: the shards replace its all-reduce), trains partition `j` against its
/// table's shards as worker `replica` of `replicas`, and writes the whole model's
/// parameters over the world when asked.
fn run_partition(
    args: &TrainArgs,
    l: &gradwire_run::join::Launched,
    plan: &Plan,
    ps: &PsPlan,
) -> Result<()> {
    let mp = plan.model_parallel.as_ref().expect("a model-parallel plan");
    let mut t = gradwire_run::join::join_with(args.transport, l)?;
    let rank = t.rank();
    let crate::train_parallel::RankGroups {
        index,
        replica,
        group,
    } = mp.split_world(&mut t)?;
    let worker = Worker {
        rank: rank / mp.partitions,
        world: t.world_size() / mp.partitions,
        world_rank: rank,
        partition: Some((index, replica)),
    };
    let kept = run_worker(worker, plan, ps, args.quiet)?;
    drop(group);
    if let Some(path) = &plan.save_params {
        crate::train_parallel::save_whole(&mut t, mp, plan, kept, path)?;
    }
    Ok(())
}

/// Who a worker process is to the shards.
struct Worker {
    /// Its worker id on its table's shards (the replica under model parallelism).
    rank: usize,
    /// The workers of its table (the replicas under model parallelism).
    world: usize,
    /// Its rank among all the worker processes (names its summary file).
    world_rank: usize,
    /// Under model parallelism: its partition and its replica's transport.
    partition: Option<(usize, Box<dyn gradwire_transport::Transport>)>,
}

impl Worker {
    fn whole(rank: usize, world: usize) -> Self {
        Worker {
            rank,
            world,
            world_rank: rank,
            partition: None,
        }
    }
}

/// One worker: trains against the shards; rank 0 (partition 0 of replica 0) reports.
/// Returns the final parameters of a partition of replica 0 (for the whole model's
/// `--save-params`), else `None`.
fn run_worker(w: Worker, plan: &Plan, ps: &PsPlan, quiet: bool) -> Result<Option<Vec<f32>>> {
    let Worker {
        rank,
        world,
        world_rank,
        partition,
    } = w;
    gradwire_train::init_threads(plan.threads);
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .with_context(|| format!("worker {world_rank}: loading {}", plan.dataset.name()))?;
    let part_index = partition.as_ref().map(|(j, _)| *j);
    let (model, addrs, who) = match (partition, &plan.model_parallel) {
        (Some((j, replica)), Some(mp)) => {
            let model = crate::train_parallel::build(
                mp,
                plan.model,
                data.shape(),
                plan.train.seed,
                j,
                replica,
            )?;
            let per = ps.addrs.len() / mp.partitions;
            let addrs = ps.addrs[j * per..(j + 1) * per].to_vec();
            (
                model,
                addrs,
                format!("ps worker {rank}/{world} (partition {j})"),
            )
        }
        _ => (
            plan.model.build(data.shape(), plan.train.seed)?,
            ps.addrs.clone(),
            format!("ps worker {rank}/{world}"),
        ),
    };
    let cfg = PsConfig {
        n_fetch: ps.n_fetch,
        n_push: ps.n_push,
        local_lr: ps.local_lr,
        dead_policy: ps.dead_policy,
        codec: ps.codec.clone(),
        table: part_index.unwrap_or(0) as u32,
        ..PsConfig::new(addrs.clone(), ps.consistency, ps.updater)
    };
    let sync = PsSync::connect(rank, world, model.num_params(), cfg)
        .with_context(|| format!("{who}: connecting to the shards"))?;
    let mode = PsMode::Table(ps.consistency).to_string();
    eprintln!(
        "gradwire train: {who} connected to {} shard(s)",
        addrs.len()
    );
    let mut train = plan.train.clone();
    train.optimizer = ps.optimizer.clone();
    train.eval = if ps.consistency == Consistency::Sync {
        EvalMode::Sharded
    } else {
        EvalMode::Rank0
    };
    let mut trainer = Trainer::new(model, sync, train, data.train.len())
        .with_context(|| format!("{who}: initializing the parameter table"))?;
    let steps = trainer.steps_per_epoch(data.train.len());
    let reporting = rank == 0 && part_index.unwrap_or(0) == 0;
    if reporting {
        let shards = match &plan.model_parallel {
            Some(mp) => format!(
                "{world} replica(s) x {} partitions ({}), {} shard(s) ({} per partition's table)",
                mp.partitions,
                mp.split,
                ps.addrs.len(),
                addrs.len()
            ),
            None => format!("{world} worker(s), {} shard(s)", ps.addrs.len()),
        };
        eprintln!(
            "gradwire train: {} on {} ({} train / {} held out), {shards}, --sync {mode}, server updater {}, pushes {}{}, {} steps/epoch x {} epochs, batch {} per worker",
            plan.model.name(),
            plan.dataset.name(),
            data.train.len(),
            data.test.len(),
            ps.updater,
            ps.codec,
            if ps.n_fetch > 1 || ps.n_push > 1 {
                format!(", n_fetch {} n_push {} local lr {}", ps.n_fetch, ps.n_push, ps.local_lr)
            } else {
                String::new()
            },
            steps,
            plan.train.epochs,
            plan.train.batch_size
        );
        if ps.consistency != Consistency::Sync && matches!(ps.updater, UpdaterSpec::Momentum { .. })
        {
            eprintln!(
                "gradwire train: warning: under --sync {mode} the shards apply every worker's push \
                 with momentum, so {world} stale workers take steps up to {world}/(1-mu) times \
                 larger than one; if it diverges use --optimizer adagrad:lr=... (DistBelief's \
                 Downpour) or plain SGD"
            );
        }
        std::fs::create_dir_all(&plan.out)
            .with_context(|| format!("creating {}", plan.out.display()))?;
        let _ = std::fs::remove_file(plan.out.join("metrics.jsonl"));
    }
    let mut run = plan.run_record(world, steps);
    if reporting {
        crate::train::record_partition_plan(plan, data.shape(), &mut run)?;
    }
    // The PS path has no momentum correction (the shards run the optimizer).
    run.momentum_correction = None;
    run.codec = ps.codec.to_string();
    let mut total_steps = 0u64;
    let mut last = String::new();
    for epoch in 0..plan.train.epochs {
        let bar = (reporting && !quiet)
            .then(|| crate::train::progress_bar(steps, epoch, plan.train.epochs));
        let start = Instant::now();
        let pulled0 = trainer.sync().bytes().1;
        let mut on_step = |s: &StepInfo| {
            if let Some(b) = &bar {
                b.set_position(s.step as u64 + 1);
                let ms = start.elapsed().as_secs_f64() * 1e3 / (s.step + 1) as f64;
                b.set_message(format!("loss {:.4}{last} | {ms:.0} ms/step", s.loss));
            }
        };
        let stats = trainer
            .run_epoch(&data, &mut on_step)
            .with_context(|| format!("{who}, epoch {}", epoch + 1))?;
        total_steps += steps as u64;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if reporting {
            let rec = crate::train::record(&stats);
            last = rec
                .test_accuracy
                .map_or(String::new(), |a| format!(" | acc {:.2}%", a * 100.0));
            let mut line = serde_json::to_value(&rec)?;
            line["servers"] = ps.addrs.len().into();
            line["mode"] = mode.clone().into();
            line["bytes_pulled"] = trainer.sync().bytes().1.saturating_sub(pulled0).into();
            println!("{}", serde_json::to_string(&line)?);
            eprintln!(
                "epoch {}/{}: loss {:.4}{last} | {:.1} s (compute {:.1}, ps {:.1}) | pushed {} pulled {}",
                rec.epoch,
                plan.train.epochs,
                rec.train_loss,
                rec.wall_s,
                rec.compute_s,
                rec.comm_s,
                human_bytes(rec.bytes_sent as f64),
                human_bytes(line["bytes_pulled"].as_f64().unwrap_or(0.0))
            );
            append_line(&plan.out.join("metrics.jsonl"), &line)?;
            if let Some(j) = &plan.json {
                append_line(j, &line)?;
            }
            run.epochs.push(rec);
        }
    }
    let mut kept = None;
    match (&plan.save_params, rank, part_index) {
        (Some(p), 0, None) => save_params(p, trainer.params())?,
        (Some(_), 0, Some(_)) => kept = Some(trainer.params().to_vec()),
        _ => {}
    }
    let (_, sync) = trainer.into_parts();
    let (pushed, pulled) = sync.bytes();
    let (pushes, pulls) = sync.ops();
    sync.leave()
        .with_context(|| format!("{who}: leaving the shards"))?;
    let mut summary = serde_json::json!({
        "rank": world_rank,
        "steps": total_steps,
        "pushes": pushes,
        "pulls": pulls,
        "bytes_pushed": pushed,
        "bytes_pulled": pulled,
    });
    if let Some(j) = part_index {
        summary["replica"] = rank.into();
        summary["partition"] = j.into();
    }
    eprintln!(
        "gradwire train: {who} finished: {total_steps} steps, {pushes} pushes, {pulls} pulls, pushed {} pulled {}",
        human_bytes(pushed as f64),
        human_bytes(pulled as f64)
    );
    if world > 1 || part_index.is_some() {
        let file = worker_file(&plan.out, world_rank);
        std::fs::create_dir_all(&plan.out).ok();
        std::fs::write(&file, summary.to_string() + "\n")
            .with_context(|| format!("writing {}", file.display()))?;
    }
    if reporting {
        crate::train::write_run(&run, &plan.out)?;
        let path = plan.out.join("run.json");
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        v["ps"] = serde_json::json!({
            "mode": mode,
            "servers": ps.addrs.len(),
            "updater": ps.updater.to_string(),
            "codec": ps.codec.to_string(),
            "n_fetch": ps.n_fetch,
            "n_push": ps.n_push,
            // Through its shortest decimal form, so 0.05 reads 0.05 and not 0.0500000007.
            "local_lr": ps.local_lr.to_string().parse::<f64>().unwrap_or(0.0),
            "bytes_pushed": pushed,
            "bytes_pulled": pulled,
            "rank0": summary,
        });
        if let Some(mp) = &plan.model_parallel {
            // One table per partition, each on its own shards; these bytes are partition 0's.
            v["ps"]["tables"] = mp.partitions.into();
            v["ps"]["servers_per_table"] = (ps.addrs.len() / mp.partitions).into();
        }
        std::fs::write(&path, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("gradwire train: wrote {}", plan.out.display());
    }
    Ok(kept)
}

fn append_line(path: &Path, v: &serde_json::Value) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{v}").with_context(|| format!("writing {}", path.display()))
}
