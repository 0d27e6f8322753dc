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

use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::environment::{Threading, Universe};
use mpi::ffi;

use crate::split::{self, Group, Split};
use crate::{Error, Op, Result, Transport, DEFAULT_TIMEOUT};

/// The tag of every message of the transport (on its own communicator).
const TAG: c_int = 0x6777;

/// Largest message MPI's `int` count can describe (bytes).
pub const MAX_MESSAGE: usize = i32::MAX as usize;

/// The reduction of [`Mpi::native_all_reduce_f32`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeOp {
    /// Element-wise sum (`MPI_SUM`).
    Sum,
    /// Sum divided by the world size.
    Mean,
    /// Element-wise minimum (`MPI_MIN`).
    Min,
    /// Element-wise maximum (`MPI_MAX`).
    Max,
}

/// A request MPI still holds, with the buffer it reads or writes: kept until MPI lets go.
struct Stranded {
    req: ffi::MPI_Request,
    _buf: Vec<u8>,
}

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

    /// MPI's own `MPI_Allreduce` over `buf`, in place: the library's tuned algorithm, for
    /// comparison with ours or as the dense path when running under MPI. Blocking, with no
    /// deadline (a stalled rank hangs it); every rank must call it with the same length.
    /// MPI does not say what it sent, so [`Transport::bytes_sent`] does not count it.
    pub fn native_all_reduce_f32(&mut self, buf: &mut [f32], op: NativeOp) -> Result<()> {
        let count = c_int::try_from(buf.len()).map_err(|_| Error::FrameTooLarge {
            peer: self.rank,
            len: buf.len() as u64,
            max: MAX_MESSAGE as u64,
        })?;
        // SAFETY: the op and datatype handles are MPI's predefined constants.
        let mpi_op = unsafe {
            match op {
                NativeOp::Sum | NativeOp::Mean => ffi::RSMPI_SUM,
                NativeOp::Min => ffi::RSMPI_MIN,
                NativeOp::Max => ffi::RSMPI_MAX,
            }
        };
        let rc = match self.in_place {
            // SAFETY: MPI_IN_PLACE as the send buffer, `buf` valid for `count` floats.
            Some(p) => unsafe {
                ffi::MPI_Allreduce(
                    p as *const c_void,
                    buf.as_mut_ptr().cast(),
                    count,
                    ffi::RSMPI_FLOAT,
                    mpi_op,
                    self.comm,
                )
            },
            None => {
                let send = buf.to_vec();
                // SAFETY: distinct send and receive buffers of `count` floats.
                unsafe {
                    ffi::MPI_Allreduce(
                        send.as_ptr().cast(),
                        buf.as_mut_ptr().cast(),
                        count,
                        ffi::RSMPI_FLOAT,
                        mpi_op,
                        self.comm,
                    )
                }
            }
        };
        if rc != 0 {
            return Err(Error::Mpi {
                peer: None,
                code: rc,
                message: format!("MPI_Allreduce: {}", error_string(rc)),
            });
        }
        if op == NativeOp::Mean {
            let n = self.world_size as f32;
            buf.iter_mut().for_each(|x| *x /= n);
        }
        Ok(())
    }

    /// MPI's own `MPI_Barrier` on the transport's communicator (blocking, no deadline).
    pub fn native_barrier(&mut self) -> Result<()> {
        // SAFETY: a valid communicator.
        let rc = unsafe { ffi::MPI_Barrier(self.comm) };
        if rc != 0 {
            return Err(Error::Mpi {
                peer: None,
                code: rc,
                message: format!("MPI_Barrier: {}", error_string(rc)),
            });
        }
        Ok(())
    }

    fn check(&self, peer: usize, len: usize) -> Result<()> {
        if peer >= self.world_size {
            return Err(Error::InvalidRank {
                rank: peer,
                world_size: self.world_size,
            });
        }
        if len > MAX_MESSAGE {
            return Err(Error::FrameTooLarge {
                peer,
                len: len as u64,
                max: MAX_MESSAGE as u64,
            });
        }
        Ok(())
    }

    fn mpi_err(peer: usize, op: Op, call: &str, rc: c_int) -> Error {
        Error::Mpi {
            peer: Some(peer),
            code: rc,
            message: format!("{call} during {op}: {}", error_string(rc)),
        }
    }

    /// Lets go of stranded buffers whose requests MPI has finished.
    fn reap(&mut self) {
        self.stranded.retain_mut(|s| {
            let mut flag: c_int = 0;
            // SAFETY: `s.req` is an active request whose buffer `s` still owns.
            let rc = unsafe { ffi::MPI_Test(&mut s.req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            rc == 0 && flag == 0
        });
    }

    /// One call's worth of messaging: an optional send and an optional receive, driven
    /// together until both are done or the deadline passes.
    fn exchange(
        &mut self,
        send: Option<(usize, &[u8])>,
        recv: Option<(usize, Sink<'_>)>,
    ) -> Result<()> {
        if let Some((to, msg)) = send {
            self.check(to, msg.len())?;
        }
        if let Some((from, _)) = &recv {
            self.check(*from, 0)?;
        }
        if !self.stranded.is_empty() {
            self.reap();
        }
        // SAFETY (whole function): every pointer handed to MPI is either our staging buffer
        // or the receive target, which stay alive and untouched until the request completes
        // or is stranded together with its (owned) buffer; the slice case never returns
        // while its request is active (it aborts instead).
        let null_req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let mut sreq = null_req;
        let mut send_len = 0;
        let to = send.map(|(to, _)| to).unwrap_or(0);
        if let Some((to, msg)) = send {
            self.stage.clear();
            self.stage.extend_from_slice(msg);
            send_len = msg.len();
            let rc = unsafe {
                ffi::MPI_Isend(
                    self.stage.as_ptr().cast(),
                    msg.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    to as c_int,
                    TAG,
                    self.comm,
                    &mut sreq,
                )
            };
            if rc != 0 {
                return Err(Self::mpi_err(to, Op::Send, "MPI_Isend", rc));
            }
        }
        let mut send_done = send.is_none();
        let (from, mut sink) = match recv {
            Some((f, s)) => (f, Some(s)),
            None => (0, None),
        };
        let mut recv_state = if sink.is_some() {
            RecvState::Probing
        } else {
            RecvState::Done
        };
        let mut rreq = null_req;
        // A message of the wrong length for a slice target lands here, to report it.
        let mut wrong_len: Option<Vec<u8>> = None;
        let mut deadline = Instant::now() + self.timeout;
        let mut overtime = false;
        let mut idle = 0u32;
        let outcome: Result<()> = loop {
            let mut progressed = false;
            if !send_done {
                let mut flag: c_int = 0;
                let rc = unsafe { ffi::MPI_Test(&mut sreq, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                if rc != 0 {
                    break Err(Self::mpi_err(to, Op::Send, "MPI_Test", rc));
                }
                if flag != 0 {
                    send_done = true;
                    progressed = true;
                    self.bytes_sent += send_len as u64;
                }
            }
            match recv_state {
                RecvState::Probing => {
                    let mut flag: c_int = 0;
                    let mut message: ffi::MPI_Message = unsafe { ffi::RSMPI_MESSAGE_NULL };
                    let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
                    let rc = unsafe {
                        ffi::MPI_Improbe(
                            from as c_int,
                            TAG,
                            self.comm,
                            &mut flag,
                            &mut message,
                            &mut status,
                        )
                    };
                    if rc != 0 {
                        break Err(Self::mpi_err(from, Op::Recv, "MPI_Improbe", rc));
                    }
                    if flag != 0 {
                        progressed = true;
                        let mut count: c_int = 0;
                        let rc =
                            unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
                        if rc != 0 || count < 0 {
                            break Err(Self::mpi_err(from, Op::Recv, "MPI_Get_count", rc));
                        }
                        let n = count as usize;
                        let target: *mut u8 = match sink.as_mut().expect("receiving") {
                            Sink::Vec(v) => {
                                v.clear();
                                v.resize(n, 0);
                                v.as_mut_ptr()
                            }
                            Sink::Slice(s) if s.len() == n => s.as_mut_ptr(),
                            Sink::Slice(_) => wrong_len.insert(vec![0u8; n]).as_mut_ptr(),
                        };
                        let rc = unsafe {
                            ffi::MPI_Imrecv(
                                target.cast(),
                                count,
                                ffi::RSMPI_UINT8_T,
                                &mut message,
                                &mut rreq,
                            )
                        };
                        if rc != 0 {
                            break Err(Self::mpi_err(from, Op::Recv, "MPI_Imrecv", rc));
                        }
                        recv_state = RecvState::Receiving;
                    }
                }
                RecvState::Receiving => {
                    let mut flag: c_int = 0;
                    let rc =
                        unsafe { ffi::MPI_Test(&mut rreq, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                    if rc != 0 {
                        break Err(Self::mpi_err(from, Op::Recv, "MPI_Test", rc));
                    }
                    if flag != 0 {
                        progressed = true;
                        recv_state = RecvState::Done;
                    }
                }
                RecvState::Done => {}
            }
            if send_done && recv_state == RecvState::Done {
                break Ok(());
            }
            if progressed {
                idle = 0;
                deadline = Instant::now() + self.timeout;
                continue;
            }
            idle = idle.wrapping_add(1);
            if idle > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            if !idle.is_multiple_of(16) || Instant::now() < deadline {
                continue;
            }
            // The deadline passed with no progress. A slice receive half-way through its
            // message gets one more deadline (see the module docs).
            let slice_active = recv_state == RecvState::Receiving
                && wrong_len.is_none()
                && matches!(sink, Some(Sink::Slice(_)));
            if slice_active && !overtime {
                tracing::warn!(
                    peer = from,
                    "rank {from}: message stalled half-way for {:?}; waiting one more \
                     deadline before aborting the job",
                    self.timeout
                );
                overtime = true;
                deadline = Instant::now() + self.timeout;
                continue;
            }
            let (peer, op) = if recv_state != RecvState::Done {
                (from, Op::Recv)
            } else {
                (to, Op::Send)
            };
            break Err(Error::Timeout {
                peer,
                op,
                after: self.timeout,
            });
        };
        if let Err(err) = outcome {
            // Keep every buffer MPI may still touch (see the module docs).
            if !send_done {
                let buf = std::mem::take(&mut self.stage);
                self.stranded.push(Stranded {
                    req: sreq,
                    _buf: buf,
                });
            }
            if recv_state == RecvState::Receiving {
                let buf = match (wrong_len.take(), sink) {
                    (Some(b), _) => b,
                    (None, Some(Sink::Vec(v))) => std::mem::take(v),
                    (None, _) => abort_job(self.rank, &err),
                };
                self.stranded.push(Stranded {
                    req: rreq,
                    _buf: buf,
                });
            }
            return Err(err);
        }
        if let (Some(got), Some(Sink::Slice(s))) = (wrong_len, &sink) {
            return Err(Error::SizeMismatch {
                peer: from,
                expected: s.len(),
                got: got.len(),
            });
        }
        Ok(())
    }
}

/// Ends the whole MPI job after `err`: used only where returning would leave MPI writing
/// into memory the caller owns again.
fn abort_job(rank: usize, err: &Error) -> ! {
    let msg = format!(
        "gradwire mpi: rank {rank}: {err}; a receive into the caller's buffer is still in \
         flight, aborting the MPI job"
    );
    tracing::error!("{msg}");
    eprintln!("{msg}");
    // SAFETY: MPI is initialized; MPI_Abort does not return in practice.
    unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1) };
    std::process::abort()
}

/// Where a receive lands.
enum Sink<'a> {
    Vec(&'a mut Vec<u8>),
    Slice(&'a mut [u8]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecvState {
    Probing,
    Receiving,
    Done,
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

impl Transport for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn send(&mut self, to: usize, msg: &[u8]) -> Result<()> {
        self.exchange(Some((to, msg)), None)
    }

    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.exchange(None, Some((from, Sink::Vec(buf))))
    }

    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.exchange(Some((to, msg)), Some((from, Sink::Vec(buf))))
    }

    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        self.exchange(None, Some((from, Sink::Slice(out))))
    }

    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        self.exchange(Some((to, msg)), Some((from, Sink::Slice(out))))
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    fn splitter(&mut self) -> Option<&mut dyn Split> {
        Some(self)
    }
}

/// `MPI_Comm_split` on the transport's communicator, after the ranks agreed on the groups
/// (see the [module docs](self)).
impl Split for Mpi {
    fn split(&mut self, color: u32, key: u32) -> Result<Group> {
        if !self.thread_multiple() {
            return Err(Error::Env {
                reason: format!(
                    "splitting the mpi transport needs MPI_THREAD_MULTIPLE (its groups are                      used from several threads); the library offers {:?}",
                    self.threading
                ),
            });
        }
        let seq = self.splits;
        self.splits += 1;
        let plan = split::agree(self, seq, color, key)?;
        // MPI takes a non-negative `int` color and an `int` key: the group's lowest parent
        // rank names it, and the group rank the plan gave orders it (MPI then numbers the
        // members exactly as the plan does).
        let mpi_color = plan
            .members
            .iter()
            .copied()
            .min()
            .expect("a rank is in its group");
        let (Ok(mpi_color), Ok(mpi_key)) = (c_int::try_from(mpi_color), c_int::try_from(plan.rank))
        else {
            return Err(Error::Misuse {
                what: "a group rank beyond MPI's int",
            });
        };
        let mut comm: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
        // SAFETY: a valid communicator; the out-pointer is a valid local.
        let rc = unsafe { ffi::MPI_Comm_split(self.comm, mpi_color, mpi_key, &mut comm) };
        if rc != 0 {
            return Err(plan.name_error(Error::Mpi {
                peer: None,
                code: rc,
                message: format!("MPI_Comm_split: {}", error_string(rc)),
            }));
        }
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: `comm` is the new, valid communicator; the out-pointers are valid locals.
        let rc = unsafe {
            let mut rc = ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN);
            if rc == 0 {
                rc = ffi::MPI_Comm_rank(comm, &mut rank);
            }
            if rc == 0 {
                rc = ffi::MPI_Comm_size(comm, &mut size);
            }
            rc
        };
        let numbered_alike = rank as usize == plan.rank && size as usize == plan.members.len();
        if rc != 0 || !numbered_alike {
            // SAFETY: the communicator was created above and is used by nothing else.
            unsafe { ffi::MPI_Comm_free(&mut comm) };
            return Err(plan.name_error(if rc != 0 {
                Error::Mpi {
                    peer: None,
                    code: rc,
                    message: format!("setting up the group's communicator: {}", error_string(rc)),
                }
            } else {
                Error::Misuse {
                    what: "MPI_Comm_split numbered the group unlike the agreed plan",
                }
            }));
        }
        let sub = Mpi {
            comm,
            rank: plan.rank,
            world_size: plan.members.len(),
            timeout: self.timeout,
            bytes_sent: 0,
            stage: Vec::new(),
            stranded: Vec::new(),
            in_place: self.in_place,
            library: self.library.clone(),
            threading: self.threading,
            splits: 0,
            _universe: Arc::clone(&self._universe),
        };
        tracing::debug!(
            rank = self.rank,
            color,
            group_rank = plan.rank,
            "mpi group communicator up"
        );
        Ok(Group::new(Box::new(sub), plan.color, plan.members))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Unit-testable without a launcher: the environment check (multi-rank behaviour is
    /// tested under `mpirun` by `gradwire-collective`'s `mpi` test).
    #[test]
    fn launcher_detection_reads_known_variables() {
        let vars = crate::env::MPI_LAUNCHER_VARS;
        assert!(vars.contains(&"OMPI_COMM_WORLD_SIZE"));
        assert!(vars.contains(&"PMI_RANK"));
        // In a plain `cargo test` none is set; under a launcher all of them may be.
        let _ = launched_by_mpi();
    }

    #[test]
    fn mpi_errors_name_the_peer() {
        let e = Error::Mpi {
            peer: Some(2),
            code: 15,
            message: "MPI_Test during receive: MPI_ERR_TRUNCATE".into(),
        };
        assert_eq!(e.peer(), Some(2));
        assert!(e.to_string().contains("with rank 2"), "{e}");
        let e = Error::Mpi {
            peer: None,
            code: 1,
            message: "MPI_Allreduce: x".into(),
        };
        assert_eq!(e.peer(), None);
    }
}
