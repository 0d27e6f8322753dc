//! Joining a job: one launcher detection for `train`, `bench` and `check`, and the transport
//! a rank uses, from the environment its launcher set.

use anyhow::{bail, Context, Result};
use gradwire_transport::env::{local_size_from, tcp_config_from_env};
use gradwire_transport::tcp::{Tcp, TcpConfig};

/// This process as one rank of a launched job.
#[derive(Debug, Clone)]
pub struct Launched {
    /// The rendezvous settings (rank, world size, master, token, deadline).
    pub config: TcpConfig,
    /// Ranks of the job on this host (the launcher's local size; the world size when the
    /// launcher does not say).
    pub local_size: usize,
}

/// Detects a launcher (gradwire launch, torchrun, mpirun, srun) from the environment and
/// logs what it found; `None` for a plain process.
pub fn detect() -> Result<Option<Launched>> {
    let Some((config, launcher)) =
        tcp_config_from_env().context("reading the rank's environment")?
    else {
        return Ok(None);
    };
    let local_size = local_size_from(|k| std::env::var(k).ok()).unwrap_or(config.world_size.max(1));
    tracing::info!(
        ?launcher,
        rank = config.rank,
        world_size = config.world_size,
        local_size,
        master = %config.master,
        "launched rank"
    );
    Ok(Some(Launched { config, local_size }))
}

/// Joins the job described by `launched`.
pub fn join(launched: &Launched) -> Result<Tcp> {
    let cfg = &launched.config;
    Tcp::connect(cfg).with_context(|| {
        format!(
            "rank {} of {}: joining the job through rank 0 at {}",
            cfg.rank, cfg.world_size, cfg.master
        )
    })
}

/// Joins the job described by the environment, or explains how to start one.
pub fn join_from_env() -> Result<Tcp> {
    let Some(launched) = detect()? else {
        bail!(
            "no rank in the environment: run this under `gradwire launch -n N -- ...` \
             (or torchrun, mpirun, srun), which set GRADWIRE_RANK and GRADWIRE_WORLD_SIZE"
        );
    };
    join(&launched)
}
