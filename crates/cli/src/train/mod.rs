//! `gradwire train`: data-parallel training of a real model on real data with any codec.
//!
//! Runs as the parent of `--workers` rank processes (TCP on loopback), or as one rank when a
//! launcher set the environment (`gradwire launch`, mpirun, srun, torchrun). Rank 0 shows a
//! progress bar and, per epoch, appends one JSON line (`epoch`, `train_loss`,
//! `test_accuracy` or `val_perplexity`, `wall_s`, `compute_s`, `comm_s`, `bytes_sent`,
//! `compression_ratio`); at the end it writes `run.json` and the plots into `--out`.

mod args;
pub mod elastic;
mod output;
pub mod ps;
mod rank;
pub mod sandblaster;

use anyhow::{bail, Context, Result};
use gradwire_transport::local::Local;

use crate::launch::{describe, spawn_quiet, RankSpec};

pub use args::TrainArgs;
pub use gradwire_job::{Host, Plan};
pub(crate) use output::progress_bar;
use rank::run_linked;
pub(crate) use rank::Shown;

/// Runs `gradwire train`.
pub fn run(args: &TrainArgs) -> Result<()> {
    if let Some(dir) = &args.elastic.join {
        return crate::train::elastic::join(dir);
    }
    let launched = gradwire_run::join::detect()?;
    let plan = args.plan(Host::detect(launched.as_ref()))?;
    if let Some(elastic) = &plan.elastic {
        if launched.is_some() {
            bail!("--elastic starts its own workers: run it without a launcher (or under gradwire launch --elastic)");
        }
        let member = gradwire_run::elastic::Member::from_env(std::time::Duration::from_secs(30))
            .context("joining the elastic coordinator")?;
        if let Some(m) = member {
            let threads = args.run.threads.is_some();
            return crate::train::elastic::run_member(&plan, elastic, m, args.quiet, threads);
        }
        if args.worker {
            bail!("--worker is internal: it needs the environment `gradwire train` sets for its ranks");
        }
        if args.threads_as_workers
            || !matches!(
                args.transport,
                gradwire_run::join::TransportKind::Auto | gradwire_run::join::TransportKind::Tcp
            )
        {
            bail!(
                "--elastic runs its workers as processes over TCP (not --threads-as-workers or --transport {})",
                args.transport.name()
            );
        }
        return crate::train::elastic::run_parent(&plan, elastic);
    }
    if plan.ps.is_some() {
        return crate::train::ps::run(args, &plan, launched.as_ref());
    }
    if let Some(l) = &launched {
        let t = gradwire_run::join::join_with(args.transport, l)?;
        return run_linked(t, &plan, args.quiet);
    }
    if args.worker {
        bail!("--worker is internal: it needs the environment `gradwire train` sets for its ranks");
    }
    gradwire_run::join::check_unlaunched(args.transport)?;
    let local = args.transport == gradwire_run::join::TransportKind::Local;
    if plan.workers == 1 || args.threads_as_workers || local {
        let mut world = Local::world(plan.workers);
        let rest: Vec<_> = world
            .drain(1..)
            .map(|t| {
                let p = plan.clone();
                std::thread::spawn(move || run_linked(t, &p, true))
            })
            .collect();
        let r0 = run_linked(world.pop().expect("rank 0"), &plan, args.quiet);
        for h in rest {
            h.join()
                .map_err(|_| anyhow::anyhow!("a worker thread panicked"))??;
        }
        return r0;
    }
    let spec = worker_spec(plan.workers, Vec::new())?;
    let outcome = spawn_quiet(&spec)?.wait()?;
    if let Some((rank, status)) = outcome.failure {
        bail!(
            "worker {rank} failed ({}); the others were stopped",
            describe(status)
        );
    }
    Ok(())
}

/// One process per worker, `np` of them: this binary again with this process's arguments,
/// `--worker`, and `extra`.
pub(crate) fn worker_spec(np: usize, extra: Vec<String>) -> Result<RankSpec> {
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.push("--worker".into());
    args.extend(extra);
    Ok(RankSpec {
        np,
        master: None,
        timeout: None,
        program: exe.display().to_string(),
        args,
    })
}
