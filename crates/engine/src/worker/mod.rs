//! The progress thread: owns the transport and runs negotiation cycles (Horovod's
//! background loop) until every rank has asked to shut down or the transport fails.
//!
//! One cycle:
//! 1. wait until this rank has new submissions, or `cycle_time` has passed with tensors
//!    pending here; a rank with nothing pending sleeps (no rounds, no CPU) until it submits,
//!    shuts down, or the rare stall check is due ([`idle_check_period`]): the others need it
//!    in a round only to see which ranks are missing, since nothing can be ready before it
//!    submits too;
//! 2. **negotiate**: one all-gather of each rank's [`Message`](crate::wire): the bit-vector of
//!    its pending *cached* tensors (the response cache: a tensor seen before is named by its
//!    id, one bit), submit times of newly set bits, and full descriptors of tensors not yet
//!    cached. Every rank receives every message and computes the same decisions, so no rank-0
//!    round trip is needed: the AND of the bit-vectors is the ready set, the OR minus the AND
//!    is what the stall inspector watches, and a new tensor requested by all ranks is checked
//!    (name, op, dtype, shape, codec) the round the last rank asks for it, then cached under
//!    the next id (the same on every rank) or failed with [`Error::Mismatch`] on every rank;
//! 3. **execute** the ready tensors in id order, fused per kind ([`crate::fusion`]);
//! 4. end when every rank's message carried the shutdown flag.
//!
//! Latency on small models: a thread blocked in [`crate::Handle::wait`] runs the cycle
//! itself when the progress thread is not in one ([`Shared::drive`]; no hand-off to the
//! progress thread and back), and when the registered dense tensors are all submitted
//! together, their canonical reduce-scatter rides the negotiation round
//! ([`Worker::negotiate`]; one round fewer, the same bits): along recursive halving on
//! power-of-two worlds, by pairwise exchange on others, sent straight from and all-gathered
//! straight into the submissions' buffers.
//!
//! ## Design note: waiter-driven rounds and the grace period
//!
//! Who runs a round matters more than what it sends on small models: on a loaded host each
//! hand-off between threads (the submitter wakes the progress thread, the progress thread
//! wakes the waiter) waits for the scheduler, easily longer than the round itself. So:
//! - **Submitting wakes nobody.** A wake would let the progress thread preempt the submitter
//!   mid-burst and negotiate half of it.
//! - **The waiter runs the round.** [`crate::Handle::wait`] calls [`Shared::drive`], which
//!   `try_lock`s the worker and runs the cycle on the waiting thread: no hand-off either way.
//!   If the progress thread is inside a cycle, the waiter sleeps on its slot (bounded by one
//!   cycle) and retries, so at most one thread ever owns the transport.
//! - **The grace period** covers bursts nobody waits on yet (double buffering: submit, flush,
//!   then compute): [`crate::Engine::flush`] wakes the progress thread, which leaves the burst
//!   `gap` = an eighth of a cycle (20..200 µs; 125 µs at the default 1 ms) for a waiter to
//!   take it, then starts the round itself. When a waiter takes the burst first, the progress
//!   thread's timed wait finds the queue empty and goes back to sleep without touching the
//!   worker. Without a flush or a waiter, a burst starts within ten cycles. A caller that
//!   waits at once submits unflushed ([`crate::Engine::all_reduce_batch_unflushed`]: the
//!   trainer's synchronous step), so the progress thread is not woken at all.
//! - **Idle ranks sleep** ([`idle_check_period`]) instead of polling every cycle; they only
//!   matter to the others' stall inspector.
//!
//! Where LeNet's step time went, and what changed (`gradwire bench engine --np 4 --cases
//! lenet`, TCP, 4 processes on 2 cores, idle, 2026-12-02): the copies were the first cost. The
//! speculative round moved the batch about 5 times per step in user space (fuse, assemble
//! each send, copy each received part out, all-gather a fusion buffer, unfuse) against flat's
//! 2; it now moves a quarter of it (this rank's own part) and sends and receives the
//! tensors' own pieces (vectored). The second was the schedule: the pairwise exchange's
//! `P-1` steps, each coupling every rank, plus `log2 P` for the all-gather, against
//! Rabenseifner's `2 log2 P`; on power-of-two worlds the round now follows recursive
//! halving. Engine over flat went from 0.41-0.48x (`e8e5690`) to 0.76-0.90x (`a0cafbd`; idle,
//! interleaved, three rounds each). The engine of `2656060` dropped per-step bookkeeping: a
//! futex wake per completed handle (slots wake only sleepers), about 60 of 110 allocations (pending
//! submissions by cache id, buffers kept between rounds), a zeroing and a copy of the chunk:
//! 0.96-1.10x, with `a0cafbd`'s engine at 0.82-1.02x in the same runs; still not reliably at
//! or above flat. `01138f3` and `38ac0c7` removed most of the rest (handle slots reused,
//! vectors of slices kept, no clock reads without a timeline) and, the larger part, sum the
//! tree round's first step where the partner's part arrived instead of into a third buffer:
//! twelve idle rounds at a mean of 1.07x flat, `2c80c6e`'s engine at 0.97x in the same runs
//! (`docs/results/engine`).
//!
//! All-gather rather than the AND all-reduce Horovod uses: it costs `(P-1)` bit-vectors per
//! rank instead of `log2 P`, but gives each rank the others' submit times (stragglers) and
//! missing ranks (stalls) in the same round. "Now" for stall decisions is the largest clock
//! reading in the round's messages, so every rank warns and aborts in the same round.
//!
//! ## Layout
//!
//! This file holds the background thread's loop and what the rest of the crate uses: the
//! [`Shared`] queue and worker, [`Worker::new`] (which also picks the speculative batch),
//! [`Shared::drive`], [`Worker::run`] and one cycle ([`Worker::cycle`]). The cycle's parts
//! live beside it, one concept each:
//! - `strategy`: each registered tensor's state from its policy (strategy and codec
//!   dispatch), and the selection units;
//! - `cache`: the response cache (agreed descriptors, cache ids, uncached requests);
//! - `negotiate`: the negotiation round, with the speculative batch riding it;
//! - `pieces`: a batch of tensors seen as one element range (vectored pieces, carving,
//!   reused allocations);
//! - `execute`: running the ready tensors, fused, and recording their bytes, stragglers and
//!   timeline spans;
//! - `failure`: what fails operations: a failed cycle, the stall inspector, and tensors some
//!   ranks never submitted by shutdown;
//! - `snapshot`: saving and loading the tensors' states.
//!
//! [`Worker::cycle`] is longer than the project's 120-line guideline (about 135): it is one
//! round's sequence (encode this rank's message, negotiate, decode every rank's, update the
//! ready times and requests, pick the ready set, execute), each step feeding the next through
//! buffers kept on the worker; split, the steps would only pass those buffers along.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gradwire_codec::Progress;
use gradwire_transport::Transport;

use crate::config::{DenseAlgorithm, EngineConfig, Policy};
use crate::error::{Error, Result};
use crate::fusion::{Exec, Kind, TensorState};
use crate::handle::Slot;
use crate::pending::Pending;
use crate::stats::EngineStats;
use crate::timeline::{now_us, Span};
use crate::wire::{Descriptor, Message};

mod cache;
mod execute;
mod failure;
mod negotiate;
mod pieces;
mod snapshot;
mod strategy;

pub(crate) use cache::{registered_descriptor, ADHOC_POLICY};
use cache::{Adhoc, Entry};
use failure::fail;
use negotiate::SPEC_MAX_BYTES;
use pieces::Spares;
pub(crate) use snapshot::LoadMode;
pub(crate) use strategy::{selection_units, tensor_context};

/// One submitted operation, waiting in the queue or pending negotiation.
pub(crate) struct Submission {
    pub desc: Arc<Descriptor>,
    /// The tensor's cache id when known at submission (a registered tensor's), else found
    /// by name when the round takes it.
    pub id: Option<usize>,
    /// The dense data; for a pre-encoded submission, zeros of the tensor's length (the
    /// result's buffer).
    pub data: Vec<f32>,
    /// A pre-encoded submission's payload or pairs ([`crate::Engine::all_reduce_encoded`]),
    /// used in place of the engine's own encode of `data`.
    pub encoded: Option<crate::encoded::Encoded>,
    pub slot: Arc<Slot>,
    pub ready_us: u64,
    pub progress: Progress,
}

/// What the user side and the progress thread share.
pub(crate) struct Shared {
    pub queue: Mutex<Queue>,
    /// The worker, between cycles (`None` once it has exited).
    pub worker: Mutex<Option<Worker>>,
    /// [`EngineConfig::cycle_time`] (at least 50 µs).
    pub cycle: Duration,
    pub wake: Condvar,
    pub stats: Mutex<EngineStats>,
    pub spans: Mutex<Vec<Span>>,
    pub timeline: bool,
}

/// Submissions not yet picked up, and the engine's life state.
#[derive(Default)]
pub(crate) struct Queue {
    pub subs: Vec<Submission>,
    pub shutdown: bool,
    pub fatal: Option<Error>,
    pub exited: bool,
    pub progress: Progress,
    /// When the submitter said its burst is complete ([`crate::Engine::flush`]).
    pub flushed_at: Option<Instant>,
    /// When the first submission still queued arrived.
    pub burst_began: Option<Instant>,
    /// `slots[id]`: registered tensor `id`'s last slot, reused once nothing else holds it.
    slots: Vec<Option<Arc<Slot>>>,
}

impl Queue {
    /// A fresh slot for a submission of registered tensor `id`: the last one, emptied, when
    /// its handle and submission are both gone (no allocation per step), else a new one.
    pub(crate) fn slot(&mut self, id: usize) -> Arc<Slot> {
        if self.slots.len() <= id {
            self.slots.resize(id + 1, None);
        }
        match &self.slots[id] {
            // Only this table holds it, and only this table (under the queue's lock) hands
            // out clones: nobody can see it being emptied.
            Some(s) if Arc::strong_count(s) == 1 => {
                s.reset();
                s.clone()
            }
            _ => {
                let s = Arc::new(Slot::default());
                self.slots[id] = Some(s.clone());
                s
            }
        }
    }
}

/// Locks a mutex, ignoring poisoning (the progress thread never panics while holding one).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) struct Worker {
    t: Box<dyn Transport>,
    rank: usize,
    world: usize,
    shared: Arc<Shared>,
    cfg: EngineConfig,
    entries: Vec<Entry>,
    states: Vec<TensorState>,
    by_name: HashMap<String, usize>,
    /// `ready_at[id][rank]`: the rank's submit time of the pending instance, µs.
    ready_at: Vec<Vec<u64>>,
    pending: Pending,
    adhoc: Vec<Adhoc>,
    warned: HashSet<String>,
    exec: Exec,
    msg_buf: Vec<u8>,
    /// An empty submissions buffer with capacity, swapped with the queue's each round.
    subs_spare: Vec<Submission>,
    /// This rank's message, and every rank's decoded one: buffers kept between rounds.
    out_msg: Message,
    msgs: Vec<Message>,
    gathered: Vec<Vec<u8>>,
    rd_send: Vec<u8>,
    rd_recv: Vec<u8>,
    announced_shutdown: bool,
    /// The speculative batch (see [`Worker::negotiate`]): ids of the registered dense
    /// tensors, when they qualify; empty otherwise. The same on every rank.
    spec: Vec<usize>,
    /// This rank's part of its own chunk of the speculative batch.
    own_part: Vec<f32>,
    /// Peers' parts that arrived off a 4-byte boundary, copied out (`world * chunk` floats).
    spec_parts: Vec<f32>,
    /// The speculative round's receive buffer per peer (each part is summed where it lands).
    rd_recvs: Vec<Vec<u8>>,
    /// The tree round's partial sums (the half kept after its first step): in `tree_buf` at
    /// byte offset `acc_at` (the partner's part where it arrived, the own half added into
    /// it), or, when that part lay off a 4-byte boundary, in `tree_acc`.
    tree_acc: Vec<f32>,
    tree_buf: Vec<u8>,
    acc_at: Option<usize>,
    /// Rounds this rank has attached the current batch in.
    spec_tries: u32,
    /// When this rank last joined a round.
    last: Instant,
    /// The selection units (see [`selection_units`]): their tensors' ids, increasing. A
    /// unit runs only when all of its tensors are ready.
    units: Vec<Vec<usize>>,
    /// The round's ready ids and a group's submissions: buffers kept between rounds.
    ready_buf: Vec<usize>,
    group_subs: Vec<Submission>,
    /// Allocations of the speculative round's vectors of slices.
    spares: Spares,
    /// The registered tensors' policies (their states are rebuilt from them when a saved
    /// state is loaded, see [`snapshot`]).
    policies: Vec<Policy>,
}

impl Shared {
    /// The progress thread's wait (Horovod's cycle): until this rank has a burst of
    /// submissions to negotiate, a shutdown to announce, or `period` since `last`.
    ///
    /// Submitting does not wake this thread (on a loaded machine the woken thread preempts
    /// the submitter, which then misses its own burst): a thread that waits on a handle runs
    /// the round itself ([`Shared::drive`]); a flush wakes this thread, which leaves the
    /// burst a grace of `gap` (an eighth of a cycle, 20..200 µs) for such a waiter and then
    /// starts it; a burst neither flushed nor waited on is found within `look` (ten cycles)
    /// and started once the queue has been quiet for `gap`, or a cycle after it began.
    fn wait_for_work(&self, period: Duration, announced: bool, last: Instant) {
        let c = self.cycle;
        let gap = (c / 8).clamp(Duration::from_micros(20), Duration::from_micros(200));
        let look = c * 10;
        let mut q = lock(&self.queue);
        // The queue length seen last, and since when.
        let mut seen = (0usize, Instant::now());
        loop {
            if q.exited || (q.shutdown && !announced) {
                return;
            }
            let now = Instant::now();
            let queued = q.subs.len();
            if queued != seen.0 {
                seen = (queued, now);
            }
            let wait = if queued == 0 {
                let elapsed = last.elapsed();
                if elapsed >= period {
                    return; // the stall check, or a round with tensors pending here
                }
                period - elapsed
            } else {
                let deadline = match q.flushed_at {
                    Some(f) => f + gap,
                    None => (seen.1 + gap).min(q.burst_began.unwrap_or(now) + c),
                };
                if now >= deadline {
                    return;
                }
                deadline - now
            };
            q = self
                .wake
                .wait_timeout(q, wait.min(look))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Runs one cycle on the calling thread (one blocked in [`crate::Handle::wait`]) when
    /// the progress thread is not in one and there is something to negotiate (submissions
    /// queued, or tensors pending here and a cycle since the last round): the thread that
    /// needs the result runs the round, with no hand-off to the progress thread and back (on
    /// a loaded machine each hand-off waits for the scheduler). `false`: nothing run.
    pub(crate) fn drive(&self) -> bool {
        let Ok(mut g) = self.worker.try_lock() else {
            return false;
        };
        let Some(w) = g.as_mut() else {
            return false;
        };
        let mut subs = {
            let mut q = lock(&self.queue);
            let due = !w.pending.is_empty() && w.last.elapsed() >= w.idle_period();
            if q.shutdown || q.exited || (q.subs.is_empty() && !due) {
                return false;
            }
            q.flushed_at = None;
            q.burst_began = None;
            w.take_queued(&mut q)
        };
        w.last = Instant::now();
        // Not a shutdown announcement, so never the last round.
        match w.cycle(&mut subs, false) {
            Ok(_) => w.subs_spare = subs,
            Err(e) => fail(&mut g, e),
        }
        true
    }
}

/// How often a rank with nothing pending joins a round (for the others' stall inspector):
/// a quarter of the earlier of [`EngineConfig::stall_warning`] and
/// [`EngineConfig::stall_abort`], at least ten cycles, at most 1 s (also with neither set).
pub(crate) fn idle_check_period(cfg: &EngineConfig) -> Duration {
    let cycle = cfg.cycle_time.max(Duration::from_micros(50));
    let deadline = match (cfg.stall_warning, cfg.stall_abort) {
        (Some(w), Some(a)) => w.min(a),
        (Some(d), None) | (None, Some(d)) => d,
        (None, None) => Duration::MAX,
    };
    (deadline / 4).clamp(cycle * 10, Duration::from_secs(1).max(cycle * 10))
}

/// Now, µs, for the timeline's spans (`timeline`: the engine keeps one); 0 without one,
/// and no clock read.
fn stamp(timeline: bool) -> u64 {
    if timeline {
        now_us()
    } else {
        0
    }
}

impl Worker {
    pub(crate) fn new(
        t: Box<dyn Transport>,
        shared: Arc<Shared>,
        cfg: EngineConfig,
        policies: &[Policy],
        hosts: Option<crate::dense::HostLinks>,
    ) -> Worker {
        let (rank, world) = (t.rank(), t.world_size());
        let mut w = Worker {
            t,
            rank,
            world,
            shared,
            exec: Exec::new(cfg.collective, cfg.dense),
            cfg,
            entries: Vec::new(),
            states: Vec::new(),
            by_name: HashMap::new(),
            ready_at: Vec::new(),
            pending: Pending::default(),
            adhoc: Vec::new(),
            warned: HashSet::new(),
            msg_buf: Vec::new(),
            subs_spare: Vec::new(),
            out_msg: Message::default(),
            msgs: Vec::new(),
            gathered: Vec::new(),
            rd_send: Vec::new(),
            rd_recv: Vec::new(),
            announced_shutdown: false,
            spec: Vec::new(),
            own_part: Vec::new(),
            spec_parts: Vec::new(),
            rd_recvs: Vec::new(),
            tree_acc: Vec::new(),
            tree_buf: Vec::new(),
            acc_at: None,
            spec_tries: 0,
            last: Instant::now(),
            units: selection_units(policies),
            ready_buf: Vec::new(),
            group_subs: Vec::new(),
            spares: Spares::default(),
            policies: policies.to_vec(),
        };
        w.exec.hosts = hosts;
        for (i, p) in policies.iter().enumerate() {
            let state = match w.units.iter().position(|u| u.contains(&i)) {
                Some(u) => w.build_unit_state(u, i, policies),
                None => w.build_state(i, p),
            };
            let desc = registered_descriptor(p, &w.cfg);
            w.push_entry(desc, state);
        }
        // Speculation needs the flat canonical sum (the hypercube tree on power-of-two worlds,
        // which Tree also computes there, rank order on others: what the combined round
        // reproduces; not the hierarchical one, which sums by host), no momentum, and a batch
        // the normal path would fuse into one group anyway.
        let ids: Vec<usize> = (0..w.states.len())
            .filter(|&id| w.states[id].kind == Kind::Dense && w.states[id].velocity.is_none())
            .collect();
        let bytes: usize = ids.iter().map(|&id| 4 * w.entries[id].len).sum();
        if world > 1
            && w.exec.hosts.is_none()
            && (w.cfg.dense == DenseAlgorithm::Canonical
                || (w.cfg.dense == DenseAlgorithm::Tree && world.is_power_of_two()))
            && !ids.is_empty()
            && bytes <= w.cfg.fusion_bytes.min(SPEC_MAX_BYTES)
        {
            w.spec = ids;
        }
        w
    }

    /// The queued submissions, leaving the queue this worker's spare (emptied) buffer: the
    /// two swap every round instead of the queue growing a new one per burst.
    fn take_queued(&mut self, q: &mut Queue) -> Vec<Submission> {
        std::mem::replace(&mut q.subs, std::mem::take(&mut self.subs_spare))
    }

    /// The progress thread: runs cycles until shutdown or failure; gives the transport back
    /// after a clean shutdown (dropped after a failure, so that peers see this rank gone).
    ///
    /// The worker sits in `shared.worker` so that a thread blocked in [`crate::Handle::wait`]
    /// can run a cycle itself (see [`Shared::drive`]): this thread
    /// waits for work without holding it, then locks it and re-checks (someone may have run
    /// the cycle meanwhile).
    pub(crate) fn run(shared: Arc<Shared>) -> Option<Box<dyn Transport>> {
        loop {
            let (period, announced, last) = {
                let g = lock(&shared.worker);
                // None: failed in a cycle a waiting thread ran.
                let w = g.as_ref()?;
                (w.idle_period(), w.announced_shutdown, w.last)
            };
            shared.wait_for_work(period, announced, last);
            let mut g = lock(&shared.worker);
            let w = g.as_mut()?;
            let (mut subs, shutdown) = {
                let mut q = lock(&shared.queue);
                let due = w.last.elapsed() >= w.idle_period();
                let announce = q.shutdown && !w.announced_shutdown;
                if q.subs.is_empty() && !due && !announce {
                    continue; // a waiting thread ran the cycle
                }
                q.flushed_at = None;
                q.burst_began = None;
                w.announced_shutdown |= q.shutdown;
                (w.take_queued(&mut q), q.shutdown)
            };
            w.last = Instant::now();
            match w.cycle(&mut subs, shutdown) {
                Ok(true) => w.subs_spare = subs,
                Ok(false) => {
                    let w = g.take().expect("checked above");
                    let mut q = lock(&shared.queue);
                    q.exited = true;
                    for s in q.subs.drain(..) {
                        s.slot.complete(Err(Error::ShutDown));
                    }
                    drop(q);
                    return Some(w.t);
                }
                Err(e) => {
                    fail(&mut g, e);
                    return None;
                }
            }
        }
    }

    /// How long without submissions before this rank joins a round anyway: `cycle` with
    /// tensors pending here (they may become ready any moment); with nothing pending here,
    /// [`idle_check_period`] (a quarter of the stall deadline, within 10 cycles .. 1 s). An
    /// idle rank is only needed by the others for stall inspection: a tensor is ready only
    /// once every rank submitted it, and a submission of ours (or a shutdown) starts a round
    /// at once, so a rank that waits for us in a round loses nothing while we sleep.
    fn idle_period(&self) -> Duration {
        let cycle = self.cfg.cycle_time.max(Duration::from_micros(50));
        if self.pending.is_empty() {
            idle_check_period(&self.cfg)
        } else {
            cycle
        }
    }

    /// One negotiation round and the execution of what it found ready. `Ok(false)`: done.
    ///
    /// Longer than 120 lines on purpose: the round's steps (this rank's message, the
    /// all-gather, every rank's decoded message checked against the agreed descriptors, what
    /// is ready on every rank, shutdown) reuse the round's buffers in order, and read as
    /// Horovod's coordination cycle does, top to bottom.
    fn cycle(&mut self, subs: &mut Vec<Submission>, shutdown: bool) -> Result<bool> {
        // This round's message and the decoded ones reuse last round's buffers.
        let mut msg = std::mem::take(&mut self.out_msg);
        msg.shutdown = shutdown;
        msg.now_us = now_us();
        msg.new_ready.clear();
        msg.requests.clear();
        for sub in subs.drain(..) {
            // A registered tensor's submission carries its id and its descriptor is the
            // agreed one by construction; any other is looked up by name and compared.
            let id = match sub.id {
                Some(id) => Some(id),
                None => match self.by_name.get(&sub.desc.name) {
                    Some(&id) => {
                        if let Some((field, a, b)) = self.entries[id].desc.diff(&sub.desc) {
                            sub.slot.complete(Err(Error::Mismatch {
                                tensor: sub.desc.name.clone(),
                                field,
                                reference: self.rank,
                                ranks: vec![self.rank],
                                detail: format!("agreed: {a}, submitted here: {b}"),
                            }));
                            continue;
                        }
                        Some(id)
                    }
                    None => None,
                },
            };
            // A registered tensor's descriptor is the agreed one (the same registration).
            debug_assert!(sub.id.is_none_or(|id| self.entries[id].desc == *sub.desc));
            let already = match id {
                Some(id) => self.pending.has_id(id),
                None => self.pending.has_new(&sub.desc.name),
            };
            if already {
                sub.slot.complete(Err(Error::AlreadyPending {
                    tensor: sub.desc.name.clone(),
                }));
                continue;
            }
            match id {
                Some(id) => {
                    msg.new_ready.push((id as u32, sub.ready_us));
                    self.pending.insert_id(id, sub);
                }
                None => {
                    msg.requests.push((sub.ready_us, (*sub.desc).clone()));
                    self.pending.insert_new(sub);
                }
            }
        }
        msg.set_bits(self.entries.len(), self.pending.ids());
        msg.encode(&mut self.msg_buf);
        let before = self.t.bytes_sent();
        if msg
            .new_ready
            .iter()
            .any(|(id, _)| self.spec.binary_search(&(*id as usize)).is_ok())
        {
            self.spec_tries = 0;
        }
        let own_now = msg.now_us;
        self.out_msg = msg;
        let spec = self.negotiate()?;
        let spec_bytes = spec.as_ref().map_or(0, |d| d.bytes);
        let negotiated_us = stamp(self.shared.timeline);
        let mut msgs = std::mem::take(&mut self.msgs);
        msgs.resize_with(self.world, Message::default);
        for (r, (m, b)) in msgs.iter_mut().zip(&self.gathered).enumerate() {
            m.decode_into(r, b)?;
        }
        {
            let mut st = lock(&self.shared.stats);
            st.bytes.negotiation_bytes += self
                .t
                .bytes_sent()
                .saturating_sub(before)
                .saturating_sub(spec_bytes);
            st.cycles += 1;
            st.speculative_rounds += u64::from(spec.is_some());
        }
        let now = msgs.iter().map(|m| m.now_us).max().unwrap_or(own_now);
        let all_shutdown = msgs.iter().all(|m| m.shutdown);
        for (r, m) in msgs.iter().enumerate() {
            if m.nbits != self.entries.len() {
                return Err(Error::Protocol {
                    peer: r,
                    what: "response cache out of step with this rank's",
                });
            }
            for &(id, t) in &m.new_ready {
                let row = self.ready_at.get_mut(id as usize).ok_or(Error::Protocol {
                    peer: r,
                    what: "ready time for an unknown cache id",
                })?;
                row[r] = t;
            }
            for (t, d) in &m.requests {
                let i = match self.adhoc.iter().position(|a| a.name == d.name) {
                    Some(i) => i,
                    None => {
                        self.adhoc.push(Adhoc {
                            name: d.name.clone(),
                            by_rank: vec![None; self.world],
                        });
                        self.adhoc.len() - 1
                    }
                };
                self.adhoc[i].by_rank[r] = Some((*t, d.clone()));
            }
        }
        let mut ready = std::mem::take(&mut self.ready_buf);
        ready.clear();
        ready.extend((0..self.entries.len()).filter(|&id| msgs.iter().all(|m| m.bit(id))));
        self.complete_adhoc(&mut ready);
        self.inspect(&msgs, now)?;
        if let Some(done) = spec {
            // Every rank sent the batch, so every rank had all of it pending: it is ready.
            debug_assert!(self.spec.iter().all(|id| ready.contains(id)));
            ready.retain(|id| self.spec.binary_search(id).is_err());
            let group = std::mem::take(&mut self.spec);
            let res = self.run_group(&group, negotiated_us, Some(done));
            self.spec = group;
            res?;
        }
        self.execute(&ready, negotiated_us)?;
        self.ready_buf = ready;
        if all_shutdown {
            self.fail_unmatched(&msgs);
            return Ok(false);
        }
        self.msgs = msgs;
        Ok(true)
    }
}
