//! Choosing the hierarchical dense path from where the ranks are: at
//! start, every rank says its host ([`HostConfig::host`]); when the job spans several hosts
//! and some host runs several ranks, the ranks of each host connect among themselves
//! ([`LocalLink`]: shared memory, or a transport given by the caller) and dense tensors are
//! reduced by [`crate::dense::hierarchical_mean`]: within the host over that link, between
//! hosts by one leader per host over the job's transport. Otherwise the engine stays flat.
//! The choice is logged at info.

use gradwire_collective::hierarchical::exchange_layout;
use gradwire_transport::Transport;

use crate::config::{HostConfig, LocalLink};
use crate::dense::HostLinks;
use crate::error::{Error, Result};

/// Engines of this process that opened shared memory so far.
static ENGINES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Exchanges the hosts over `t` and, when the layout is hierarchical, connects this host's
/// ranks. `None`: flat. Every rank calls it (one all-gather of host names).
pub(crate) fn connect(t: &mut dyn Transport, cfg: &HostConfig) -> Result<Option<HostLinks>> {
    let (rank, world) = (t.rank(), t.world_size());
    let layout = exchange_layout(t, &cfg.host)?;
    let sizes: Vec<String> = layout.hosts().iter().map(|h| h.len().to_string()).collect();
    let described = format!("{} hosts ({} ranks)", sizes.len(), sizes.join("+"));
    if !layout.is_hierarchical() {
        tracing::info!(
            rank,
            host = %cfg.host,
            layout = %described,
            "engine: flat dense all-reduce (no host runs several ranks of several hosts)"
        );
        return Ok(None);
    }
    let local_ranks = layout
        .host_of(rank)
        .ok_or_else(|| Error::InvalidSetting {
            field: "hosts",
            reason: format!("rank {rank} is missing from the exchanged host layout"),
        })?
        .to_vec();
    let me = local_ranks.iter().position(|&r| r == rank).unwrap_or(0);
    let n = local_ranks.len();
    let local: Option<Box<dyn Transport>> = if n == 1 {
        None
    } else {
        let l: Box<dyn Transport> = match &cfg.local {
            #[cfg(unix)]
            LocalLink::Shm(job) => {
                let mut c = job.clone();
                c.rank = me;
                c.world_size = n;
                // Each engine of a process its own segment: the ranks start their engines
                // in the same order, so the n-th engine of every rank of a host meets.
                let n = ENGINES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                c.job = format!("{}/host:{}/engine:{n}", job.job, cfg.host);
                Box::new(gradwire_transport::shm::Shm::connect(&c)?)
            }
            LocalLink::Given(slot) => slot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .ok_or_else(|| Error::InvalidSetting {
                    field: "hosts",
                    reason: "the given local transport was already taken by another engine".into(),
                })?,
        };
        if l.world_size() != n || l.rank() != me {
            return Err(Error::InvalidSetting {
                field: "hosts",
                reason: format!(
                    "rank {rank}'s local transport is rank {} of {}, but the host {} has \
                     ranks {local_ranks:?} (this one local rank {me})",
                    l.rank(),
                    l.world_size(),
                    cfg.host
                ),
            });
        }
        Some(l)
    };
    tracing::info!(
        rank,
        host = %cfg.host,
        layout = %described,
        "engine: hierarchical dense all-reduce (within a host over its local link, one \
         leader per host over the network)"
    );
    Ok(Some(HostLinks {
        local,
        local_ranks,
        leaders: layout.leaders(),
        world,
        sizes: layout.hosts().iter().map(Vec::len).collect(),
    }))
}
