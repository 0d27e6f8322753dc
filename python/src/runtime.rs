//! `Runtime`: this process's rank of the job and its one engine.
//!
//! `Runtime(transport)` joins the job the launcher started (gradwire launch, torchrun,
//! mpirun, srun: `gradwire_run::join`, as the CLI), or makes a world of one rank when no
//! launcher started the process. `start` (re)starts the engine with the tensors to register
//! (their codecs, strategies and momentum correction come from the same `EngineConfig` the
//! CLI builds); a restart first shuts the running engine down on every rank (each rank must
//! call it at the same point) and takes its transport back. Collectives on names that are not
//! registered run dense and exact.
//!
//! Under `gradwire launch --elastic` (`GRADWIRE_ELASTIC` set) the world comes from the job's
//! membership coordinator instead of the launcher's variables, over TCP, and `reform` moves
//! this rank to the next generation's world: the rank and world size change in place.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gradwire_engine::{Engine, EngineConfig, MomentumConfig, Phase, Rule, Strategy, TensorSpec};
use gradwire_gpu::staged::{DevicePtr, RawStream};
use gradwire_run::join::{self, TransportKind};
use gradwire_transport::Transport;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::buffer;
use crate::device::Devices;
use crate::elastic::Membership;
use crate::error::{raise, raise_in, GradwireError};
use crate::handle::Handle;

/// Microseconds since the Unix epoch, the timeline's clock.
#[pyfunction]
pub fn now_us() -> u64 {
    gradwire_engine::now_us()
}

/// Logs gradwire's `tracing` events to stderr, filtered by `RUST_LOG` (default: warnings).
/// Called once by the package on import; later calls do nothing.
#[pyfunction]
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

enum State {
    /// Joined, no engine running: the transport waits for `start`.
    Idle(Box<dyn Transport>),
    /// The engine owns the transport.
    Running(Arc<Engine>),
    /// Shut down (or a start failed and took the transport with it).
    Closed(String),
}

/// This process's rank of the job: its transport, then its engine.
#[pyclass(module = "gradwire._gradwire", frozen)]
pub struct Runtime {
    /// Atomics: an elastic re-form changes them.
    rank: AtomicUsize,
    world: AtomicUsize,
    local_rank: usize,
    local_size: usize,
    transport: String,
    state: Mutex<State>,
    /// The elastic job's membership (`None` when not launched elastic).
    elastic: Mutex<Option<Membership>>,
    /// The stager of CUDA tensors, once one arrived.
    devices: Devices,
}

impl Runtime {
    /// A broadcast root must be a rank of the world.
    fn check_root(&self, root: usize) -> PyResult<()> {
        let world = self.world.load(Ordering::Relaxed);
        if root >= world {
            return Err(PyValueError::new_err(format!(
                "root rank {root} is out of range for {world} ranks"
            )));
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn membership(&self) -> std::sync::MutexGuard<'_, Option<Membership>> {
        self.elastic.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the membership, without the GIL; a `GradwireError` when not elastic.
    fn with_membership<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Membership) -> PyResult<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| match &mut *self.membership() {
            Some(m) => f(m),
            None => Err(GradwireError::new_err(
                "this process is not part of an elastic job (no GRADWIRE_ELASTIC)",
            )),
        })
    }

    /// The running engine, started with no registered tensors if none runs yet.
    fn engine(&self, py: Python<'_>) -> PyResult<Arc<Engine>> {
        if let State::Running(e) = &*self.lock() {
            return Ok(e.clone());
        }
        self.start_engine(py, EngineConfig::default(), Vec::new())?;
        match &*self.lock() {
            State::Running(e) => Ok(e.clone()),
            _ => Err(GradwireError::new_err("the engine did not start")),
        }
    }

    /// Shuts down a running engine (collective) and returns its transport.
    fn take_transport(&self, py: Python<'_>) -> PyResult<Box<dyn Transport>> {
        let state = std::mem::replace(&mut *self.lock(), State::Closed("restarting".into()));
        match state {
            State::Idle(t) => Ok(t),
            State::Closed(why) => Err(GradwireError::new_err(format!(
                "gradwire is shut down ({why}): call init() again in a new process"
            ))),
            State::Running(mut e) => {
                // The stager holds the engine until it stops.
                self.devices.reset();
                // Submitters hold clones only for the length of a call.
                let engine = loop {
                    match Arc::try_unwrap(e) {
                        Ok(engine) => break engine,
                        Err(back) => {
                            e = back;
                            py.detach(|| std::thread::sleep(std::time::Duration::from_millis(1)));
                        }
                    }
                };
                match py.detach(move || engine.shutdown()) {
                    Ok(t) => Ok(t),
                    Err(err) => {
                        *self.lock() = State::Closed(err.to_string());
                        Err(raise_in("shutting the engine down", &err))
                    }
                }
            }
        }
    }

    fn start_engine(
        &self,
        py: Python<'_>,
        config: EngineConfig,
        tensors: Vec<TensorSpec>,
    ) -> PyResult<()> {
        // Refused before anything stops: a bad config leaves the running engine as it is.
        config.plan(&tensors).map_err(|e| raise(&e))?;
        let t = self.take_transport(py)?;
        match py.detach(move || Engine::start(t, config, &tensors)) {
            Ok(e) => {
                *self.lock() = State::Running(Arc::new(e));
                Ok(())
            }
            Err(err) => {
                *self.lock() = State::Closed(err.to_string());
                Err(raise_in(
                    &format!(
                        "rank {}: starting the engine",
                        self.rank.load(Ordering::Relaxed)
                    ),
                    &err,
                ))
            }
        }
    }
}

impl Runtime {
    /// A runtime over `t`, idle.
    fn with(
        t: Box<dyn Transport>,
        local_size: usize,
        transport: String,
        elastic: Option<Membership>,
    ) -> Runtime {
        let get = |k: &str| std::env::var(k).ok();
        let (rank, world) = (t.rank(), t.world_size());
        let local_size = local_size.max(1);
        let local_rank = gradwire_transport::env::local_rank_from(get)
            .filter(|&r| r < local_size)
            .unwrap_or(rank % local_size);
        Runtime {
            rank: AtomicUsize::new(rank),
            world: AtomicUsize::new(world),
            local_rank,
            local_size,
            transport,
            state: Mutex::new(State::Idle(t)),
            elastic: Mutex::new(elastic),
            devices: Devices::default(),
        }
    }
}

#[pymethods]
impl Runtime {
    /// Joins the job over `transport` (`auto`, `tcp`, `shm`, `mpi`; `auto`: mpi under an MPI
    /// launcher when built with it, else tcp). Without a launcher, a world of one rank.
    #[new]
    #[pyo3(signature = (transport = "auto"))]
    fn new(py: Python<'_>, transport: &str) -> PyResult<Self> {
        let kind: TransportKind = transport.parse().map_err(|e| raise(&e))?;
        let membership = py.detach(Membership::from_env)?;
        let launched = match membership {
            Some(_) => None,
            None => join::detect().map_err(|e| raise(&e))?,
        };
        let get = |k: &str| std::env::var(k).ok();
        let (t, local_size): (Box<dyn Transport>, usize) = match (membership, &launched) {
            (Some(mut m), _) => {
                if !matches!(kind, TransportKind::Auto | TransportKind::Tcp) {
                    return Err(PyValueError::new_err(format!(
                        "transport={transport:?}: an elastic job runs over tcp"
                    )));
                }
                let (_, t) = py.detach(|| m.next(&[], 0))?;
                let size = gradwire_transport::env::local_size_from(get).unwrap_or(1);
                let t: Box<dyn Transport> = Box::new(t);
                return Ok(Runtime::with(t, size, "tcp".into(), Some(m)));
            }
            (None, Some(l)) => {
                let l = l.clone();
                let size = l.local_size;
                let t = py
                    .detach(move || join::join_with(kind, &l))
                    .map_err(|e| raise(&e))?;
                (t, size)
            }
            (None, None) if kind.resolve() == TransportKind::Mpi => {
                let t = py
                    .detach(move || join::join_from_env(kind))
                    .map_err(|e| raise(&e))?;
                let size = gradwire_transport::env::local_size_from(get).unwrap_or(t.world_size());
                (t, size)
            }
            (None, None) => {
                let t = gradwire_transport::local::Local::world(1)
                    .pop()
                    .ok_or_else(|| GradwireError::new_err("no local rank"))?;
                (Box::new(t), 1)
            }
        };
        let name = if launched.is_some() || t.world_size() > 1 {
            kind.resolve().name().to_string()
        } else {
            "local".to_string()
        };
        Ok(Runtime::with(t, local_size, name, None))
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> usize {
        self.rank.load(Ordering::Relaxed)
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.world.load(Ordering::Relaxed)
    }

    /// Whether this process is a member of an elastic job (`gradwire launch --elastic`).
    #[getter]
    fn elastic(&self) -> bool {
        self.membership().is_some()
    }

    /// The elastic job's current generation (0 when not elastic).
    #[getter]
    fn generation(&self) -> u64 {
        self.membership().as_ref().map_or(0, Membership::generation)
    }

    /// Moves this rank to the elastic job's next world: drops the running engine without a
    /// collective shutdown (a peer may be dead), asks the coordinator for the next world with
    /// `commits` (the commit counters this rank holds) and `reached` (its newest), and joins
    /// that world's mesh; the engine starts again with the next `start`. Returns
    /// `(generation, rank, size, restore_step, survivors)`: ranks below `survivors` hold
    /// the commit `restore_step`, the others are new.
    fn reform(
        &self,
        py: Python<'_>,
        commits: Vec<u64>,
        reached: u64,
    ) -> PyResult<(u64, usize, usize, Option<u64>, usize)> {
        if !self.elastic() {
            return Err(GradwireError::new_err(
                "this process is not part of an elastic job (no GRADWIRE_ELASTIC)",
            ));
        }
        let old = std::mem::replace(&mut *self.lock(), State::Closed("re-forming".into()));
        // Dropping asks the engine to stop without waiting for the other ranks.
        py.detach(move || drop(old));
        let (world, t) = self.with_membership(py, |m| m.next(&commits, reached))?;
        let (rank, size) = (world.rank as usize, world.world_size as usize);
        self.rank.store(rank, Ordering::Relaxed);
        self.world.store(size, Ordering::Relaxed);
        *self.lock() = State::Idle(Box::new(t));
        Ok((
            world.generation,
            rank,
            size,
            world.restore_step,
            world.survivors as usize,
        ))
    }

    /// Whether a process waits to join the elastic job (rank 0 asks at a commit).
    fn pending(&self, py: Python<'_>) -> PyResult<bool> {
        self.with_membership(py, Membership::pending)
    }

    /// Reports to the elastic coordinator that `generation` trains again since `unix_s`.
    fn resumed(&self, py: Python<'_>, generation: u64, unix_s: f64) -> PyResult<()> {
        self.with_membership(py, |m| m.resumed(generation, unix_s))
    }

    /// Tells the elastic coordinator that this member finished.
    fn done(&self, py: Python<'_>) -> PyResult<()> {
        self.with_membership(py, Membership::done)
    }

    /// This rank's position among the job's ranks on its host.
    #[getter]
    fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Ranks of the job on this host.
    #[getter]
    fn local_size(&self) -> usize {
        self.local_size
    }

    /// The transport joining the ranks (`tcp`, `shm`, `mpi`; `local` for a world of one).
    #[getter]
    fn transport(&self) -> &str {
        &self.transport
    }

    /// (Re)starts the engine with `tensors` (`(name, shape)` pairs, the order every rank
    /// registers) under `codec` (a gradwire codec spec), per-tensor `rules`
    /// (`SELECTOR=>CODEC[@STRATEGY]`, first match wins), `sync` (strategy: auto, dense,
    /// sparse, gather, quantized, stripe, powersgd), momentum correction `(beta, nesterov)`,
    /// the codecs' `seed`, `timeline` spans on or off, `fusion_bytes` and the negotiation
    /// `cycle_ms`. Collective: every rank calls it at the same point.
    #[pyo3(signature = (tensors, codec = "none", rules = Vec::new(), sync = "auto",
        momentum = None, seed = 42, timeline = false, fusion_bytes = None, cycle_ms = None))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        py: Python<'_>,
        tensors: Vec<(String, Vec<usize>)>,
        codec: &str,
        rules: Vec<String>,
        sync: &str,
        momentum: Option<(f64, bool)>,
        seed: u64,
        timeline: bool,
        fusion_bytes: Option<usize>,
        cycle_ms: Option<f64>,
    ) -> PyResult<()> {
        let bad =
            |what: &str, e: &dyn std::fmt::Display| PyValueError::new_err(format!("{what}: {e}"));
        let mut config = EngineConfig {
            codec: codec
                .parse()
                .map_err(|e| bad(&format!("codec {codec:?}"), &e))?,
            strategy: sync
                .parse::<Strategy>()
                .map_err(|e| bad(&format!("sync {sync:?}"), &e))?,
            rules: rules
                .iter()
                .map(|r| {
                    r.parse::<Rule>()
                        .map_err(|e| bad(&format!("rule {r:?}"), &e))
                })
                .collect::<PyResult<_>>()?,
            momentum: momentum.map(|(beta, nesterov)| MomentumConfig {
                beta: beta as f32,
                nesterov,
                masking: true,
            }),
            seed,
            timeline,
            ..EngineConfig::default()
        };
        if let Some(b) = fusion_bytes {
            config.fusion_bytes = b;
        }
        if let Some(ms) = cycle_ms {
            if !(ms.is_finite() && ms > 0.0) {
                return Err(PyValueError::new_err(format!(
                    "cycle_ms={ms}: expected a positive number of milliseconds"
                )));
            }
            config.cycle_time = std::time::Duration::from_secs_f64(ms / 1e3);
        }
        let specs = tensors
            .into_iter()
            .map(|(name, shape)| TensorSpec::new(name, shape))
            .collect();
        self.start_engine(py, config, specs)
    }

    /// `name -> "codec@strategy"` of every registered tensor, in registration order.
    fn policies(&self) -> Vec<(String, String)> {
        match &*self.lock() {
            State::Running(e) => e
                .policies()
                .iter()
                .map(|p| (p.tensor.name.clone(), format!("{}@{}", p.codec, p.strategy)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Submits the mean over ranks of the `numel` floats at `addr`, each multiplied by
    /// `prescale` first, under `name`'s policy; returns at once.
    #[pyo3(signature = (name, addr, numel, prescale = 1.0))]
    fn allreduce(
        &self,
        py: Python<'_>,
        name: &str,
        addr: usize,
        numel: usize,
        prescale: f32,
    ) -> PyResult<Handle> {
        let engine = self.engine(py)?;
        // SAFETY: the Python side passes a live contiguous float32 buffer of `numel`.
        let data = unsafe { buffer::read(addr, numel, prescale)? };
        Ok(Handle::new(engine.all_reduce(name, data)))
    }

    /// [`Runtime::allreduce`] of a CUDA tensor: the `numel` floats at device address `addr`
    /// on GPU `device`, produced by the work queued on `stream` (a `CUstream`; 0 is the
    /// default stream). Returns at once, before the GPU has produced them.
    #[pyo3(signature = (name, addr, numel, stream, device, prescale = 1.0))]
    // The arguments are the Python call's, one per field of the tensor.
    #[allow(clippy::too_many_arguments)]
    fn allreduce_device(
        &self,
        py: Python<'_>,
        name: &str,
        addr: usize,
        numel: usize,
        stream: usize,
        device: usize,
        prescale: f32,
    ) -> PyResult<Handle> {
        let engine = self.engine(py)?;
        let (ptr, stream) = (DevicePtr(addr as u64), RawStream(stream as u64));
        // SAFETY: the Python side passes a live contiguous float32 CUDA tensor of `numel`
        // on `device` and keeps it referenced, unwritten, until the handle is waited on.
        self.devices.submit(&engine, name, device, |st| unsafe {
            st.all_reduce(name, ptr, numel, stream, prescale)
        })
    }

    /// [`Runtime::broadcast`] of a CUDA tensor (as in [`Runtime::allreduce_device`]).
    #[allow(clippy::too_many_arguments)]
    fn broadcast_device(
        &self,
        py: Python<'_>,
        name: &str,
        addr: usize,
        numel: usize,
        stream: usize,
        device: usize,
        root: usize,
    ) -> PyResult<Handle> {
        self.check_root(root)?;
        let engine = self.engine(py)?;
        let (ptr, stream) = (DevicePtr(addr as u64), RawStream(stream as u64));
        // SAFETY: as in `allreduce_device`.
        self.devices.submit(&engine, name, device, |st| unsafe {
            st.broadcast(name, ptr, numel, stream, root)
        })
    }

    /// Submits the concatenation in rank order of every rank's `numel` floats at `addr`.
    fn allgather(&self, py: Python<'_>, name: &str, addr: usize, numel: usize) -> PyResult<Handle> {
        let engine = self.engine(py)?;
        // SAFETY: as in `allreduce`.
        let data = unsafe { buffer::read(addr, numel, 1.0)? };
        Ok(Handle::new(engine.all_gather(name, data)))
    }

    /// Submits rank `root`'s `numel` floats (every rank passes a buffer of that length).
    fn broadcast(
        &self,
        py: Python<'_>,
        name: &str,
        addr: usize,
        numel: usize,
        root: usize,
    ) -> PyResult<Handle> {
        self.check_root(root)?;
        let engine = self.engine(py)?;
        // SAFETY: as in `allreduce`.
        let data = unsafe { buffer::read(addr, numel, 1.0)? };
        Ok(Handle::new(engine.broadcast(name, data, root)))
    }

    /// A barrier named `name`: completes once every rank called it.
    fn barrier(&self, py: Python<'_>, name: &str) -> PyResult<Handle> {
        Ok(Handle::new(self.engine(py)?.barrier(name)))
    }

    /// Says the burst of submissions is complete (backward is done): its round starts now.
    fn flush(&self) {
        if let State::Running(e) = &*self.lock() {
            e.flush();
        }
        self.devices.flush();
    }

    /// Where training is (DGC's warm-up, the codecs' RNG streams, bytes per step).
    fn set_progress(&self, step: u64, epoch: f32) {
        if let State::Running(e) = &*self.lock() {
            e.set_progress(step, epoch);
        }
    }

    /// Records a span of the caller's (`forward`, `backward`, `update`) on the timeline.
    fn record_span(&self, name: &str, phase: &str, start_us: u64, end_us: u64) -> PyResult<()> {
        let phase = match phase {
            "forward" => Phase::Forward,
            "backward" => Phase::Backward,
            "update" => Phase::Update,
            other => {
                return Err(PyValueError::new_err(format!(
                    "phase {other:?}: expected forward, backward or update"
                )))
            }
        };
        if let State::Running(e) = &*self.lock() {
            e.record_span(name, phase, start_us, end_us);
        }
        Ok(())
    }

    /// The timeline's spans so far: `(tensor, PHASE, start_us, end_us)`.
    fn spans(&self) -> Vec<(String, &'static str, u64, u64)> {
        match &*self.lock() {
            State::Running(e) => e
                .timeline()
                .into_iter()
                .map(|s| (s.tensor, s.phase.as_str(), s.start_us, s.end_us))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Writes this rank's timeline (Chrome trace JSON) to `path`.
    fn write_timeline(&self, path: std::path::PathBuf) -> PyResult<()> {
        match &*self.lock() {
            State::Running(e) => e
                .write_timeline(&path)
                .map_err(|err| raise_in(&format!("writing {}", path.display()), &err)),
            _ => Err(GradwireError::new_err("no engine is running")),
        }
    }

    /// Merges the per-rank timelines `inputs` into one Chrome trace at `out`.
    #[staticmethod]
    fn merge_timelines(inputs: Vec<std::path::PathBuf>, out: std::path::PathBuf) -> PyResult<()> {
        let refs: Vec<&std::path::Path> = inputs.iter().map(|p| p.as_path()).collect();
        gradwire_engine::merge_traces(&refs, &out)
            .map_err(|e| raise_in(&format!("merging into {}", out.display()), &e))
    }

    /// What went from the GPU to the host for CUDA tensors: `staged` tensors copied down
    /// whole (`staged_bytes`), `encoded` tensors compressed on the GPU (`encoded_bytes`
    /// dense, of which only `payload_bytes` came to the host).
    fn device_copies<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.devices.stats();
        let d = PyDict::new(py);
        d.set_item("staged", st.staged)?;
        d.set_item("staged_bytes", st.staged_bytes)?;
        d.set_item("encoded", st.encoded)?;
        d.set_item("encoded_bytes", st.encoded_bytes)?;
        d.set_item("payload_bytes", st.payload_bytes)?;
        Ok(d)
    }

    /// This rank's byte counters: `raw_bytes`, `wire_bytes` (all-reduce), `negotiation_bytes`,
    /// `other_bytes` (gather, broadcast) and `sent_bytes` (their sum, what left this rank).
    fn bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let b = match &*self.lock() {
            State::Running(e) => e.bytes(),
            _ => Default::default(),
        };
        let d = PyDict::new(py);
        d.set_item("raw_bytes", b.raw_bytes)?;
        d.set_item("wire_bytes", b.wire_bytes)?;
        d.set_item("negotiation_bytes", b.negotiation_bytes)?;
        d.set_item("other_bytes", b.other_bytes)?;
        d.set_item(
            "sent_bytes",
            b.wire_bytes + b.negotiation_bytes + b.other_bytes,
        )?;
        Ok(d)
    }

    /// This rank's engine state (codec residuals, DGC's velocity and warm-up position,
    /// momentum-correction velocities, the step) as bytes: gradwire's versioned, checksummed
    /// format. Call between steps (nothing submitted and not waited on).
    fn save_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let engine = self.engine(py)?;
        let state = py
            .detach(|| engine.save_state())
            .map_err(|e| raise_in("saving the engine's state", &e))?;
        Ok(PyBytes::new(py, &state.to_bytes()))
    }

    /// Restores a `save_state` of this rank into the running engine (same tensors, policies,
    /// seed and world size; anything else raises, naming what differs, and changes nothing).
    /// Returns the saved `(step, epoch)`.
    fn load_state(&self, py: Python<'_>, state: &[u8]) -> PyResult<(u64, f32)> {
        let state = gradwire_engine::EngineState::from_bytes(state)
            .map_err(|e| raise_in("reading a saved engine state", &e))?;
        let engine = self.engine(py)?;
        py.detach(|| engine.load_state(&state))
            .map_err(|e| raise_in("loading the engine's state", &e))?;
        Ok((state.step, state.epoch))
    }

    /// Shuts the engine down (collective: waits for every rank) and closes the transport.
    fn shutdown(&self, py: Python<'_>) -> PyResult<()> {
        let idle = matches!(&*self.lock(), State::Idle(_));
        let closed = matches!(&*self.lock(), State::Closed(_));
        if closed {
            return Ok(());
        }
        let r = if idle {
            Ok(())
        } else {
            self.take_transport(py).map(drop)
        };
        *self.lock() = State::Closed("shutdown() was called".into());
        r
    }

    /// Whether `shutdown` ran (or a failure closed the runtime).
    #[getter]
    fn closed(&self) -> bool {
        matches!(&*self.lock(), State::Closed(_))
    }
}
