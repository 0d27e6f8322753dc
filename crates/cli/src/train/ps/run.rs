//! Running a parameter-server `train`: as the parent (the shards, the worker processes,
//! the merged report) or as one worker (`gradwire_job::rank::ps_worker`, shown as `gradwire
//! train` shows a rank).

use std::process::ExitStatus;

use anyhow::{bail, Context, Result};
use gradwire_job::rank::{merge_worker_reports, ps_partition, ps_worker, worker_file, PsWorker};
use gradwire_ps::{Consistency, DeadPolicy};

use super::PsMode;
use crate::launch::{describe, spawn_quiet};
use crate::ps::{ShardOptions, Shards};
use crate::train::{worker_spec, Plan, Shown, TrainArgs};

/// Runs a parameter-server `train` (parent, or one worker).
pub fn run(
    args: &TrainArgs,
    plan: &Plan,
    launched: Option<&gradwire_run::join::Launched>,
) -> Result<()> {
    let ps = plan.ps.as_ref().expect("a ps plan");
    if let Some(l) = launched {
        if plan.model_parallel.is_some() {
            let t = gradwire_run::join::join_with(args.transport, l)?;
            return Ok(ps_partition(t, plan, ps, &mut Shown::new(args.quiet))?);
        }
        let (rank, world) = (l.config.rank, l.config.world_size);
        let worker = PsWorker::whole(rank, world);
        return Ok(ps_worker(worker, plan, ps, &mut Shown::new(args.quiet)).map(drop)?);
    }
    if args.worker {
        bail!("--worker is internal: it needs the environment `gradwire train` sets for its ranks");
    }
    if let Some(sb) = &ps.sb {
        return crate::train::sandblaster::run(plan, ps, sb, args.quiet);
    }
    let mut shards = None;
    // Under model parallelism every partition's table gets its own `--servers` shards, each
    // for the replicas (see `gradwire_train::sync::ps`).
    let k = plan.model_parallel.map_or(1, |mp| mp.partitions);
    let addrs = if ps.addrs.is_empty() {
        let opts = ShardOptions::for_run(&plan.out);
        let s = crate::ps::start_shards(ps.servers * k, plan.workers / k, &opts)?;
        let a = s.addrs.clone();
        shards = Some(s);
        a
    } else {
        ps.addrs.clone()
    };
    let mut ps_run = ps.clone();
    ps_run.addrs = addrs.clone();
    if plan.workers == 1 {
        let worker = PsWorker::whole(0, 1);
        return Ok(ps_worker(worker, plan, &ps_run, &mut Shown::new(args.quiet)).map(drop)?);
    }
    std::fs::create_dir_all(&plan.out)
        .with_context(|| format!("creating {}", plan.out.display()))?;
    for r in 0..plan.workers {
        let _ = std::fs::remove_file(worker_file(&plan.out, r));
    }
    let servers = addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let spec = worker_spec(plan.workers, vec![format!("--ps-servers={servers}")])?;
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
    Ok(merge_worker_reports(
        &plan.out,
        plan.workers,
        &lost,
        &restarts,
    )?)
}
