//! gradwire-engine: non-blocking gradient synchronization (Horovod, Aluminum).
//!
//! This layer owns what happens between "a rank has a named gradient tensor" and "every rank
//! holds the reduced tensor": the per-tensor compression policy, negotiation of which tensors
//! are ready, fusion, the progress thread that owns the transport, and the timeline. It must
//! never know what a model, a data set or an optimizer is.
//!
//! - [`Engine::start`] validates an [`EngineConfig`] against the tensor list (a typed error
//!   before anything runs), checks with every rank that they registered the same tensors with
//!   the same shapes and policies, and hands the transport to a progress thread.
//! - [`Engine::all_reduce`], [`Engine::all_gather`], [`Engine::broadcast`] return a
//!   [`Handle`] at once; [`Handle::wait`] / [`Handle::test`] in any order. A backward pass
//!   submits each gradient as it is produced and calls [`Engine::flush`] at the end (or uses
//!   [`Engine::all_reduce_batch`]), so the burst reaches one negotiation round and one fused
//!   collective per kind.
//! - Each cycle the ranks negotiate which named tensors are ready everywhere (the response
//!   cache makes it one bit per tensor), and execute them in the same order, fused
//!   ([`fusion`] says why fused and unfused results are bit-identical).
//! - Codecs are built per tensor, except a selection unit: `topk:scope=global` (Aji &
//!   Heafield's one threshold over the whole gradient) under the sparse all-reduce or gather
//!   strategy gives all tensors of that policy one codec whose layout is all of them; the
//!   unit runs once all its tensors are ready everywhere (a tensor of it that no rank submits
//!   holds the others back, and the stall inspector names it), as one top-k over their
//!   concatenation and one collective, each tensor getting its slice.
//! - Mismatches (name, shape, dtype, op, codec) are errors naming the tensor and the ranks,
//!   within one cycle; a tensor some ranks never submit is reported by the stall inspector;
//!   a transport failure reaches every pending handle, naming the rank.
//! - Steady state on small models: the registered dense tensors submitted together are
//!   reduced in the negotiation round itself (bit-identical; [`EngineStats::speculative_rounds`]),
//!   and a thread waiting on a handle runs the cycle itself instead of handing it to the
//!   progress thread.
//! - The timeline (Chrome trace per rank, [`merge_traces`]), straggler analysis and byte
//!   accounting ([`EngineStats`]) measure it all.
//! - A rank that encoded a gather or sparse tensor itself (on a GPU, with a codec built from
//!   [`Engine::codec_context`]) submits the payload instead of the data
//!   ([`Engine::all_reduce_encoded`]): checked whole before it is queued, then negotiated,
//!   fused and reduced as the engine's own encode would be, bit for bit.
//! - Between steps, [`Engine::save_state`] takes everything a rank carries from one step to
//!   the next (codec and strategy states, momentum velocities, progress) as an
//!   [`EngineState`] with a versioned, checksummed binary form ([`state`]), and
//!   [`Engine::load_state`] restores it into a fresh engine: a training that stops resumes
//!   bit for bit.
//!
//! ```
//! use gradwire_engine::{Engine, EngineConfig, TensorSpec};
//! use gradwire_transport::local::Local;
//!
//! let tensors = vec![TensorSpec::new("w", [2, 2]), TensorSpec::new("b", [2])];
//! let hs: Vec<_> = Local::world(2).into_iter().map(|t| {
//!     let tensors = tensors.clone();
//!     std::thread::spawn(move || {
//!         let r = gradwire_transport::Transport::rank(&t) as f32;
//!         let e = Engine::start(t, EngineConfig::default(), &tensors).unwrap();
//!         let b = e.all_reduce("b", vec![r, 1.0]);
//!         let w = e.all_reduce("w", vec![r; 4]);
//!         let (w, b) = (w.wait().unwrap(), b.wait().unwrap());
//!         e.shutdown().unwrap();
//!         (w, b)
//!     })
//! }).collect();
//! for h in hs {
//!     assert_eq!(h.join().unwrap(), (vec![0.5; 4], vec![0.5, 1.0]));
//! }
//! ```
#![deny(missing_docs)]

pub mod bench;
mod config;
mod dense;
mod encoded;
mod error;
pub mod fusion;
mod handle;
mod hosts;
mod pending;
mod rd_gather;
pub mod state;
mod stats;
pub mod timeline;
mod wire;
mod worker;

#[cfg(test)]
mod tests;

/// Compile-time guard: an engine can be shared between threads (submit from anywhere).
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Engine>();
    shared::<Handle>();
};

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use gradwire_codec::Progress;
use gradwire_transport::Transport;

pub use config::{
    tensor_seed, DenseAlgorithm, EngineConfig, HostConfig, LocalLink, MomentumConfig, Policy, Rule,
    Selector, Strategy, TensorSpec,
};
pub use error::{EncodedRefusal, Error, Result};
/// The codecs the engine runs (spec strings, tensor roles), for callers that configure it.
pub use gradwire_codec as codec;
pub use gradwire_codec::TensorRole;
pub use gradwire_collective::CollectiveConfig;
pub use handle::Handle;
#[cfg(unix)]
pub use hosts::host_config_from_env;
pub use hosts::{
    describe_layout, hierarchy_off, host_from, hosts_from_list, this_host, HostError, HostGroups,
};
pub use state::{EngineState, SavedTensor, StateFormatError, STATE_MAGIC, STATE_VERSION};
pub use stats::{
    ByteStats, EngineStats, StallReport, StepBytes, StragglerRecord, StragglerSummary,
};
pub use timeline::{merge_traces, now_us, Phase, Span};
pub use wire::{Descriptor, OpKind};

/// Fuzzing entry: decodes a negotiation message, a descriptor list and a speculative-round
/// exchange from `buf` as if rank `peer` had sent them; every input must give a value or a
/// typed error, never a panic.
#[cfg(fuzzing)]
pub fn fuzz_negotiation(peer: usize, buf: &[u8]) {
    let _ = wire::Message::decode(peer, buf);
    let _ = wire::decode_list(peer, buf);
    // The speculative exchange, with the part length taken from the input's first byte.
    let part_len = buf.first().map_or(0, |&b| usize::from(b));
    let _ = wire::decode_exchange(peer, buf, part_len);
    let count = buf.get(1).map_or(0, |&b| usize::from(b % 9));
    let _ = wire::decode_tree_exchange(peer, buf, 8, count, |r| r % 2 == 1, part_len);
}

/// Fuzzing entry: decodes `buf` as a saved engine state, whole (header and checksum) and as
/// a body alone (past the checksum, which stops most mutated inputs); every input must give
/// a value or a typed error, never a panic, and what decodes must encode back to the same
/// bytes.
#[cfg(fuzzing)]
pub fn fuzz_state(buf: &[u8]) {
    if let Ok(s) = EngineState::from_bytes(buf) {
        assert_eq!(
            s.to_bytes(),
            buf,
            "a decoded state encodes back to its bytes"
        );
    }
    if let Ok(s) = state::decode_body(buf) {
        assert_eq!(state::encode_body(&s), buf, "a decoded body encodes back");
    }
}

#[cfg(fuzzing)]
pub use encoded::fuzz_encoded_pairs;

use worker::{lock, Queue, Shared, Submission, Worker};

/// `topk:scope=global` (Aji & Heafield's one threshold over the whole gradient) selects over
/// all tensors of its policy at once under the sparse all-reduce and gather strategies
/// ([`worker::selection_units`]); the quantized ring's codecs see one ring chunk each, so
/// there it selects per chunk: said once at start instead of silently.
fn warn_global_topk(policies: &[Policy]) {
    let chunked = policies
        .iter()
        .filter(|p| {
            p.strategy == Strategy::Quantized
                && matches!(&p.codec, gradwire_codec::CodecConfig::TopK(c)
                if c.scope == gradwire_codec::TopKScope::Global)
        })
        .count();
    if chunked > 0 {
        tracing::warn!(
            tensors = chunked,
            "topk scope=global under the quantized strategy selects the top entries of each \
             ring chunk separately; its single threshold over all tensors runs under the \
             sparse (default) and gather strategies"
        );
    }
}

/// The non-blocking engine of one rank. Submit from any thread (`&self`); the progress
/// thread owns the transport until [`Engine::shutdown`].
pub struct Engine {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<Option<Box<dyn Transport>>>>,
    rank: usize,
    world: usize,
    /// Registered tensors' cache ids by name.
    registered: HashMap<String, usize>,
    /// Registered tensors by cache id (registration order).
    targets: Vec<Target>,
    /// Where the next registered lookup looks first: after the last one found, since a
    /// trainer submits its tensors in the same order every step (a miss only costs the
    /// hash lookup).
    next: AtomicUsize,
    policies: Vec<Policy>,
    hierarchy: Option<String>,
    /// What [`Engine::all_reduce_encoded`] needs per registered tensor.
    encoded: encoded::Table,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("tensors", &self.policies.len())
            .finish()
    }
}

impl Engine {
    /// Validates `config` against `tensors` ([`EngineConfig::plan`]), checks with every rank
    /// (one all-gather) that all registered the same tensors, shapes and policies (else
    /// [`Error::Mismatch`] naming the first differing tensor and the ranks), and starts the
    /// progress thread. Every rank must call it.
    pub fn start<T: Transport + 'static>(
        transport: T,
        config: EngineConfig,
        tensors: &[TensorSpec],
    ) -> Result<Engine> {
        let policies = config.plan(tensors)?;
        warn_global_topk(&policies);
        let mut t: Box<dyn Transport> = Box::new(transport);
        let (rank, world) = (t.rank(), t.world_size());
        let descs: Vec<Descriptor> = policies
            .iter()
            .map(|p| worker::registered_descriptor(p, &config))
            .collect();
        let before = t.bytes_sent();
        check_registration(&mut *t, &descs)?;
        let hosts = match &config.hosts {
            Some(h) if world > 1 => hosts::connect(&mut *t, h)?,
            _ => None,
        };
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            worker: Mutex::new(None),
            cycle: config.cycle_time.max(std::time::Duration::from_micros(50)),
            wake: Condvar::new(),
            stats: Mutex::new(EngineStats::default()),
            spans: Mutex::new(Vec::new()),
            timeline: config.timeline,
        });
        lock(&shared.stats).bytes.negotiation_bytes += t.bytes_sent().saturating_sub(before);
        // Registered tensors are cached first, in order, so tensor `i` has cache id `i`.
        let targets: Vec<Target> = descs
            .iter()
            .enumerate()
            .map(|(id, d)| {
                let mut t = Target::new(Arc::new(d.clone()));
                t.id = Some(id);
                t
            })
            .collect();
        let registered = descs
            .iter()
            .enumerate()
            .map(|(id, d)| (d.name.clone(), id))
            .collect();
        let hierarchy = hosts.as_ref().map(dense::HostLinks::describe);
        let encoded = encoded::Table::new(&policies, &config, rank, world);
        let w = Worker::new(t, shared.clone(), config, &policies, hosts);
        *lock(&shared.worker) = Some(w);
        let s = shared.clone();
        let worker = std::thread::Builder::new()
            .name(format!("gradwire-engine-{rank}"))
            .spawn(move || Worker::run(s))
            .map_err(|e| Error::InvalidSetting {
                field: "thread",
                reason: e.to_string(),
            })?;
        Ok(Engine {
            shared,
            worker: Some(worker),
            rank,
            world,
            registered,
            targets,
            next: AtomicUsize::new(0),
            policies,
            hierarchy,
            encoded,
        })
    }

    /// The hierarchy the dense tensors go through, e.g. `2 hosts (2+2 ranks)`; `None` when
    /// flat ([`EngineConfig::hosts`] unset, or one host, or one rank per host).
    pub fn hierarchy(&self) -> Option<&str> {
        self.hierarchy.as_deref()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The resolved policy of every registered tensor, in registration order.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// Mean over ranks of `data`, through the tensor's policy (registered tensors: its codec,
    /// strategy and momentum correction; an unregistered name: dense, exact, no momentum).
    /// `data` must have the registered shape's length.
    pub fn all_reduce(&self, name: &str, data: Vec<f32>) -> Handle {
        let target = self.all_reduce_descriptor(name, data.len());
        self.submit_many(vec![(target, data, None)])
            .pop()
            .expect("one handle")
    }

    /// [`Engine::all_reduce`] of several tensors, queued at once and flushed (so the next
    /// round sees all of them and can fuse them); handles in the same order. Names may be
    /// borrowed (`&str`) or owned.
    pub fn all_reduce_batch<N: AsRef<str>>(
        &self,
        tensors: impl IntoIterator<Item = (N, Vec<f32>)>,
    ) -> Vec<Handle> {
        let handles = self.all_reduce_batch_unflushed(tensors);
        self.flush();
        handles
    }

    /// [`Engine::all_reduce_batch`] without the flush: for a caller that waits on one of the
    /// handles right away. The waiting thread then runs the round itself and the progress
    /// thread is not woken at all (a flush wakes it, and it wakes again after its grace
    /// period to find the burst taken: two context switches per step on a busy host). A
    /// burst nobody waits on still starts within ten cycles; a caller that computes before
    /// waiting should use `all_reduce_batch`, whose flush starts the round meanwhile.
    pub fn all_reduce_batch_unflushed<N: AsRef<str>>(
        &self,
        tensors: impl IntoIterator<Item = (N, Vec<f32>)>,
    ) -> Vec<Handle> {
        let item = |(name, data): (N, Vec<f32>)| {
            (
                self.all_reduce_descriptor(name.as_ref(), data.len()),
                data,
                None,
            )
        };
        self.submit_many(tensors.into_iter().map(item))
    }

    /// Says that this burst of submissions is complete (e.g. backward is done) and wakes the
    /// progress thread. A thread waiting on one of its handles runs the round at once; if
    /// none does, the progress thread starts it a short grace later (an eighth of a cycle,
    /// 20..200 µs, so as not to race the waiter). Without a flush or a waiter, a burst starts
    /// within ten cycles.
    pub fn flush(&self) {
        let mut q = lock(&self.shared.queue);
        if !q.subs.is_empty() {
            q.flushed_at = Some(std::time::Instant::now());
            drop(q);
            self.shared.wake.notify_one();
        }
    }

    fn all_reduce_descriptor(&self, name: &str, len: usize) -> Result<Target> {
        let guess = self.next.load(Ordering::Relaxed);
        let id = match self.targets.get(guess) {
            Some(t) if &*t.name == name => Some(guess),
            _ => self.registered.get(name).copied(),
        };
        match id {
            Some(id) => {
                self.next
                    .store((id + 1) % self.targets.len(), Ordering::Relaxed);
                let t = &self.targets[id];
                let expected = t.desc.shape.iter().product::<u64>() as usize;
                if len != expected {
                    return Err(Error::LengthMismatch {
                        tensor: name.into(),
                        expected,
                        got: len,
                    });
                }
                Ok(t.clone())
            }
            None => Ok(Target::new(adhoc(
                name,
                OpKind::AllReduce,
                0,
                len,
                worker::ADHOC_POLICY,
            ))),
        }
    }

    /// Concatenation, in rank order, of every rank's `data` (lengths may differ per rank).
    /// The name must not be a registered (all-reduce) tensor's.
    pub fn all_gather(&self, name: &str, data: Vec<f32>) -> Handle {
        if let Some(h) = self.refuse_registered(name, "all_gather") {
            return h;
        }
        let desc = adhoc(name, OpKind::AllGather, 0, data.len(), "");
        self.submit(desc, data)
    }

    /// Rank `root`'s `data` on every rank (every rank passes a buffer of the same length).
    /// The name must not be a registered (all-reduce) tensor's.
    pub fn broadcast(&self, name: &str, data: Vec<f32>, root: usize) -> Handle {
        if let Some(h) = self.refuse_registered(name, "broadcast") {
            return h;
        }
        if root >= self.world {
            return Handle::failed(
                name.into(),
                Error::InvalidSetting {
                    field: "root",
                    reason: format!("rank {root} is not in a world of {}", self.world),
                },
            );
        }
        let desc = adhoc(name, OpKind::Broadcast, root, data.len(), "");
        self.submit(desc, data)
    }

    /// A barrier: the handle completes (with an empty buffer) once every rank has called
    /// `barrier` with this name; no data moves, only the negotiation round that finds it
    /// ready. The name must not be a registered (all-reduce) tensor's.
    pub fn barrier(&self, name: &str) -> Handle {
        if let Some(h) = self.refuse_registered(name, "barrier") {
            return h;
        }
        let desc = adhoc(name, OpKind::Barrier, 0, 0, "");
        self.submit(desc, Vec::new())
    }

    fn refuse_registered(&self, name: &str, op: &str) -> Option<Handle> {
        self.registered.contains_key(name).then(|| {
            Handle::failed(
                name.into(),
                Error::InvalidSetting {
                    field: "op",
                    reason: format!(
                        "'{name}' is a registered all-reduce tensor; {op} needs another name"
                    ),
                },
            )
        })
    }

    fn submit(&self, desc: Arc<Descriptor>, data: Vec<f32>) -> Handle {
        self.submit_many(vec![(Ok(Target::new(desc)), data, None)])
            .pop()
            .expect("one handle")
    }

    fn submit_many(
        &self,
        items: impl IntoIterator<Item = (Result<Target>, Vec<f32>, Option<encoded::Encoded>)>,
    ) -> Vec<Handle> {
        let mut q = lock(&self.shared.queue);
        // Submitting wakes no thread (see `Shared::wait_for_work`): a waiter or a flush
        // starts the round; the first submission of a burst records when it began.
        let was_empty = q.subs.is_empty();
        let progress = q.progress;
        let ready_us = now_us();
        let handles = items
            .into_iter()
            .map(|(target, data, encoded)| {
                let Target { desc, name, id } = match target {
                    Ok(t) => t,
                    Err(e) => {
                        let name = match &e {
                            Error::LengthMismatch { tensor, .. } => tensor.as_str(),
                            _ => "",
                        };
                        return Handle::failed(name.into(), e);
                    }
                };
                let (h, slot) = match id {
                    Some(id) => Handle::with_slot(name, q.slot(id)),
                    None => Handle::new(name),
                };
                let h = h.with_driver(self.shared.clone());
                if let Some(e) = &q.fatal {
                    slot.complete(Err(e.clone()));
                } else if q.exited || q.shutdown {
                    slot.complete(Err(Error::ShutDown));
                } else {
                    q.subs.push(Submission {
                        desc,
                        id,
                        data,
                        encoded,
                        slot,
                        ready_us,
                        progress,
                    });
                }
                h
            })
            .collect();
        if was_empty && !q.subs.is_empty() {
            q.burst_began = Some(std::time::Instant::now());
        }
        drop(q);
        handles
    }

    /// Where training is: every codec, under every strategy, gets this progress with the
    /// tensors submitted from now on (DGC's warm-up, seeded RNG streams), and their bytes
    /// are accounted to `step`.
    pub fn set_progress(&self, step: u64, epoch: f32) {
        lock(&self.shared.queue).progress = Progress { step, epoch };
    }

    /// The progress last given to [`Engine::set_progress`] (what a submission now carries).
    pub fn progress(&self) -> Progress {
        lock(&self.shared.queue).progress
    }

    /// This rank's synchronization state, for a training that stops to resume bit for bit
    /// ([`Engine::load_state`] on a fresh engine with the same registrations): per
    /// registered tensor, in registration order, its codec's or strategy's state (residuals,
    /// momenta, RNG positions, PowerSGD's `Q`s, the stripes' and the quantized ring's
    /// codecs; a selection unit's codec with its first tensor) and its momentum-correction
    /// velocity; and the progress last given to [`Engine::set_progress`]. See [`state`]
    /// for the contents and the binary form ([`EngineState::to_bytes`]).
    ///
    /// Call it between steps, once every handle has completed: it waits for a round in
    /// flight to end, then fails with [`Error::StatePending`] (naming the tensors) if
    /// submissions are still queued or pending rather than return a state from the middle
    /// of a step; with the error that stopped the engine if its progress thread has exited.
    /// Each rank saves its own state (they differ: residuals are per rank).
    pub fn save_state(&self) -> Result<EngineState> {
        let g = lock(&self.shared.worker);
        let q = lock(&self.shared.queue);
        let Some(w) = g.as_ref() else {
            return Err(q.fatal.clone().unwrap_or(Error::ShutDown));
        };
        let pending = pending_names(w, &q);
        if !pending.is_empty() {
            return Err(Error::StatePending { tensors: pending });
        }
        let progress = q.progress;
        drop(q);
        Ok(w.save_state(progress))
    }

    /// Restores a state [`Engine::save_state`] took on this rank of an engine with the same
    /// world size, seed and registrations (names, shapes and policies, in the same order),
    /// and sets the progress it holds (as [`Engine::set_progress`] does). Every rank loads
    /// its own state, between steps, before submitting anything.
    ///
    /// Fails, changing nothing, with [`Error::StateMismatch`] (naming the tensor, or the
    /// rank, world size or seed) for a state of another engine, [`Error::StateRefused`]
    /// (naming the tensor) when a codec or all-reduce refuses its part, and
    /// [`Error::StatePending`] when submissions are queued or pending; with the error that
    /// stopped the engine if its progress thread has exited.
    pub fn load_state(&self, state: &EngineState) -> Result<()> {
        self.load_state_as(state, worker::LoadMode::Exact).map(drop)
    }

    /// Restores a state saved on another rank or in a world of another size (elastic
    /// training, after the world changed), with the same seed and registrations: what each
    /// tensor carries (codec residuals, momentum velocity, PowerSGD's `Q`) is kept where it
    /// fits the new world, and the progress is set. A tensor whose state the new
    /// all-reduce refuses (the quantized ring's and the stripes' states are per chunk of
    /// the world's split) starts from a fresh state instead; their names are returned.
    /// Fails, changing nothing, as [`Engine::load_state`] does otherwise.
    pub fn load_state_elsewhere(&self, state: &EngineState) -> Result<Vec<String>> {
        self.load_state_as(state, worker::LoadMode::Elsewhere)
    }

    fn load_state_as(&self, state: &EngineState, mode: worker::LoadMode) -> Result<Vec<String>> {
        let mut g = lock(&self.shared.worker);
        let mut q = lock(&self.shared.queue);
        let Some(w) = g.as_mut() else {
            return Err(q.fatal.clone().unwrap_or(Error::ShutDown));
        };
        let pending = pending_names(w, &q);
        if !pending.is_empty() {
            return Err(Error::StatePending { tensors: pending });
        }
        let reset = w.load_state(state, mode)?;
        q.progress = Progress {
            step: state.step,
            epoch: state.epoch,
        };
        Ok(reset)
    }

    /// Records a span of the trainer's (UPDATE, FORWARD, BACKWARD, ...) on this rank's
    /// timeline (µs from [`now_us`]); ignored unless [`EngineConfig::timeline`] is on.
    pub fn record_span(&self, name: &str, phase: Phase, start_us: u64, end_us: u64) {
        if self.shared.timeline {
            lock(&self.shared.spans).push(Span {
                tensor: name.to_string(),
                phase,
                rank: self.rank,
                start_us,
                end_us: end_us.max(start_us),
            });
        }
    }

    /// The spans recorded so far.
    pub fn timeline(&self) -> Vec<Span> {
        lock(&self.shared.spans).clone()
    }

    /// Writes this rank's timeline as Chrome trace JSON (`pid` = rank).
    pub fn write_timeline(&self, path: &Path) -> Result<()> {
        let spans = lock(&self.shared.spans);
        timeline::write_trace(path, self.rank, &spans)
    }

    /// Bytes, stragglers, stall reports and cycle count so far.
    pub fn stats(&self) -> EngineStats {
        lock(&self.shared.stats).clone()
    }

    /// The round counters alone, without copying the records that grow over a run: negotiation
    /// rounds ([`EngineStats::cycles`]), fused collectives run
    /// ([`StragglerSummary::collectives`]) and
    /// speculative rounds ([`EngineStats::speculative_rounds`]).
    pub fn rounds(&self) -> (u64, u64, u64) {
        let st = lock(&self.shared.stats);
        (st.cycles, st.stragglers.collectives, st.speculative_rounds)
    }

    /// The byte counters alone ([`EngineStats::bytes`]), without copying the per-step and
    /// straggler records that grow over a run: what a caller reading them every step needs.
    pub fn bytes(&self) -> ByteStats {
        lock(&self.shared.stats).bytes.clone()
    }

    /// The stall warnings raised so far (the same on every rank).
    pub fn stall_reports(&self) -> Vec<StallReport> {
        lock(&self.shared.stats).stalls.clone()
    }

    /// Asks to shut down and waits until every rank has asked too (operations already
    /// submitted everywhere complete first; those some ranks never submitted fail with
    /// [`Error::NotSubmittedEverywhere`]). Gives the transport back, or the error that
    /// stopped the engine.
    pub fn shutdown(mut self) -> Result<Box<dyn Transport>> {
        self.request_shutdown();
        let worker = self.worker.take().expect("joined only here");
        let t = worker.join().map_err(|_| Error::ShutDown)?;
        match t {
            Some(t) => Ok(t),
            None => Err(lock(&self.shared.queue)
                .fatal
                .clone()
                .unwrap_or(Error::ShutDown)),
        }
    }

    fn request_shutdown(&self) {
        lock(&self.shared.queue).shutdown = true;
        self.shared.wake.notify_one();
    }
}

impl Drop for Engine {
    /// Asks to shut down without waiting: the progress thread ends once every rank has asked
    /// (or the transport fails), so dropping never hangs.
    fn drop(&mut self) {
        if self.worker.is_some() {
            self.request_shutdown();
        }
    }
}

/// The operations submitted on this rank and not yet run: held by the worker (negotiated
/// or waiting for the other ranks), then still queued.
fn pending_names(w: &Worker, q: &Queue) -> Vec<String> {
    let mut names = w.pending_names();
    names.extend(q.subs.iter().map(|s| s.desc.name.clone()));
    names
}

/// What a submission goes to: its descriptor, its name as its handle holds it (shared, not
/// copied per submission), and its cache id when known at submission (registered tensors).
#[derive(Clone)]
struct Target {
    desc: Arc<Descriptor>,
    name: Arc<str>,
    id: Option<usize>,
}

impl Target {
    /// A target without a known cache id (found by name in the worker).
    fn new(desc: Arc<Descriptor>) -> Target {
        Target {
            name: desc.name.as_str().into(),
            desc,
            id: None,
        }
    }
}

fn adhoc(name: &str, op: OpKind, root: usize, len: usize, policy: &str) -> Arc<Descriptor> {
    Arc::new(Descriptor {
        name: name.to_string(),
        op,
        dtype: 0,
        root: root as u32,
        shape: vec![len as u64],
        policy: policy.to_string(),
    })
}

/// Every rank's registered descriptors must equal rank 0's, position by position.
fn check_registration(t: &mut dyn Transport, mine: &[Descriptor]) -> Result<()> {
    let mut buf = Vec::new();
    wire::encode_list(mine, &mut buf);
    let mut gathered = Vec::new();
    gradwire_collective::gather::all_gather_bytes(t, &buf, &mut gathered)?;
    let lists = gathered
        .iter()
        .enumerate()
        .map(|(r, b)| wire::decode_list(r, b))
        .collect::<Result<Vec<_>>>()?;
    let n = lists.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..n {
        let reference = lists[0].get(i);
        let mut bad = Vec::new();
        let mut first = None;
        for (r, l) in lists.iter().enumerate().skip(1) {
            let diff = match (reference, l.get(i)) {
                (Some(a), Some(b)) => a.diff(b),
                (Some(a), None) => Some(("name", a.name.clone(), "(no tensor)".to_string())),
                (None, Some(b)) => Some(("name", "(no tensor)".to_string(), b.name.clone())),
                (None, None) => None,
            };
            if let Some(d) = diff {
                bad.push(r);
                first.get_or_insert((r, d));
            }
        }
        if let Some((r, (field, a, b))) = first {
            let tensor = reference
                .map(|d| d.name.clone())
                .or_else(|| lists[r].get(i).map(|d| d.name.clone()))
                .unwrap_or_default();
            return Err(Error::Mismatch {
                tensor,
                field,
                reference: 0,
                ranks: bad,
                detail: format!("registered tensor #{i}: rank 0: {a}, rank {r}: {b}"),
            });
        }
    }
    Ok(())
}
