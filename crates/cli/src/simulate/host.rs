//! Starting the P ranks of `gradwire simulate --host-cores` and gathering their timings.
//!
//! [`lockstep_step`] starts P processes of this binary (`simulate --host-worker`), each a copy
//! of the model, joined over TCP on 127.0.0.1 without link emulation, as `gradwire train`'s
//! workers are; each runs [`host_worker`], whose training steps through the engine are
//! [`gradwire_train::measure::rank_steps`], and rank 0 prints the ranks' timings summarized
//! ([`gradwire_sim::lockstep::host_step`]) as one [`HostStep`]. What is measured, and why it
//! is measured rather than scaled, is [`gradwire_train::measure::host`]'s module doc.

use anyhow::{bail, Context, Result};
use gradwire_codec::CodecConfig;
use gradwire_engine::EngineConfig;
use gradwire_train::data::{Batch, DataShape};
use gradwire_train::measure::{rank_steps, HostStep, MAX_SHARED_WORKERS};

use crate::simulate::SimulateArgs;

/// Runs `workers` ranks at once, each a process of this binary (`simulate --host-worker`,
/// started as `gradwire train` starts its workers) with its own model copy and the threads
/// `gradwire train` would give it (the host's `cores` divided among the ranks), for
/// [`LOCKSTEP_PASSES`](gradwire_train::measure::LOCKSTEP_PASSES) training steps, each rank's
/// gradient all-reduced through an engine with `codec` over TCP on 127.0.0.1, no link
/// emulation. The engine runs past any warm-up
/// (DGC's sparsity schedule), as the codec measurements do. Processes, not threads: ranks as
/// threads of one process read 15% more per step than the runs' processes at 4 ranks on 2
/// cores (measured at `feb217b`, 2026-12-04), as their compute did on one shared thread pool
/// (validation at `513327c`).
pub fn lockstep_step(
    args: &SimulateArgs,
    codec: &str,
    workers: usize,
    cores: usize,
) -> Result<HostStep> {
    if workers == 0 || workers > MAX_SHARED_WORKERS {
        bail!(
            "--host-cores measures the workers' steps on this host, 1 to \
             {MAX_SHARED_WORKERS} of them; got {workers}"
        );
    }
    let child = vec![
        "simulate".to_string(),
        "--host-worker".into(),
        format!("--model={}", args.model),
        format!("--dataset={}", args.dataset.name()),
        format!("--batch={}", args.batch),
        format!("--seed={}", args.seed),
        format!("--fusion-bytes={}", args.fusion_bytes),
        format!("--host-cores={cores}"),
        format!("--workers={workers}"),
        format!("--codec={codec}"),
    ];
    let mut h: HostStep = crate::launch::run_ranks_for_json(workers, child)
        .with_context(|| format!("measuring {workers} ranks of {codec} on this host"))?;
    h.codec = codec.to_string();
    Ok(h)
}

/// One rank of [`lockstep_step`] (`gradwire simulate --host-worker`, under the environment
/// the launcher sets): steps through the engine, then gathers every rank's timings on rank
/// 0, which prints the [`HostStep`] as one JSON line.
pub fn host_worker(
    args: &SimulateArgs,
    codec: CodecConfig,
    data: DataShape,
    batch: &Batch,
) -> Result<()> {
    let launched = gradwire_run::join::detect()?.context(
        "--host-worker is internal: it needs the environment `simulate --host-cores` sets \
         for its ranks",
    )?;
    let t = gradwire_run::join::join_with(gradwire_run::join::TransportKind::Tcp, &launched)?;
    let (rank, workers) = (t.rank(), t.world_size());
    let cores = args
        .host_cores
        .context("--host-worker needs --host-cores")?;
    // The threads `gradwire train` gives a worker process.
    gradwire_train::init_threads(gradwire_train::threads_per_worker(cores, workers));
    let model = args
        .model
        .build(data, args.seed)
        .with_context(|| format!("building {}", args.model))?;
    let config = EngineConfig {
        codec,
        fusion_bytes: args.fusion_bytes,
        seed: args.seed,
        ..EngineConfig::default()
    };
    let (compute, step_s, mut t) = rank_steps(model, batch, t, &config)?;
    let mine = gradwire_sim::host::encode(step_s, &compute);
    let mut all = Vec::new();
    gradwire_collective::gather::all_gather_bytes(t.as_mut(), &mine, &mut all)
        .context("gathering the ranks' timings")?;
    if rank != 0 {
        return Ok(());
    }
    // The codec is named by the launcher, which knows its spec as given.
    let h = gradwire_sim::lockstep::host_step(&all, "")?;
    println!("{}", serde_json::to_string(&h)?);
    Ok(())
}
