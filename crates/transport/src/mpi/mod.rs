//! `mpi`: the ranks of an MPI job (feature `mpi`, over rsmpi), point-to-point.
//!
//! # Running
//!
//! Build with `--features mpi` (needs an MPI library, found through `mpicc -show`, and
//! libclang; on Debian `openmpi-bin libopenmpi-dev libclang-dev`), then start one process per
//! rank with the launcher of the MPI library or of the cluster:
//!
//! ```text
//! mpirun -np 4 ./my-program          # Open MPI / MPICH (add --oversubscribe past the cores,
//!                                    # --allow-run-as-root as root)
//! srun -n 4 --mpi=pmix ./my-program  # Slurm, with an MPI built against its PMI/PMIx
//! ```
//!
//! Each process calls [`Mpi::from_env`] (or [`Mpi::init`]) once: MPI initializes once per
//! process, so a second call fails with [`Error::Env`].
//!
//! ```no_run
//! use gradwire_transport::{mpi::Mpi, Transport};
//! let mut t = Mpi::from_env()?.expect("start me with mpirun -np N or srun -n N");
//! let (me, n) = (t.rank(), t.world_size());
//! let mut got = Vec::new();
//! t.send_recv((me + 1) % n, b"hello", (me + n - 1) % n, &mut got)?;
//! # Ok::<(), gradwire_transport::Error>(())
//! ```
//!
//! Ranks and world size are those of `MPI_COMM_WORLD`; the transport talks on its own
//! duplicate of it, so it never matches messages of other MPI code in the same program.
//! [`Mpi::from_env`] recognizes a launcher by `OMPI_COMM_WORLD_SIZE`, `PMIX_RANK`,
//! `PMI_RANK`/`PMI_SIZE` or `MPI_LOCALNRANKS`; under `srun` that means an MPI plugin
//! (`--mpi=pmix` or `pmi2`), since plain `SLURM_PROCID` does not make an MPI job.
//!
//! # How messages move
//!
//! A send copies the message into a staging buffer that the transport owns and posts
//! `MPI_Isend`; a receive polls `MPI_Improbe` for the next message from the peer, learns its
//! length from the status (messages of any length up to `i32::MAX` bytes, MPI's count), and
//! receives it with `MPI_Imrecv` straight into the caller's buffer. [`Transport::send_recv`]
//! drives both requests together with `MPI_Test`, so a ring step never deadlocks at any size.
//! Messages between a pair of ranks keep their order (MPI's non-overtaking rule).
//!
//! # Deadlines and errors
//!
//! Every call polls its requests against the deadline ([`Transport::timeout`], measured from
//! the last progress): a peer that stalls gives [`Error::Timeout`] naming it. What is pending
//! then is handled without unsafety:
//! - a receive whose message has not started to arrive was never posted: nothing to undo;
//! - a send still pending (Open MPI cannot cancel sends) keeps its staging buffer, which the
//!   transport holds until MPI lets go of it (or leaks at drop), so the error returns at once;
//! - a receive into a `Vec` ([`Transport::recv`], [`Transport::send_recv`]) that stalls
//!   mid-message keeps that buffer the same way (the caller gets an empty `Vec`);
//! - a receive into a slice ([`Transport::recv_into`]) that stalls mid-message cannot hand
//!   back memory MPI may still write: it waits one more deadline, then logs the peer and calls
//!   `MPI_Abort`. This needs the sender to stop half-way through a message, which our sends
//!   never do short of a crash.
//!
//! The transport's communicator uses `MPI_ERRORS_RETURN` (set through `mpi::ffi`, since
//! rsmpi 0.8 has no safe call for error handlers), so a failing MPI call becomes
//! [`Error::Mpi`] naming the peer and carrying MPI's error string. Where MPI gives no chance
//! to name anything: under Open MPI (and MPICH) a rank that *dies* ends the whole job — the
//! launcher (`mpirun`/`srun`) sees the process exit and kills every rank (checked with Open
//! MPI 4.1: a rank killed mid-run ends the job within a second, `mpirun` naming the rank and
//! signal) — so a dead peer is reported by the launcher, not by [`Error::PeerClosed`]; only a stalled (alive) peer
//! reaches our [`Error::Timeout`]. [`Mpi::native_all_reduce_f32`] is a blocking MPI
//! collective with no deadline at all. After an error, drop the transport: messages of the
//! failed call may still arrive later.
//!
//! # Groups
//!
//! An [`Mpi`] splits into groups ([`crate::split`]) with `MPI_Comm_split`: the ranks first
//! agree on the groups with one exchange of offers over the transport (under the deadline,
//! refusing splits out of step), then call `MPI_Comm_split` on the transport's communicator
//! with colors and keys that give MPI the same numbering ([`crate::split`]'s rule: by key,
//! ties by rank). Each group is an [`Mpi`] of its own on the new communicator, wrapped in a
//! [`Group`] that names the group and the global ranks in its errors; it keeps the
//! parent's deadline and can split again. `MPI_Comm_split` itself is a blocking MPI
//! collective with no deadline, reached only once every rank's offer has arrived.
//!
//! # Threads
//!
//! MPI is initialized asking for `MPI_THREAD_MULTIPLE` and accepting `MPI_THREAD_SERIALIZED`.
//! Each [`Mpi`]'s methods take `&mut self`, so its own calls never overlap and the value can
//! move to another thread (the engine's). With `MPI_THREAD_SERIALIZED` only one [`Mpi`]
//! exists per process and a split fails with [`Error::Env`]; with `MPI_THREAD_MULTIPLE` the
//! world and its groups may be used from different threads at once. Dropping an [`Mpi`] frees
//! its communicator; MPI is finalized when the world and every group split from it are gone.
//!
//! # Files
//!
//! `init` (starting MPI, the thread level, the library), `exchange` (one call's send and
//! receive driven against the deadline, and the buffers MPI still holds), `transport` (the
//! [`Transport`] impl over it), `group` (splitting with `MPI_Comm_split`), `native` (MPI's own
//! collectives, [`NativeOp`]).

use std::ffi::c_int;
use std::sync::Arc;
use std::time::Duration;

use mpi::environment::{Threading, Universe};
use mpi::ffi;

#[cfg(doc)]
use crate::split::{Group, Split};
#[cfg(doc)]
use crate::{Error, Transport};

mod exchange;
mod group;
mod init;
mod native;
#[cfg(test)]
mod tests;
mod transport;

use exchange::Stranded;
pub use native::NativeOp;

/// The tag of every message of the transport (on its own communicator).
const TAG: c_int = 0x6777;

/// Largest message MPI's `int` count can describe (bytes).
pub const MAX_MESSAGE: usize = i32::MAX as usize;

/// This process's rank of an MPI job, or of a group split from it (see the
/// [module docs](self)).
pub struct Mpi {
    comm: ffi::MPI_Comm,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    bytes_sent: u64,
    /// Holds the message of the send in flight.
    stage: Vec<u8>,
    stranded: Vec<Stranded>,
    /// `MPI_IN_PLACE` of the library, when known (Open MPI, MPICH and derivatives).
    in_place: Option<usize>,
    library: String,
    /// The thread level MPI provides (at least `Serialized`, checked in `init`).
    threading: Threading,
    /// Splits of this communicator so far.
    splits: u32,
    /// Last field: shared by the world and its groups; the last of them to drop finalizes
    /// MPI, after its `Drop::drop` freed its communicator.
    _universe: Arc<Universe>,
}

// SAFETY: every MPI call goes through `&mut self` or `&self` methods of one `Mpi`, which
// Rust's borrow rules keep from overlapping (`Mpi` is not `Sync`), and the raw handles it
// holds are only used through it. At MPI_THREAD_SERIALIZED (the least `init` accepts) only
// one `Mpi` exists per process (MPI initializes once, and `split` refuses to make groups);
// several exist (the world and its groups) only at MPI_THREAD_MULTIPLE, where MPI allows
// calls from different threads at once.
unsafe impl Send for Mpi {}

/// Whether the environment says this process was started by an MPI launcher
/// (the variables of [`crate::env::MPI_LAUNCHER_VARS`]).
pub fn launched_by_mpi() -> bool {
    crate::env::launched_by_mpi()
}

impl Drop for Mpi {
    fn drop(&mut self) {
        // SAFETY: requests MPI still holds are released (they complete in the background)
        // and their buffers leaked, since MPI may still touch them; then the communicator is
        // freed, before `_universe` finalizes MPI.
        unsafe {
            for mut s in std::mem::take(&mut self.stranded) {
                ffi::MPI_Request_free(&mut s.req);
                std::mem::forget(s._buf);
            }
            ffi::MPI_Comm_free(&mut self.comm);
        }
    }
}

/// MPI's text for an error code.
fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; 4096];
    let mut len: c_int = 0;
    // SAFETY: MPI writes at most MPI_MAX_ERROR_STRING (256 in Open MPI, 1024 in MPICH) bytes.
    let rc = unsafe { ffi::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 {
        return format!("MPI error {code}");
    }
    buf.truncate(len.clamp(0, 4096) as usize);
    format!("{} (code {code})", String::from_utf8_lossy(&buf))
}
