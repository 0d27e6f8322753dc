//! Hierarchical all-reduce for `gradwire check` and `bench allreduce`, chosen from where the
//! ranks are: after joining over TCP, every rank says its host; when some host runs several
//! ranks and there is more than one host, the ranks of each host open shared memory among
//! themselves and all-reduces go through
//! [`gradwire_collective::hierarchical`] (reduce to the host's leader over shared memory,
//! leaders all-reduce over the TCP mesh, broadcast within the host).
//!
//! A rank's host: `GRADWIRE_HOSTS` (comma-separated, one name per rank, so a test or a
//! launcher can declare ranks to be on different hosts), else `GRADWIRE_HOST`, else the
//! machine's host name. `GRADWIRE_HIERARCHICAL=0` turns it off. `train` and `bench engine`
//! hand the same host and shared-memory settings to the engine ([`engine_hosts`]), which
//! makes the same choice for its dense tensors.

use anyhow::{bail, Context, Result};
use gradwire_collective::hierarchical::{self, exchange_layout, Group, Layout};
use gradwire_collective::{Element, ReduceOp};
use gradwire_transport::shm::{self, Shm};
use gradwire_transport::Transport;

/// This rank's part of a hierarchical job.
pub struct Hier {
    layout: Layout,
    /// Shared memory among this host's ranks (`None` when it is the host's only rank).
    local: Option<Shm>,
    local_ranks: Vec<usize>,
    leaders: Vec<usize>,
}

impl Hier {
    /// All-reduces `buf` through the hierarchy; `world` is the job's TCP transport.
    pub fn all_reduce<E: Element>(
        &mut self,
        world: &mut dyn Transport,
        buf: &mut [E],
        op: ReduceOp,
    ) -> Result<()> {
        let n = self.layout.world_size();
        let mut cross = Group::new(world, self.leaders.clone());
        match self.local.as_mut() {
            Some(local) => hierarchical::all_reduce(
                local,
                cross.as_mut(),
                &self.local_ranks,
                &self.leaders,
                n,
                buf,
                op,
            )?,
            None => {
                // Alone on the host: only the leaders' step.
                let mut solo = gradwire_transport::local::Local::world(1);
                hierarchical::all_reduce(
                    &mut solo[0],
                    cross.as_mut(),
                    &self.local_ranks,
                    &self.leaders,
                    n,
                    buf,
                    op,
                )?
            }
        }
        Ok(())
    }

    /// `2 hosts (2+2 ranks)`.
    pub fn describe(&self) -> String {
        let sizes: Vec<String> = self
            .layout
            .hosts()
            .iter()
            .map(|h| h.len().to_string())
            .collect();
        format!("{} hosts ({} ranks)", sizes.len(), sizes.join("+"))
    }
}

/// This rank's host name (see the module doc).
fn my_host(rank: usize, world: usize) -> Result<String> {
    if let Ok(list) = std::env::var("GRADWIRE_HOSTS") {
        let names: Vec<&str> = list.split(',').map(str::trim).collect();
        if names.len() != world || names.iter().any(|n| n.is_empty()) {
            bail!("GRADWIRE_HOSTS={list} must name one host per rank ({world}), comma-separated");
        }
        return Ok(names[rank].to_string());
    }
    if let Ok(h) = std::env::var("GRADWIRE_HOST") {
        return Ok(h);
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        bail!("gethostname failed; set GRADWIRE_HOST");
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// The engine's host settings for this rank ([`gradwire_engine::HostConfig`]): its host (see
/// the module doc) and the job's shared-memory settings, from which the engine opens shared
/// memory among the ranks of a host when the job spans several hosts. `None` (the engine
/// stays flat) for a one-rank job, with `GRADWIRE_HIERARCHICAL=0`, or when the rank's
/// environment has no shared-memory settings (ranks that are threads of one process).
pub fn engine_hosts(rank: usize, world: usize) -> Result<Option<gradwire_engine::HostConfig>> {
    if world < 2 || std::env::var("GRADWIRE_HIERARCHICAL").is_ok_and(|v| v == "0") {
        return Ok(None);
    }
    let Some(job) = shm::config_from_env().context("reading the rank's environment")? else {
        return Ok(None);
    };
    Ok(Some(gradwire_engine::HostConfig {
        host: my_host(rank, world)?,
        local: gradwire_engine::LocalLink::Shm(job),
    }))
}

/// After joining over TCP: exchanges the ranks' hosts and, when the layout is hierarchical,
/// joins this host's shared memory. `None` when the job is flat (or the hierarchy is off).
pub fn detect(t: &mut dyn Transport) -> Result<Option<Hier>> {
    if std::env::var("GRADWIRE_HIERARCHICAL").is_ok_and(|v| v == "0") {
        return Ok(None);
    }
    let (rank, world) = (t.rank(), t.world_size());
    let host = my_host(rank, world)?;
    let layout = exchange_layout(t, &host).context("exchanging the ranks' hosts")?;
    if !layout.is_hierarchical() {
        return Ok(None);
    }
    let local_ranks = layout
        .host_of(rank)
        .context("this rank in the layout")?
        .to_vec();
    let leaders = layout.leaders();
    let local =
        if local_ranks.len() > 1 {
            let mut cfg = shm::config_from_env()
                .context("reading the rank's environment")?
                .context("no rank in the environment")?;
            cfg.rank = local_ranks.iter().position(|&r| r == rank).unwrap_or(0);
            cfg.world_size = local_ranks.len();
            cfg.job = format!("{}/host:{host}", cfg.job);
            Some(Shm::connect(&cfg).with_context(|| {
                format!("rank {rank}: joining the shared memory of host {host}")
            })?)
        } else {
            None
        };
    let h = Hier {
        layout,
        local,
        local_ranks,
        leaders,
    };
    tracing::info!(rank, host, layout = %h.describe(), "hierarchical all-reduce");
    Ok(Some(h))
}
