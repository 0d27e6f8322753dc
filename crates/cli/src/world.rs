//! Joining a job: the transport a rank uses, from the environment its launcher set.

use anyhow::{bail, Context, Result};
use gradwire_transport::env::tcp_config_from_env;
use gradwire_transport::tcp::Tcp;

/// Joins the job described by the environment (gradwire launch, torchrun, mpirun, srun).
pub fn join_from_env() -> Result<Tcp> {
    let Some((cfg, launcher)) = tcp_config_from_env().context("reading the rank's environment")?
    else {
        bail!(
            "no rank in the environment: run this under `gradwire launch -n N -- ...` \
             (or torchrun, mpirun, srun), which set GRADWIRE_RANK and GRADWIRE_WORLD_SIZE"
        );
    };
    tracing::debug!(?launcher, rank = cfg.rank, world_size = cfg.world_size, master = %cfg.master, "joining");
    Tcp::connect(&cfg).with_context(|| {
        format!(
            "rank {} of {}: joining the job through rank 0 at {}",
            cfg.rank, cfg.world_size, cfg.master
        )
    })
}
