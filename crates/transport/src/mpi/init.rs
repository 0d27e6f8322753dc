//! Starting MPI for the transport ([`Mpi::from_env`], [`Mpi::init`]): the launcher check,
//! the thread level, the library, and the transport's own duplicate of `MPI_COMM_WORLD`.

use std::ffi::c_int;
use std::sync::Arc;

use mpi::environment::Threading;
use mpi::ffi;

use super::{error_string, launched_by_mpi, Mpi};
#[cfg(doc)]
use crate::split::Split;
use crate::{Error, Result, DEFAULT_TIMEOUT};

impl Mpi {
    /// Initializes MPI when this process was started by an MPI launcher (`mpirun`, `mpiexec`,
    /// `srun` with PMI/PMIx); `Ok(None)` otherwise, without touching MPI. The deadline comes
    /// from `GRADWIRE_TIMEOUT` (seconds) when set.
    pub fn from_env() -> Result<Option<Mpi>> {
        if !launched_by_mpi() {
            return Ok(None);
        }
        let mut t = Mpi::init()?;
        if let Ok(s) = std::env::var("GRADWIRE_TIMEOUT") {
            t.timeout = crate::env::parse_seconds(&s).ok_or_else(|| Error::Env {
                reason: format!("GRADWIRE_TIMEOUT={s} is not a positive number of seconds"),
            })?;
        }
        Ok(Some(t))
    }

    /// Initializes MPI (a singleton world of one rank when not started by a launcher) and
    /// returns this process's rank. Asks for `MPI_THREAD_MULTIPLE` (which groups need);
    /// fails with [`Error::Env`] when MPI was already initialized in this process or lacks
    /// `MPI_THREAD_SERIALIZED`.
    pub fn init() -> Result<Mpi> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| Error::Env {
                reason: "MPI is already initialized in this process (it initializes once; \
                         keep the first Mpi)"
                    .into(),
            })?;
        if threading < Threading::Serialized {
            return Err(Error::Env {
                reason: format!("the MPI library offers only {threading:?} threading"),
            });
        }
        let library = mpi::environment::library_version()
            .unwrap_or_default()
            .trim_end_matches('\0')
            .trim()
            .to_string();
        // MPI_IN_PLACE is a macro (no symbol): its value per library family.
        let in_place = if library.contains("Open MPI") {
            Some(1usize)
        } else if library.contains("MPICH") || library.contains("Intel(R) MPI") {
            Some(usize::MAX) // (void *) -1
        } else {
            None
        };
        let mut comm: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: MPI is initialized; the out-pointers are valid locals.
        let rc = unsafe {
            let world = ffi::RSMPI_COMM_WORLD;
            let mut rc = ffi::MPI_Comm_dup(world, &mut comm);
            if rc == 0 {
                rc = ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN);
            }
            if rc == 0 {
                rc = ffi::MPI_Comm_rank(comm, &mut rank);
            }
            if rc == 0 {
                rc = ffi::MPI_Comm_size(comm, &mut size);
            }
            rc
        };
        if rc != 0 {
            return Err(Error::Env {
                reason: format!("setting up MPI_COMM_WORLD: {}", error_string(rc)),
            });
        }
        Ok(Mpi {
            comm,
            rank: rank as usize,
            world_size: size as usize,
            timeout: DEFAULT_TIMEOUT,
            bytes_sent: 0,
            stage: Vec::new(),
            stranded: Vec::new(),
            in_place,
            library,
            threading,
            splits: 0,
            _universe: Arc::new(universe),
        })
    }

    /// Whether MPI lets this process's transports (the world and its groups) be used from
    /// several threads at once (`MPI_THREAD_MULTIPLE`), which [`Split::split`] needs.
    pub fn thread_multiple(&self) -> bool {
        self.threading >= Threading::Multiple
    }

    /// The MPI library's version string (`MPI_Get_library_version`).
    pub fn library_version(&self) -> &str {
        &self.library
    }
}
