//! A rank's identity from the environment: gradwire's own variables, or those of torchrun,
//! Open MPI's `mpirun` and Slurm, so a rank runs under the launchers people already use.
//!
//! | what | gradwire | torchrun | Open MPI | Slurm | MPICH / PMI |
//! |---|---|---|---|---|---|
//! | rank | `GRADWIRE_RANK` | `RANK` | `OMPI_COMM_WORLD_RANK` | `SLURM_PROCID` | `PMI_RANK` |
//! | world size | `GRADWIRE_WORLD_SIZE` | `WORLD_SIZE` | `OMPI_COMM_WORLD_SIZE` | `SLURM_NTASKS` | `PMI_SIZE` |
//! | master | `GRADWIRE_MASTER_ADDR`, `GRADWIRE_MASTER_PORT` | `MASTER_ADDR`, `MASTER_PORT` | | | |
//!
//! The first source that names a rank wins. The master defaults to `127.0.0.1:29500`; under
//! torchrun, whose agent serves its own store on `MASTER_PORT` for the whole run
//! (`TORCHELASTIC_USE_AGENT_STORE=True`), the rendezvous takes `MASTER_PORT + 1` unless
//! `GRADWIRE_MASTER_PORT` is set. [`local_rank_from`] reads the local rank the same way;
//! `GRADWIRE_TOKEN` is the shared secret (empty if unset: refused unless the master is
//! loopback or `GRADWIRE_INSECURE=1`), `GRADWIRE_JOB_ID` the job's identity (`gradwire
//! launch` sets a random one; without it the launcher's own job id, [`job_id_from`], is
//! used), `GRADWIRE_TIMEOUT` the deadline in seconds, `GRADWIRE_SOCKET_BUFFER` the TCP socket
//! buffers in bytes and `GRADWIRE_TCP_SPIN_US` how long a TCP receive spins before sleeping
//! ([`TcpConfig::spin`]).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use crate::tcp::TcpConfig;
use crate::{Error, Result, DEFAULT_TIMEOUT};

/// The default rendezvous port (torchrun's).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// Which convention the environment followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `gradwire launch` (`GRADWIRE_*`).
    Gradwire,
    /// torchrun / torch.distributed (`RANK`, `WORLD_SIZE`).
    Torchrun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`).
    Slurm,
    /// A PMI launcher such as MPICH's `mpiexec` (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
}

/// Reads the TCP configuration of this rank from the process environment; `Ok(None)` when no
/// launcher set a rank (a plain, single-process run).
pub fn tcp_config_from_env() -> Result<Option<(TcpConfig, Launcher)>> {
    tcp_config_from(|k| std::env::var(k).ok())
}

/// [`tcp_config_from_env`] over any variable lookup (testable without touching the process).
pub fn tcp_config_from(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<(TcpConfig, Launcher)>> {
    let sources = [
        (Launcher::Gradwire, "GRADWIRE_RANK", "GRADWIRE_WORLD_SIZE"),
        (Launcher::Torchrun, "RANK", "WORLD_SIZE"),
        (
            Launcher::OpenMpi,
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
        ),
        (Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS"),
        (Launcher::Pmi, "PMI_RANK", "PMI_SIZE"),
    ];
    let Some(&(launcher, rank_var, size_var)) = sources.iter().find(|(_, r, _)| get(r).is_some())
    else {
        return Ok(None);
    };
    let num = |var: &str| -> Result<usize> {
        let v = get(var).ok_or_else(|| Error::Env {
            reason: format!("{rank_var} is set but {var} is not"),
        })?;
        v.trim().parse().map_err(|_| Error::Env {
            reason: format!("{var}={v} is not a non-negative integer"),
        })
    };
    let rank = num(rank_var)?;
    let world_size = num(size_var)?;
    if world_size == 0 || rank >= world_size {
        return Err(Error::Env {
            reason: format!("{rank_var}={rank} is out of range for {size_var}={world_size}"),
        });
    }
    let host = get("GRADWIRE_MASTER_ADDR")
        .or_else(|| get("MASTER_ADDR"))
        .unwrap_or_else(|| "127.0.0.1".into());
    let port = match get("GRADWIRE_MASTER_PORT") {
        Some(p) => parse_port(&p)?,
        None => match get("MASTER_PORT") {
            None => DEFAULT_MASTER_PORT,
            // torchrun's agent serves its own store on MASTER_PORT for the whole run: the
            // rendezvous takes the next port (GRADWIRE_MASTER_PORT chooses another).
            Some(p) if launcher == Launcher::Torchrun && agent_store(&get) => {
                parse_port(&p)?.checked_add(1).ok_or_else(|| Error::Env {
                    reason: format!(
                        "MASTER_PORT={p} is torchrun's store and leaves no port after it for \
                         the rendezvous: set GRADWIRE_MASTER_PORT"
                    ),
                })?
            }
            Some(p) => parse_port(&p)?,
        },
    };
    let timeout = match get("GRADWIRE_TIMEOUT") {
        None => DEFAULT_TIMEOUT,
        Some(t) => parse_seconds(&t).ok_or_else(|| Error::Env {
            reason: format!("GRADWIRE_TIMEOUT={t} is not a positive number of seconds"),
        })?,
    };
    // The lookup gets the rendezvous deadline: a resolver that hangs fails like a master
    // that does not answer.
    let master = resolve_within(&host, port, timeout)?;
    let mut cfg = TcpConfig::new(
        rank,
        world_size,
        master,
        get("GRADWIRE_TOKEN").unwrap_or_default(),
    );
    cfg.timeout = timeout;
    cfg.job = job_identity_from(&get).unwrap_or_default();
    cfg.insecure = match get("GRADWIRE_INSECURE").as_deref().map(str::trim) {
        None | Some("" | "0") => false,
        Some("1") => true,
        Some(v) => {
            return Err(Error::Env {
                reason: format!("GRADWIRE_INSECURE={v} is neither 0 nor 1"),
            })
        }
    };
    if let Some(b) = get("GRADWIRE_SOCKET_BUFFER") {
        cfg.socket_buffer = Some(b.trim().parse().map_err(|_| Error::Env {
            reason: format!("GRADWIRE_SOCKET_BUFFER={b} is not a byte count"),
        })?);
    }
    if let Some(v) = get("GRADWIRE_TCP_SPIN_US") {
        let us: u64 = v.trim().parse().map_err(|_| Error::Env {
            reason: format!("GRADWIRE_TCP_SPIN_US={v} is not a number of microseconds"),
        })?;
        cfg.spin = Duration::from_micros(us.min(10_000_000));
    }
    Ok(Some((cfg, launcher)))
}

/// Parses a positive number of seconds (`30`, `0.5`).
pub fn parse_seconds(s: &str) -> Option<Duration> {
    let x: f64 = s.trim().parse().ok()?;
    (x.is_finite() && x > 0.0).then(|| Duration::from_secs_f64(x))
}

/// Default deadline of a name lookup.
pub const DEFAULT_RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Resolves `host:port` to one socket address, within [`DEFAULT_RESOLVE_TIMEOUT`].
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    resolve_within(host, port, DEFAULT_RESOLVE_TIMEOUT)
}

/// Resolves `host:port` to one socket address, failing after `timeout`. The system resolver
/// cannot be cancelled, so the lookup runs on a helper thread that is left to finish on its
/// own when the deadline passes.
pub fn resolve_within(host: &str, port: u16, timeout: Duration) -> Result<SocketAddr> {
    let host = host.trim().trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let name = host.to_string();
    lookup_within(host, timeout, move || {
        (name.as_str(), port)
            .to_socket_addrs()
            .map(|mut a| a.next())
    })
}

/// Runs a name lookup on a helper thread and waits for it at most `timeout`.
fn lookup_within(
    host: &str,
    timeout: Duration,
    lookup: impl FnOnce() -> std::io::Result<Option<SocketAddr>> + Send + 'static,
) -> Result<SocketAddr> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("gradwire-resolve".into())
        .spawn(move || {
            let _ = tx.send(lookup());
        })
        .map_err(|e| Error::Env {
            reason: format!("cannot start a name lookup for {host}: {e}"),
        })?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(Some(a))) => Ok(a),
        Ok(Ok(None)) => Err(Error::Env {
            reason: format!("master address {host} resolves to nothing"),
        }),
        Ok(Err(e)) => Err(Error::Env {
            reason: format!("cannot resolve master address {host}: {e}"),
        }),
        Err(_) => Err(Error::Env {
            reason: format!("resolving master address {host} took longer than {timeout:?}"),
        }),
    }
}

fn parse_port(p: &str) -> Result<u16> {
    p.trim().parse().map_err(|_| Error::Env {
        reason: format!("master port {p} is not a port number"),
    })
}

/// Whether torchrun's agent hosts the job's store on `MASTER_PORT` (torchrun sets
/// `TORCHELASTIC_USE_AGENT_STORE=True`; it does since PyTorch 2.0).
fn agent_store(get: &impl Fn(&str) -> Option<String>) -> bool {
    get("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// This process's position among the job's ranks on its host, as the launcher tells it:
/// `GRADWIRE_LOCAL_RANK` (`gradwire launch`), `LOCAL_RANK` (torchrun),
/// `OMPI_COMM_WORLD_LOCAL_RANK` (Open MPI), `SLURM_LOCALID` (Slurm), `MPI_LOCALRANKID`
/// (MPICH). `None` when none is set or a value is not a non-negative integer.
pub fn local_rank_from(get: impl Fn(&str) -> Option<String>) -> Option<usize> {
    [
        "GRADWIRE_LOCAL_RANK",
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "SLURM_LOCALID",
        "MPI_LOCALRANKID",
    ]
    .iter()
    .find_map(|k| get(k)?.trim().parse().ok())
}

/// How many ranks of the job run on this host, as the launcher tells it:
/// `GRADWIRE_LOCAL_SIZE` (`gradwire launch`), `LOCAL_WORLD_SIZE` (torchrun),
/// `OMPI_COMM_WORLD_LOCAL_SIZE` (Open MPI), `SLURM_STEP_TASKS_PER_NODE` or
/// `SLURM_NTASKS_PER_NODE` (Slurm; `4(x2)` and `4,2` read as 4), `MPI_LOCALNRANKS` (MPICH).
/// `None` when none is set or a value is not a positive integer.
pub fn local_size_from(get: impl Fn(&str) -> Option<String>) -> Option<usize> {
    [
        "GRADWIRE_LOCAL_SIZE",
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "SLURM_STEP_TASKS_PER_NODE",
        "SLURM_NTASKS_PER_NODE",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .find_map(|k| {
        let v = get(k)?;
        let head: String = v.trim().chars().take_while(char::is_ascii_digit).collect();
        head.parse().ok().filter(|&n: &usize| n > 0)
    })
}

/// Variables by which the common launchers tell a process it is one rank of an MPI job:
/// Open MPI's `mpirun` (`OMPI_COMM_WORLD_SIZE`), PMIx (Open MPI 5, `srun --mpi=pmix`),
/// PMI (MPICH's hydra, Intel MPI, `srun --mpi=pmi2`) and MPICH's `MPI_LOCALNRANKS`. Plain
/// `srun` (only `SLURM_PROCID`) does not make an MPI job.
pub const MPI_LAUNCHER_VARS: [&str; 5] = [
    "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALNRANKS",
];

/// Whether the environment says an MPI launcher started this process (one of
/// [`MPI_LAUNCHER_VARS`] is set). Needs no MPI library: the CLI uses it to pick a transport.
pub fn launched_by_mpi_from(get: impl Fn(&str) -> Option<String>) -> bool {
    MPI_LAUNCHER_VARS.iter().any(|v| get(v).is_some())
}

/// [`launched_by_mpi_from`] over the process environment.
pub fn launched_by_mpi() -> bool {
    launched_by_mpi_from(|k| std::env::var(k).ok())
}

/// The launcher's name for this job, the same on every rank and different for two jobs
/// running at once: `PMIX_NAMESPACE` (Open MPI, PMIx), `OMPI_MCA_ess_base_jobid` (Open MPI
/// 4), `SLURM_JOB_ID` with `SLURM_STEP_ID` (Slurm), `TORCHELASTIC_RUN_ID` (torchrun).
/// `None` when none is set. Shared-memory rings are named from it when no `GRADWIRE_TOKEN`
/// sets the job apart.
pub fn job_id_from(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(ns) = get("PMIX_NAMESPACE").or_else(|| get("OMPI_MCA_ess_base_jobid")) {
        return Some(format!("mpi:{ns}"));
    }
    if let Some(job) = get("SLURM_JOB_ID") {
        let step = get("SLURM_STEP_ID").unwrap_or_default();
        return Some(format!("slurm:{job}.{step}"));
    }
    get("TORCHELASTIC_RUN_ID").map(|r| format!("torchrun:{r}"))
}

/// The job's identity, the same on every rank and different for every job:
/// `GRADWIRE_JOB_ID` (set by `gradwire launch` to 128 random bits, or by hand under any
/// launcher), else the launcher's own name for the job ([`job_id_from`]); `None` when none is
/// set. The TCP handshake binds it ([`TcpConfig::job`]) and shared-memory rings are named
/// from it (with the token), so a rank of another job can neither join nor share a ring.
pub fn job_identity_from(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    match get("GRADWIRE_JOB_ID") {
        Some(id) if !id.trim().is_empty() => Some(format!("gradwire:{}", id.trim())),
        _ => job_id_from(get),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Option<(TcpConfig, Launcher)>> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        tcp_config_from(|k| m.get(k).cloned())
    }

    #[test]
    fn reads_each_launcher() {
        let (c, l) = cfg(&[
            ("GRADWIRE_RANK", "1"),
            ("GRADWIRE_WORLD_SIZE", "4"),
            ("GRADWIRE_MASTER_PORT", "1234"),
            ("GRADWIRE_TOKEN", "t"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.master.port(), c.token.as_str(), l),
            (1, 4, 1234, "t", Launcher::Gradwire)
        );
        let (c, l) = cfg(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "3"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "9"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.master.port(), l),
            (2, 3, 9, Launcher::Torchrun)
        );
        let (c, l) = cfg(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.master.port(), l),
            (0, 2, DEFAULT_MASTER_PORT, Launcher::OpenMpi)
        );
        let (c, l) = cfg(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("GRADWIRE_TIMEOUT", "2.5"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.rank, c.world_size, c.timeout, l),
            (5, 8, Duration::from_millis(2500), Launcher::Slurm)
        );
        let (c, l) = cfg(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")])
            .unwrap()
            .unwrap();
        assert_eq!((c.rank, c.world_size, l), (1, 2, Launcher::Pmi));
        assert!(cfg(&[]).unwrap().is_none());
    }

    #[test]
    fn job_identity_and_insecure_from_env() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "2")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let vars: Vec<_> = base.iter().chain(extra).copied().collect();
            cfg(&vars).map(|c| c.unwrap().0)
        };
        assert_eq!(with(&[]).unwrap().job, "");
        assert!(!with(&[]).unwrap().insecure);
        assert_eq!(
            with(&[("GRADWIRE_JOB_ID", "abc"), ("SLURM_JOB_ID", "7")])
                .unwrap()
                .job,
            "gradwire:abc"
        );
        assert_eq!(
            with(&[("TORCHELASTIC_RUN_ID", "r1")]).unwrap().job,
            "torchrun:r1"
        );
        assert!(with(&[("GRADWIRE_INSECURE", "1")]).unwrap().insecure);
        assert!(!with(&[("GRADWIRE_INSECURE", "0")]).unwrap().insecure);
        assert!(with(&[("GRADWIRE_INSECURE", "yes please")]).is_err());
    }

    #[test]
    fn tcp_spin_from_env() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "2")];
        let spin = |extra: &[(&'static str, &'static str)]| {
            let vars: Vec<_> = base.iter().chain(extra).copied().collect();
            cfg(&vars).map(|c| c.unwrap().0.spin)
        };
        // Unset: the config's default for two ranks on this machine's cores.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(spin(&[]).unwrap(), crate::tcp::default_spin(2, cores));
        assert_eq!(
            spin(&[("GRADWIRE_TCP_SPIN_US", "0")]).unwrap(),
            Duration::ZERO
        );
        assert_eq!(
            spin(&[("GRADWIRE_TCP_SPIN_US", "7")]).unwrap(),
            Duration::from_micros(7)
        );
        assert!(spin(&[("GRADWIRE_TCP_SPIN_US", "soon")]).is_err());
    }

    #[test]
    fn mpi_launchers_and_job_ids() {
        let m = |vars: &[(&str, &str)]| -> HashMap<String, String> {
            vars.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let ompi = m(&[
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("PMIX_NAMESPACE", "1860763649"),
        ]);
        assert!(launched_by_mpi_from(|k| ompi.get(k).cloned()));
        assert_eq!(
            job_id_from(|k| ompi.get(k).cloned()).as_deref(),
            Some("mpi:1860763649")
        );
        let slurm = m(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "3"),
        ]);
        assert!(!launched_by_mpi_from(|k| slurm.get(k).cloned()));
        assert_eq!(
            job_id_from(|k| slurm.get(k).cloned()).as_deref(),
            Some("slurm:77.3")
        );
        let pmi = m(&[("PMI_RANK", "0")]);
        assert!(launched_by_mpi_from(|k| pmi.get(k).cloned()));
        assert_eq!(job_id_from(|k| pmi.get(k).cloned()), None);
    }

    #[test]
    fn local_size_from_each_launcher() {
        let get = |vars: &[(&str, &str)]| {
            let m: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            local_size_from(|k| m.get(k).cloned())
        };
        assert_eq!(get(&[("GRADWIRE_LOCAL_SIZE", "4")]), Some(4));
        assert_eq!(get(&[("LOCAL_WORLD_SIZE", "2")]), Some(2));
        assert_eq!(get(&[("OMPI_COMM_WORLD_LOCAL_SIZE", "3")]), Some(3));
        assert_eq!(get(&[("SLURM_STEP_TASKS_PER_NODE", "4(x2)")]), Some(4));
        assert_eq!(get(&[("SLURM_NTASKS_PER_NODE", "8,2")]), Some(8));
        assert_eq!(get(&[("MPI_LOCALNRANKS", "2")]), Some(2));
        assert_eq!(get(&[("LOCAL_WORLD_SIZE", "0")]), None);
        assert_eq!(get(&[]), None);
    }

    #[test]
    fn local_rank_from_each_launcher() {
        let get = |vars: &[(&str, &str)]| {
            let m: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            local_rank_from(|k| m.get(k).cloned())
        };
        assert_eq!(
            get(&[("GRADWIRE_LOCAL_RANK", "3"), ("LOCAL_RANK", "1")]),
            Some(3)
        );
        assert_eq!(get(&[("LOCAL_RANK", "1")]), Some(1));
        assert_eq!(get(&[("OMPI_COMM_WORLD_LOCAL_RANK", "2")]), Some(2));
        assert_eq!(get(&[("SLURM_LOCALID", "0")]), Some(0));
        assert_eq!(get(&[("MPI_LOCALRANKID", "5")]), Some(5));
        assert_eq!(get(&[("LOCAL_RANK", "x")]), None);
        assert_eq!(get(&[]), None);
    }

    #[test]
    fn torchrun_agent_store_keeps_master_port() {
        let base = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29400")];
        let port = |extra: &[(&str, &str)]| {
            let mut v = base.to_vec();
            v.extend_from_slice(extra);
            cfg(&v).unwrap().unwrap().0.master.port()
        };
        // The agent serves its store on MASTER_PORT: the rendezvous takes the next one.
        assert_eq!(port(&[("TORCHELASTIC_USE_AGENT_STORE", "True")]), 29401);
        // Without the agent's store, MASTER_PORT is free for the rendezvous.
        assert_eq!(port(&[]), 29400);
        // GRADWIRE_MASTER_PORT always wins.
        assert_eq!(
            port(&[
                ("TORCHELASTIC_USE_AGENT_STORE", "True"),
                ("GRADWIRE_MASTER_PORT", "30000")
            ]),
            30000
        );
        // Only torchrun's variables mean torchrun's agent.
        let v = [
            ("GRADWIRE_RANK", "0"),
            ("GRADWIRE_WORLD_SIZE", "2"),
            ("MASTER_PORT", "29400"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ];
        assert_eq!(cfg(&v).unwrap().unwrap().0.master.port(), 29400);
        let top = [
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "65535"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ];
        assert!(cfg(&top).is_err());
    }

    #[test]
    fn refuses_bad_values() {
        assert!(cfg(&[("RANK", "3"), ("WORLD_SIZE", "3")]).is_err());
        assert!(cfg(&[("RANK", "x"), ("WORLD_SIZE", "3")]).is_err());
        assert!(cfg(&[("RANK", "0")]).is_err());
        assert!(cfg(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "99999")]).is_err());
        assert!(cfg(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("GRADWIRE_TIMEOUT", "-1")
        ])
        .is_err());
    }

    #[test]
    fn resolution_has_a_deadline() {
        let lo = resolve_within("localhost", 7, Duration::from_secs(10)).unwrap();
        assert!(lo.ip().is_loopback() && lo.port() == 7, "{lo}");
        assert_eq!(
            resolve_within("[::1]", 9, Duration::ZERO).unwrap(),
            "[::1]:9".parse().unwrap()
        );
        // A resolver that hangs: the deadline wins.
        let start = std::time::Instant::now();
        let e = lookup_within("slow.example", Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_secs(3));
            Ok(None)
        })
        .unwrap_err();
        assert!(e.to_string().contains("took longer"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
