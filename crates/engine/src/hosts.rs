//! Where the ranks are, and the hierarchical all-reduce that follows from it.
//!
//! A rank's host ([`this_host`]): `GRADWIRE_HOSTS` (comma-separated, one name per rank, so a
//! test or a launcher can declare ranks to be on different hosts), else `GRADWIRE_HOST`,
//! else the machine's host name. `GRADWIRE_HIERARCHICAL=0` turns the hierarchy off.
//!
//! At start, every rank says its host (one all-gather of names); when the job spans several
//! hosts and some host runs several ranks, the ranks of each host connect among themselves
//! and all-reduces go within the host over that link, between hosts by one leader per host
//! over the job's transport. Otherwise everything stays flat. Two users:
//! - the engine ([`HostConfig`], from [`host_config_from_env`] or given): its dense tensors
//!   are reduced by [`crate::dense::hierarchical_mean`]; the local link is shared memory or
//!   a transport given by the caller ([`LocalLink`]);
//! - [`HostGroups::connect_from_env`], after joining over TCP: the ranks of a host open
//!   shared memory among themselves and [`HostGroups::all_reduce`] goes through
//!   [`gradwire_collective::hierarchical`] (`gradwire check`, `gradwire bench allreduce`).
//!
//! The choice is logged at info.

use gradwire_collective::bench::HierarchicalAllReduce;
use gradwire_collective::hierarchical::{exchange_layout, Layout};
use gradwire_collective::{Element, ReduceOp};
use gradwire_transport::Transport;

use crate::config::{HostConfig, LocalLink};
use crate::dense::HostLinks;
use crate::error::{Error, Result};

/// Errors of finding this rank's host and joining its host's ranks from the environment.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// `GRADWIRE_HOSTS` does not name one non-empty host per rank.
    #[error("GRADWIRE_HOSTS={list} must name one host per rank ({world}), comma-separated")]
    HostList {
        /// The variable's value.
        list: String,
        /// Ranks in the job.
        world: usize,
    },
    /// The machine's host name could not be read.
    #[error("gethostname failed; set GRADWIRE_HOST")]
    Hostname,
    /// The rank's shared-memory settings could not be read.
    #[error("reading the rank's environment")]
    Env(#[source] gradwire_transport::Error),
    /// The host has several ranks but the environment names no rank to join its shared
    /// memory with.
    #[error("no rank in the environment")]
    NoRank,
    /// The all-gather of the host names failed.
    #[error("exchanging the ranks' hosts")]
    Exchange(#[source] gradwire_collective::Error),
    /// The shared memory among the host's ranks could not be joined.
    #[error("rank {rank}: joining the shared memory of host {host}")]
    Join {
        /// This rank.
        rank: usize,
        /// Its host.
        host: String,
        /// The transport's complaint.
        #[source]
        source: gradwire_transport::Error,
    },
}

/// The hosts of every rank from a `GRADWIRE_HOSTS` value: `world` non-empty names,
/// comma-separated (spaces around a name ignored).
pub fn hosts_from_list(list: &str, world: usize) -> std::result::Result<Vec<String>, HostError> {
    let names: Vec<String> = list.split(',').map(|n| n.trim().to_string()).collect();
    if names.len() != world || names.iter().any(String::is_empty) {
        return Err(HostError::HostList {
            list: list.to_string(),
            world,
        });
    }
    Ok(names)
}

/// Whether a `GRADWIRE_HIERARCHICAL` value turns the hierarchy off (`0`).
pub fn hierarchy_off(value: Option<&str>) -> bool {
    value == Some("0")
}

fn off_in_env() -> bool {
    hierarchy_off(std::env::var("GRADWIRE_HIERARCHICAL").ok().as_deref())
}

/// Rank `rank`'s host (of `world`) from the variables `var` looks up (see the module doc),
/// else `hostname()`.
pub fn host_from(
    var: impl Fn(&str) -> Option<String>,
    rank: usize,
    world: usize,
    hostname: impl FnOnce() -> std::result::Result<String, HostError>,
) -> std::result::Result<String, HostError> {
    if let Some(list) = var("GRADWIRE_HOSTS") {
        let mut names = hosts_from_list(&list, world)?;
        if rank >= names.len() {
            return Err(HostError::HostList { list, world });
        }
        return Ok(names.swap_remove(rank));
    }
    if let Some(h) = var("GRADWIRE_HOST") {
        return Ok(h);
    }
    hostname()
}

/// This rank's host, from the process's environment (see the module doc).
pub fn this_host(rank: usize, world: usize) -> std::result::Result<String, HostError> {
    host_from(|k| std::env::var(k).ok(), rank, world, machine_name)
}

/// The machine's host name.
fn machine_name() -> std::result::Result<String, HostError> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return Err(HostError::Hostname);
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// `2 hosts (2+2 ranks)`.
pub fn describe_layout(layout: &Layout) -> String {
    let sizes: Vec<String> = layout.hosts().iter().map(|h| h.len().to_string()).collect();
    format!("{} hosts ({} ranks)", sizes.len(), sizes.join("+"))
}

/// The engine's host settings for this rank: its host (see the module doc) and the job's
/// shared-memory settings, from which the engine opens shared memory among the ranks of a
/// host when the job spans several hosts. `None` (the engine stays flat) for a one-rank job,
/// with `GRADWIRE_HIERARCHICAL=0`, or when the rank's environment has no shared-memory
/// settings (ranks that are threads of one process).
#[cfg(unix)]
pub fn host_config_from_env(
    rank: usize,
    world: usize,
) -> std::result::Result<Option<HostConfig>, HostError> {
    if world < 2 || off_in_env() {
        return Ok(None);
    }
    let Some(job) = gradwire_transport::shm::config_from_env().map_err(HostError::Env)? else {
        return Ok(None);
    };
    Ok(Some(HostConfig {
        host: this_host(rank, world)?,
        local: LocalLink::Shm(job),
    }))
}

/// This rank's place among the hosts, once exchanged.
struct Placement {
    layout: Layout,
    /// The job ranks of this rank's host, ascending.
    local_ranks: Vec<usize>,
    /// This rank's position among them.
    me: usize,
}

impl Placement {
    /// Exchanges the hosts over `t` (every rank calls it).
    fn exchange(t: &mut dyn Transport, host: &str) -> gradwire_collective::Result<Placement> {
        let rank = t.rank();
        let layout = exchange_layout(t, host)?;
        let local_ranks = layout
            .host_of(rank)
            .ok_or(gradwire_collective::Error::Malformed {
                peer: rank,
                what: "this rank is missing from the exchanged host layout",
            })?
            .to_vec();
        let me = local_ranks.iter().position(|&r| r == rank).unwrap_or(0);
        Ok(Placement {
            layout,
            local_ranks,
            me,
        })
    }

    fn into_links(self, local: Option<Box<dyn Transport>>) -> HostLinks {
        HostLinks {
            local,
            leaders: self.layout.leaders(),
            world: self.layout.world_size(),
            sizes: self.layout.hosts().iter().map(Vec::len).collect(),
            local_ranks: self.local_ranks,
        }
    }
}

/// Engines of this process that opened shared memory so far.
static ENGINES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The engine's start: exchanges the hosts over `t` and, when the layout is hierarchical,
/// connects this host's ranks over `cfg.local`. `None`: flat. Every rank calls it.
pub(crate) fn connect(t: &mut dyn Transport, cfg: &HostConfig) -> Result<Option<HostLinks>> {
    let rank = t.rank();
    let place = Placement::exchange(t, &cfg.host)?;
    let described = describe_layout(&place.layout);
    if !place.layout.is_hierarchical() {
        tracing::info!(
            rank,
            host = %cfg.host,
            layout = %described,
            "engine: flat dense all-reduce (no host runs several ranks of several hosts)"
        );
        return Ok(None);
    }
    let (me, n) = (place.me, place.local_ranks.len());
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
                     ranks {:?} (this one local rank {me})",
                    l.rank(),
                    l.world_size(),
                    cfg.host,
                    place.local_ranks
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
    Ok(Some(place.into_links(local)))
}

/// This rank's part of a hierarchical job outside the engine: the shared memory among its
/// host's ranks and the hosts' leaders.
pub struct HostGroups {
    links: HostLinks,
}

impl HostGroups {
    /// After joining over TCP: exchanges the ranks' hosts ([`this_host`]) and, when the
    /// layout is hierarchical, joins this host's shared memory (the job's settings from the
    /// environment, its token + `/host:NAME`). `None` when the job is flat or
    /// `GRADWIRE_HIERARCHICAL=0`. Every rank calls it.
    pub fn connect_from_env(
        t: &mut dyn Transport,
    ) -> std::result::Result<Option<HostGroups>, HostError> {
        if off_in_env() {
            return Ok(None);
        }
        let (rank, world) = (t.rank(), t.world_size());
        let host = this_host(rank, world)?;
        let place = Placement::exchange(t, &host).map_err(HostError::Exchange)?;
        if !place.layout.is_hierarchical() {
            return Ok(None);
        }
        let local: Option<Box<dyn Transport>> = if place.local_ranks.len() > 1 {
            let mut cfg = gradwire_transport::shm::config_from_env()
                .map_err(HostError::Env)?
                .ok_or(HostError::NoRank)?;
            cfg.rank = place.me;
            cfg.world_size = place.local_ranks.len();
            cfg.job = format!("{}/host:{host}", cfg.job);
            let shm =
                gradwire_transport::shm::Shm::connect(&cfg).map_err(|source| HostError::Join {
                    rank,
                    host: host.clone(),
                    source,
                })?;
            Some(Box::new(shm))
        } else {
            None
        };
        let groups = HostGroups {
            links: place.into_links(local),
        };
        tracing::info!(rank, host, layout = %groups.describe(), "hierarchical all-reduce");
        Ok(Some(groups))
    }

    /// All-reduces `buf` through the hierarchy (within the host, between the leaders over
    /// `world`, back within the host); `world` is the job's transport. Every rank calls it.
    pub fn all_reduce<E: Element>(
        &mut self,
        world: &mut dyn Transport,
        buf: &mut [E],
        op: ReduceOp,
    ) -> gradwire_collective::Result<()> {
        self.links.all_reduce(world, buf, op)
    }

    /// `2 hosts (2+2 ranks)`.
    pub fn describe(&self) -> String {
        self.links.describe()
    }
}

impl HierarchicalAllReduce for HostGroups {
    fn all_reduce_f32(
        &mut self,
        world: &mut dyn Transport,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> gradwire_collective::Result<()> {
        self.all_reduce(world, buf, op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn no_hostname() -> std::result::Result<String, HostError> {
        Ok("machine".into())
    }

    #[test]
    fn a_host_list_gives_every_rank_its_host() {
        let names = hosts_from_list("a, a,b ,b", 4).unwrap();
        assert_eq!(names, ["a", "a", "b", "b"]);
        let layout = Layout::from_hosts(&names);
        assert!(layout.is_hierarchical());
        assert_eq!(layout.hosts(), [vec![0, 1], vec![2, 3]]);
        assert_eq!(describe_layout(&layout), "2 hosts (2+2 ranks)");

        let layout = Layout::from_hosts(&hosts_from_list("x,y,x", 3).unwrap());
        assert_eq!(layout.hosts(), [vec![0, 2], vec![1]]);
        assert_eq!(layout.leaders(), [0, 1]);
        assert_eq!(describe_layout(&layout), "2 hosts (2+1 ranks)");
    }

    #[test]
    fn one_host_or_one_rank_per_host_stays_flat() {
        for (list, n) in [("a,a,a", 3), ("a,b,c", 3), ("solo", 1)] {
            let layout = Layout::from_hosts(&hosts_from_list(list, n).unwrap());
            assert!(!layout.is_hierarchical(), "{list}");
        }
    }

    #[test]
    fn a_host_list_of_the_wrong_length_or_with_a_gap_is_refused() {
        for (list, n) in [("a,a,b", 4), ("a,a,b,b,c", 4), ("a,,b,b", 4), ("", 1)] {
            let err = hosts_from_list(list, n).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("GRADWIRE_HOSTS={list} must name one host per rank ({n}), comma-separated")
            );
        }
    }

    #[test]
    fn the_list_comes_first_then_the_declared_host_then_the_machine() {
        let both = [("GRADWIRE_HOSTS", "a,b,c"), ("GRADWIRE_HOST", "d")];
        assert_eq!(host_from(vars(&both), 1, 3, no_hostname).unwrap(), "b");
        let one = [("GRADWIRE_HOST", "d")];
        assert_eq!(host_from(vars(&one), 1, 3, no_hostname).unwrap(), "d");
        assert_eq!(host_from(vars(&[]), 1, 3, no_hostname).unwrap(), "machine");
        // A list for another world size is an error, not a fallback.
        assert!(matches!(
            host_from(vars(&both), 0, 2, no_hostname),
            Err(HostError::HostList { world: 2, .. })
        ));
        assert!(host_from(vars(&both), 5, 3, no_hostname).is_err());
    }

    #[test]
    fn only_zero_turns_the_hierarchy_off() {
        assert!(hierarchy_off(Some("0")));
        for v in [None, Some("1"), Some(""), Some("no"), Some(" 0")] {
            assert!(!hierarchy_off(v), "{v:?}");
        }
    }

    /// Ranks "on" hosts a,a,b,b and x,y,x over in-process transports, the hosts' local links
    /// in-process too: the hierarchical sum equals the flat one, and `describe` says the
    /// layout.
    #[test]
    fn host_groups_all_reduce_equals_the_flat_sum() {
        use gradwire_transport::local::Local;
        for hosts in [vec!["a", "a", "b", "b"], vec!["x", "y", "x"]] {
            let n = hosts.len();
            let layout = Layout::from_hosts(&hosts);
            // One local world per host, its ranks in job-rank order.
            let mut locals: Vec<Option<Box<dyn Transport>>> = (0..n).map(|_| None).collect();
            for ranks in layout.hosts() {
                if ranks.len() > 1 {
                    for (t, &r) in Local::world(ranks.len()).into_iter().zip(ranks) {
                        locals[r] = Some(Box::new(t));
                    }
                }
            }
            let hs: Vec<_> = Local::world(n)
                .into_iter()
                .zip(locals)
                .map(|(mut t, local)| {
                    let layout = layout.clone();
                    std::thread::spawn(move || {
                        let rank = t.rank();
                        let local_ranks = layout.host_of(rank).unwrap().to_vec();
                        let me = local_ranks.iter().position(|&r| r == rank).unwrap();
                        let mut g = HostGroups {
                            links: Placement {
                                layout,
                                local_ranks,
                                me,
                            }
                            .into_links(local),
                        };
                        let mut buf: Vec<f32> =
                            (0..1001).map(|i| (i * (rank + 1)) as f32).collect();
                        g.all_reduce_f32(&mut t, &mut buf, ReduceOp::Sum).unwrap();
                        (buf, g.describe())
                    })
                })
                .collect();
            let tri = (n * (n + 1) / 2) as f32;
            let want: Vec<f32> = (0..1001).map(|i| i as f32 * tri).collect();
            for h in hs {
                let (buf, d) = h.join().unwrap();
                assert_eq!(buf, want, "{hosts:?}");
                assert_eq!(d, describe_layout(&layout));
            }
        }
    }
}
