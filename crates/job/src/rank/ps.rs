//! One worker of a parameter-server job (`--sync ps-sync|ps-async|ps-ssp:S`): its model (or
//! its partition under model parallelism) trained against the shards through the shared
//! epoch loop, its summary file, and on the reporting worker `run.json` with the `ps`
//! object; and the parent's merge of every worker's summary into it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use gradwire_ps::{Consistency, UpdaterSpec};
use gradwire_run::launch::describe;
use gradwire_run::report::records::{EpochRecord, RunRecord};
use gradwire_train::data::Dataset;
use gradwire_train::{EvalMode, PsConfig, PsSync, StepInfo, Trainer};
use gradwire_transport::Transport;
use serde_json::Value;

use super::{build, record_partition_plan, run_epochs, save_params, save_whole, write_run};
use super::{Course, Mode, Progress, RankError};
use crate::model_parallel::RankGroups;
use crate::ps::PsPlan;
use crate::{Plan, PsMode};

/// The most bytes of a JSON file of this run (`run.json`, a worker's summary) read back.
const MAX_JSON_BYTES: u64 = 64 << 20;

/// Who a worker process is to the shards.
pub struct PsWorker {
    /// Its worker id on its table's shards (the replica under model parallelism).
    pub rank: usize,
    /// The workers of its table (the replicas under model parallelism).
    pub world: usize,
    /// Its rank among all the worker processes (names its summary file).
    pub world_rank: usize,
    /// Under model parallelism: its partition and its replica's transport.
    pub partition: Option<(usize, Box<dyn Transport>)>,
}

impl PsWorker {
    /// Worker `rank` of `world`, holding the whole model.
    pub fn whole(rank: usize, world: usize) -> Self {
        PsWorker {
            rank,
            world,
            world_rank: rank,
            partition: None,
        }
    }
}

/// The summary file of worker `rank` in `out` (`ps-worker-R.json`).
pub fn worker_file(out: &Path, rank: usize) -> PathBuf {
    out.join(format!("ps-worker-{rank}.json"))
}

/// One rank under model parallelism and a parameter server, over the world's transport `t`:
/// splits it (the replica group carries the partitioned model's activations; the partition
/// group stays unused: the shards replace its all-reduce), trains partition `j` against its
/// table's shards as worker `replica` of `replicas`, and writes the whole model's parameters
/// over the world when asked.
pub fn ps_partition<T: Transport + 'static>(
    mut t: T,
    plan: &Plan,
    ps: &PsPlan,
    progress: &mut dyn Progress,
) -> Result<(), RankError> {
    let Some(mp) = plan.model_parallel.as_ref() else {
        return ps_worker(
            PsWorker::whole(t.rank(), t.world_size()),
            plan,
            ps,
            progress,
        )
        .map(drop);
    };
    let rank = t.rank();
    let RankGroups {
        index,
        replica,
        group,
    } = mp.split_world(&mut t)?;
    let worker = PsWorker {
        rank: rank / mp.partitions,
        world: t.world_size() / mp.partitions,
        world_rank: rank,
        partition: Some((index, replica)),
    };
    let kept = ps_worker(worker, plan, ps, progress)?;
    drop(group);
    if let Some(path) = &plan.save_params {
        save_whole(&mut t, mp, plan, kept, path)?;
    }
    Ok(())
}

/// The parameter server's part in the epoch loop: no pauses, no per-step bytes; each
/// epoch's line adds the shards, the mode and the bytes pulled.
struct Table<'a> {
    ps: &'a PsPlan,
    who: &'a str,
    mode: String,
    pulled_before: u64,
}

impl Mode<PsSync> for Table<'_> {
    fn pause_at(&self, _: &Trainer<PsSync>) -> Option<u64> {
        None
    }

    fn at_pause(&mut self, _: &mut Trainer<PsSync>) -> Result<(), RankError> {
        Ok(())
    }

    fn step_bytes(&self, _: &StepInfo) -> Option<u64> {
        None
    }

    fn epoch_starts(&mut self, trainer: &Trainer<PsSync>) {
        self.pulled_before = trainer.sync().bytes().1;
    }

    fn line(
        &self,
        trainer: &Trainer<PsSync>,
        record: &EpochRecord,
    ) -> Result<(String, Option<u64>), RankError> {
        let json = |source| RankError::Json {
            what: "an epoch record",
            source,
        };
        let pulled = trainer.sync().bytes().1.saturating_sub(self.pulled_before);
        let mut line = serde_json::to_value(record).map_err(json)?;
        line["servers"] = self.ps.addrs.len().into();
        line["mode"] = self.mode.clone().into();
        line["bytes_pulled"] = pulled.into();
        Ok((serde_json::to_string(&line).map_err(json)?, Some(pulled)))
    }

    fn epoch_failed(&self, epoch: usize, source: gradwire_train::Error) -> RankError {
        RankError::PsWorker {
            who: self.who.to_string(),
            what: format!("epoch {epoch}"),
            source,
        }
    }
}

/// One worker: trains against the shards; rank 0 (partition 0 of replica 0) reports.
/// Returns the final parameters of a partition of replica 0 (for the whole model's
/// `--save-params`), else `None`.
///
/// Longer than 120 lines on purpose: it sets up in the order the steps depend on (the data,
/// the model or this rank's partition and its shards, the PS client, the trainer), runs the
/// shared epoch loop, then writes the worker's summary; each step is a few lines.
pub fn ps_worker(
    w: PsWorker,
    plan: &Plan,
    ps: &PsPlan,
    progress: &mut dyn Progress,
) -> Result<Option<Vec<f32>>, RankError> {
    let PsWorker {
        rank,
        world,
        world_rank,
        partition,
    } = w;
    gradwire_train::init_threads(plan.threads);
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .map_err(|source| RankError::Load {
            rank: world_rank,
            dataset: plan.dataset.name(),
            source,
        })?;
    let part_index = partition.as_ref().map(|(j, _)| *j);
    let (model, addrs, who) = match (partition, &plan.model_parallel) {
        (Some((j, replica)), Some(mp)) => {
            let model = build(mp, plan.model, data.shape(), plan.train.seed, j, replica)?;
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
    let failed = |what: &str| {
        let who = who.clone();
        let what = what.to_string();
        move |source| RankError::PsWorker { who, what, source }
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
        .map_err(failed("connecting to the shards"))?;
    progress.note(&format!("{who} connected to {} shard(s)", addrs.len()));
    let mut train = plan.train.clone();
    train.optimizer = ps.optimizer.clone();
    train.eval = if ps.consistency == Consistency::Sync {
        EvalMode::Sharded
    } else {
        EvalMode::Rank0
    };
    let mut trainer = Trainer::new(model, sync, train, data.train.len())
        .map_err(failed("initializing the parameter table"))?;
    let steps = trainer.steps_per_epoch(data.train.len());
    let reporting = rank == 0 && part_index.unwrap_or(0) == 0;
    let mode = PsMode::Table(ps.consistency).to_string();
    let mut run = plan.run_record(world, steps);
    if reporting {
        announce(plan, ps, &data, (world, addrs.len()), steps, progress);
        std::fs::create_dir_all(&plan.out).map_err(|source| RankError::Write {
            path: plan.out.clone(),
            source,
        })?;
        let _ = std::fs::remove_file(plan.out.join("metrics.jsonl"));
        record_partition_plan(plan, data.shape(), &mut run, progress)?;
    }
    // The PS path has no momentum correction (the shards run the optimizer).
    run.momentum_correction = None;
    run.codec = ps.codec.to_string();
    let mut table = Table {
        ps,
        who: &who,
        mode: mode.clone(),
        pulled_before: 0,
    };
    let course = Course {
        plan,
        data: &data,
        steps,
        reporting,
    };
    run_epochs(&mut trainer, &course, &mut run, progress, &mut table)?;
    let total_steps = (steps * plan.train.epochs) as u64;
    let mut kept = None;
    match (&plan.save_params, rank, part_index) {
        (Some(p), 0, None) => save_params(p, trainer.params())?,
        (Some(_), 0, Some(_)) => kept = Some(trainer.params().to_vec()),
        _ => {}
    }
    let (_, sync) = trainer.into_parts();
    let (pushed, pulled) = sync.bytes();
    let (pushes, pulls) = sync.ops();
    sync.leave().map_err(failed("leaving the shards"))?;
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
    progress.note(&format!(
        "{who} finished: {total_steps} steps, {pushes} pushes, {pulls} pulls, pushed {} pulled {}",
        crate::plot::human_bytes(pushed as f64),
        crate::plot::human_bytes(pulled as f64)
    ));
    if world > 1 || part_index.is_some() {
        let file = worker_file(&plan.out, world_rank);
        std::fs::create_dir_all(&plan.out).ok();
        std::fs::write(&file, summary.to_string() + "\n")
            .map_err(|source| RankError::Write { path: file, source })?;
    }
    if reporting {
        let totals = serde_json::json!({
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
        write_ps_run(plan, &run, totals, progress)?;
    }
    Ok(kept)
}

/// The reporting worker's first lines: the job, and a warning where stale pushes meet
/// server-side momentum.
fn announce(
    plan: &Plan,
    ps: &PsPlan,
    data: &Dataset,
    (world, table_shards): (usize, usize),
    steps: usize,
    progress: &mut dyn Progress,
) {
    let mode = PsMode::Table(ps.consistency);
    let shards = match &plan.model_parallel {
        Some(mp) => format!(
            "{world} replica(s) x {} partitions ({}), {} shard(s) ({table_shards} per partition's table)",
            mp.partitions,
            mp.split,
            ps.addrs.len(),
        ),
        None => format!("{world} worker(s), {} shard(s)", ps.addrs.len()),
    };
    progress.note(&format!(
        "{} on {} ({} train / {} held out), {shards}, --sync {mode}, server updater {}, pushes {}{}, {} steps/epoch x {} epochs, batch {} per worker",
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
    ));
    if ps.consistency != Consistency::Sync && matches!(ps.updater, UpdaterSpec::Momentum { .. }) {
        progress.note(&format!(
            "warning: under --sync {mode} the shards apply every worker's push with momentum, \
             so {world} stale workers take steps up to {world}/(1-mu) times larger than one; if \
             it diverges use --optimizer adagrad:lr=... (DistBelief's Downpour) or plain SGD"
        ));
    }
}

/// Writes the reporting worker's `run.json` with the `ps` object (`totals`, and the tables
/// under model parallelism).
fn write_ps_run(
    plan: &Plan,
    run: &RunRecord,
    mut totals: Value,
    progress: &mut dyn Progress,
) -> Result<(), RankError> {
    write_run(run, &plan.out, progress)?;
    if let Some(mp) = &plan.model_parallel {
        // One table per partition, each on its own shards; these bytes are partition 0's.
        totals["tables"] = mp.partitions.into();
        totals["servers_per_table"] =
            (totals["servers"].as_u64().unwrap_or(0) / mp.partitions as u64).into();
    }
    let path = plan.out.join("run.json");
    let mut v = read_json(&path)?;
    v["ps"] = totals;
    write_json(&path, &v)?;
    progress.note(&format!("wrote {}", plan.out.display()));
    Ok(())
}

/// Adds every finished worker's summary, the lost workers and each shard's restarts to
/// rank 0's run.json in `out`.
pub fn merge_worker_reports(
    out: &Path,
    workers: usize,
    lost: &[(usize, ExitStatus)],
    restarts: &[u32],
) -> Result<(), RankError> {
    let path = out.join("run.json");
    let mut run = read_json(&path)?;
    let mut reports = Vec::new();
    let (mut pushed, mut pulled) = (0u64, 0u64);
    for r in 0..workers {
        let file = worker_file(out, r);
        if !file.exists() {
            continue;
        }
        let v = read_json(&file)?;
        pushed += v["bytes_pushed"].as_u64().unwrap_or(0);
        pulled += v["bytes_pulled"].as_u64().unwrap_or(0);
        reports.push(v);
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
    write_json(&path, &run)
}

/// A JSON file this run wrote, read bounded.
fn read_json(path: &Path) -> Result<Value, RankError> {
    let read = |source| RankError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(read)?
        .take(MAX_JSON_BYTES)
        .read_to_string(&mut text)
        .map_err(read)?;
    serde_json::from_str(&text).map_err(|source| RankError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

fn write_json(path: &Path, v: &Value) -> Result<(), RankError> {
    let text = serde_json::to_string_pretty(v).map_err(|source| RankError::Json {
        what: "run.json",
        source,
    })?;
    std::fs::write(path, text + "\n").map_err(|source| RankError::Write {
        path: path.to_path_buf(),
        source,
    })
}
