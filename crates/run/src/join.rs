//! Joining a launched job: which launcher started this process (gradwire launch, torchrun,
//! mpirun, srun, MPICH), read from the variables it set, and the transport that connects the
//! ranks. The `gradwire` CLI and the Python package both join through here, so a job's ranks
//! come from the same variables whichever front end runs them.
//!
//! Transports: `tcp` (gradwire's full mesh, rendezvous at rank 0), `shm` (shared-memory
//! rings; every rank on one host), `mpi` (point to point over `MPI_COMM_WORLD`; needs a build
//! with the `mpi` feature and an MPI launcher), `local` (threads of one process, only without
//! a launcher). `auto`, the default, is `mpi` when an MPI launcher started the process
//! (`mpirun`, `mpiexec`, `srun --mpi=pmix`) and the build has MPI, else `tcp`.

use gradwire_transport::env::{local_size_from, tcp_config_from_env};
use gradwire_transport::tcp::{Tcp, TcpConfig};
use gradwire_transport::Transport;
use serde::{Deserialize, Serialize};

/// The help text shared by every `--transport` flag.
pub const TRANSPORT_HELP: &str = "Transport between the ranks: tcp (full mesh), shm (shared \
    memory, every rank on one host), mpi (needs a build with --features mpi and mpirun/srun), \
    local (threads of this process), or auto: mpi when started by an MPI launcher (mpirun, \
    mpiexec, srun --mpi=pmix) and built with MPI, else tcp";

/// Whether this build has the MPI transport.
pub const MPI_BUILT: bool = cfg!(feature = "mpi");

/// Why a process could not join its job.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The launcher's variables are malformed.
    #[error("reading the rank's environment: {0}")]
    Environment(#[source] gradwire_transport::Error),
    /// The transport failed to connect.
    #[error("rank {rank} of {world}: {what}: {source}")]
    Connect {
        /// This rank.
        rank: usize,
        /// The job's ranks.
        world: usize,
        /// What it was doing (which transport, through whom).
        what: String,
        /// The transport's error (it names the peer).
        #[source]
        source: gradwire_transport::Error,
    },
    /// The requested transport cannot serve this job; the text says what to do instead.
    #[error("{0}")]
    Unavailable(String),
    /// MPI and the launcher's variables disagree on this process's rank.
    #[error(
        "MPI says this is rank {mpi_rank} of {mpi_world}, the launcher's variables say rank \
         {rank} of {world}"
    )]
    MpiMismatch {
        /// MPI's rank.
        mpi_rank: usize,
        /// MPI's world size.
        mpi_world: usize,
        /// The variables' rank.
        rank: usize,
        /// The variables' world size.
        world: usize,
    },
    /// No launcher set a rank for this process.
    #[error(
        "no rank in the environment: run this under `gradwire launch -n N -- ...` (or \
         torchrun, mpirun, srun), which set GRADWIRE_RANK and GRADWIRE_WORLD_SIZE"
    )]
    NotLaunched,
}

/// Which transport the ranks of a job use (`--transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// `mpi` under an MPI launcher when built with MPI, else `tcp`.
    #[default]
    Auto,
    /// Full TCP mesh (P processes on loopback when gradwire starts them).
    Tcp,
    /// Shared-memory rings between processes of one host.
    Shm,
    /// MPI point to point (feature `mpi`, under mpirun / srun).
    Mpi,
    /// Threads of one process.
    Local,
}

impl TransportKind {
    /// Every kind, in the order `--help` lists them.
    pub const ALL: [TransportKind; 5] = [
        TransportKind::Auto,
        TransportKind::Tcp,
        TransportKind::Shm,
        TransportKind::Mpi,
        TransportKind::Local,
    ];

    /// `auto` made concrete for this process (the other kinds stay as they are).
    pub fn resolve(self) -> TransportKind {
        self.resolve_with(gradwire_transport::env::launched_by_mpi())
    }

    fn resolve_with(self, under_mpi: bool) -> TransportKind {
        match self {
            TransportKind::Auto if under_mpi && MPI_BUILT => TransportKind::Mpi,
            TransportKind::Auto => TransportKind::Tcp,
            k => k,
        }
    }

    /// The name `--transport` takes.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Auto => "auto",
            TransportKind::Tcp => "tcp",
            TransportKind::Shm => "shm",
            TransportKind::Mpi => "mpi",
            TransportKind::Local => "local",
        }
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TransportKind {
    type Err = JoinError;

    fn from_str(s: &str) -> Result<Self, JoinError> {
        TransportKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                JoinError::Unavailable(format!(
                    "unknown transport {s:?}: expected auto, tcp, shm, mpi or local"
                ))
            })
    }
}

/// This process as one rank of a launched job.
#[derive(Debug, Clone)]
pub struct Launched {
    /// The rendezvous settings (rank, world size, master, token, deadline).
    pub config: TcpConfig,
    /// Ranks of the job on this host (the launcher's local size; the world size when the
    /// launcher does not say).
    pub local_size: usize,
    /// Whether the launcher said how many ranks run on this host.
    pub local_size_known: bool,
}

/// Detects a launcher (gradwire launch, torchrun, mpirun, srun, MPICH) from the environment
/// and logs what it found; `None` for a plain process.
pub fn detect() -> Result<Option<Launched>, JoinError> {
    let Some((config, launcher)) = tcp_config_from_env().map_err(JoinError::Environment)? else {
        return Ok(None);
    };
    let said = local_size_from(|k| std::env::var(k).ok());
    let local_size = said.unwrap_or(config.world_size.max(1));
    tracing::info!(
        ?launcher,
        rank = config.rank,
        world_size = config.world_size,
        local_size,
        master = %config.master,
        "launched rank"
    );
    Ok(Some(Launched {
        config,
        local_size,
        local_size_known: said.is_some(),
    }))
}

/// Joins the job described by `launched` over TCP.
pub fn join(launched: &Launched) -> Result<Tcp, JoinError> {
    let cfg = &launched.config;
    Tcp::connect(cfg).map_err(|source| JoinError::Connect {
        rank: cfg.rank,
        world: cfg.world_size,
        what: format!("joining the job through rank 0 at {}", cfg.master),
        source,
    })
}

/// Joins the job described by `launched` with the transport `kind` asks for (`auto` is
/// resolved here).
pub fn join_with(
    kind: TransportKind,
    launched: &Launched,
) -> Result<Box<dyn Transport>, JoinError> {
    let kind = kind.resolve();
    let cfg = &launched.config;
    let t: Box<dyn Transport> = match kind {
        TransportKind::Tcp | TransportKind::Auto => Box::new(join(launched)?),
        TransportKind::Shm => Box::new(join_shm(launched)?),
        TransportKind::Mpi => {
            let t = join_mpi()?;
            if (t.rank(), t.world_size()) != (cfg.rank, cfg.world_size) {
                return Err(JoinError::MpiMismatch {
                    mpi_rank: t.rank(),
                    mpi_world: t.world_size(),
                    rank: cfg.rank,
                    world: cfg.world_size,
                });
            }
            t
        }
        TransportKind::Local => {
            return Err(JoinError::Unavailable(
                "--transport local runs the ranks as threads of one process: start gradwire \
                 without a launcher (and give the number of ranks), or pick tcp, shm or mpi"
                    .into(),
            ))
        }
    };
    tracing::info!(transport = %kind, rank = t.rank(), world_size = t.world_size(), "joined");
    Ok(t)
}

/// Shared memory: refused at once when the launcher says the ranks span several hosts.
fn join_shm(launched: &Launched) -> Result<gradwire_transport::shm::Shm, JoinError> {
    let world = launched.config.world_size;
    check_one_host(launched.local_size, world)?;
    let cfg = gradwire_transport::shm::config_from_env()
        .map_err(JoinError::Environment)?
        .ok_or(JoinError::NotLaunched)?;
    gradwire_transport::shm::Shm::connect(&cfg).map_err(|source| JoinError::Connect {
        rank: cfg.rank,
        world,
        what: format!(
            "joining through shared memory in {} (every rank must run on this host{})",
            cfg.dir.display(),
            if launched.local_size_known {
                ""
            } else {
                "; the launcher does not say where the ranks run"
            }
        ),
        source,
    })
}

/// `--transport shm` needs every rank on one host.
fn check_one_host(local_size: usize, world: usize) -> Result<(), JoinError> {
    if local_size < world {
        return Err(JoinError::Unavailable(format!(
            "--transport shm needs every rank on one host, but the launcher put {local_size} \
             of the {world} ranks on this one: use --transport tcp or mpi across hosts"
        )));
    }
    Ok(())
}

/// The MPI transport, when this process was started by an MPI launcher.
#[cfg(feature = "mpi")]
fn join_mpi() -> Result<Box<dyn Transport>, JoinError> {
    match gradwire_transport::mpi::Mpi::from_env().map_err(|source| JoinError::Connect {
        rank: 0,
        world: 0,
        what: "initializing MPI".into(),
        source,
    })? {
        Some(t) => {
            tracing::debug!(library = t.library_version(), "MPI");
            Ok(Box::new(t))
        }
        None => Err(JoinError::Unavailable(not_under_mpi().into())),
    }
}

/// Without the feature: how to get it.
#[cfg(not(feature = "mpi"))]
fn join_mpi() -> Result<Box<dyn Transport>, JoinError> {
    Err(JoinError::Unavailable(not_built_with_mpi().into()))
}

fn not_built_with_mpi() -> &'static str {
    "--transport mpi: this gradwire was built without MPI; build it with `cargo build \
     --release -p gradwire --features mpi` (needs Open MPI or MPICH and libclang: on Debian \
     openmpi-bin libopenmpi-dev libclang-dev)"
}

fn not_under_mpi() -> &'static str {
    "--transport mpi needs an MPI launcher: run `mpirun -np N gradwire ...` (or `srun -n N \
     --mpi=pmix gradwire ...`)"
}

/// For a process no launcher started: refuses the transports that need one (`mpi`).
pub fn check_unlaunched(kind: TransportKind) -> Result<(), JoinError> {
    if kind.resolve() == TransportKind::Mpi {
        return Err(JoinError::Unavailable(
            if MPI_BUILT {
                not_under_mpi()
            } else {
                not_built_with_mpi()
            }
            .into(),
        ));
    }
    Ok(())
}

/// Joins the job described by the environment with `kind`, or explains how to start one.
pub fn join_from_env(kind: TransportKind) -> Result<Box<dyn Transport>, JoinError> {
    match detect()? {
        Some(launched) => join_with(kind, &launched),
        // An MPI launcher that sets none of the variables `detect` reads: MPI still knows.
        None if kind.resolve() == TransportKind::Mpi => join_mpi(),
        None => Err(JoinError::NotLaunched),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_mpi_only_under_an_mpi_launcher_with_mpi_built() {
        assert_eq!(TransportKind::Auto.resolve_with(false), TransportKind::Tcp);
        let under = TransportKind::Auto.resolve_with(true);
        assert_eq!(
            under,
            if cfg!(feature = "mpi") {
                TransportKind::Mpi
            } else {
                TransportKind::Tcp
            }
        );
        for k in [
            TransportKind::Tcp,
            TransportKind::Shm,
            TransportKind::Mpi,
            TransportKind::Local,
        ] {
            assert_eq!(k.resolve_with(true), k);
            assert_eq!(k.resolve_with(false), k);
        }
    }

    #[test]
    fn shm_refuses_ranks_on_several_hosts() {
        let e = check_one_host(2, 4).unwrap_err().to_string();
        assert!(e.contains("one host") && e.contains("2 of the 4"), "{e}");
        check_one_host(4, 4).unwrap();
    }

    #[test]
    fn transport_names_round_trip_through_from_str_and_serde() {
        for k in TransportKind::ALL {
            assert_eq!(k.name().parse::<TransportKind>().unwrap(), k);
            assert_eq!(
                serde_json::to_string(&k).unwrap(),
                format!("\"{}\"", k.name())
            );
        }
        let e = "udp".parse::<TransportKind>().unwrap_err().to_string();
        assert!(e.contains("udp") && e.contains("tcp"), "{e}");
    }
}
