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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gradwire_codec::{BuildContext, CodecConfig, Progress, TensorInfo, TopKScope};
use gradwire_collective::compressed::{
    Leg, PowerSgdAllReduce, QuantizedAllReduce, StripeAllReduce,
};
use gradwire_transport::Transport;

use crate::config::{tensor_seed, DenseAlgorithm, EngineConfig, Policy, Strategy};
use crate::error::{Error, Result};
use crate::fusion::{plan_groups, Clock, Exec, Item, Kind, TensorState};
use crate::handle::Slot;
use crate::pending::Pending;
use crate::stats::{EngineStats, StallReport};
use crate::timeline::{now_us, Phase, Span};
use crate::wire::{Descriptor, Message, OpKind};

mod snapshot;

/// One submitted operation, waiting in the queue or pending negotiation.
pub(crate) struct Submission {
    pub desc: Arc<Descriptor>,
    /// The tensor's cache id when known at submission (a registered tensor's), else found
    /// by name when the round takes it.
    pub id: Option<usize>,
    pub data: Vec<f32>,
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

/// A cached tensor: the descriptor every rank agreed on.
struct Entry {
    desc: Descriptor,
    len: usize,
}

/// A tensor requested by some ranks and not cached yet (identical table on every rank).
struct Adhoc {
    name: String,
    by_rank: Vec<Option<(u64, Descriptor)>>,
}

/// The canonical policy string of a registered tensor (compared across ranks).
pub(crate) fn policy_string(p: &Policy, cfg: &EngineConfig) -> String {
    let mut s = format!("{}@{}", p.codec, p.strategy);
    // The role reaches the codecs (TernGrad's output layer, DGC's 1-D tensors): compared too.
    s.push_str(&format!(" role={:?}", p.tensor.role).to_ascii_lowercase());
    if let Some(m) = &cfg.momentum {
        s.push_str(&format!(
            "+momentum({},{},{})",
            m.beta, m.nesterov, m.masking
        ));
    }
    s
}

/// Descriptor of a registered tensor.
pub(crate) fn registered_descriptor(p: &Policy, cfg: &EngineConfig) -> Descriptor {
    Descriptor {
        name: p.tensor.name.clone(),
        op: OpKind::AllReduce,
        dtype: 0,
        root: 0,
        shape: p.tensor.shape.iter().map(|&d| d as u64).collect(),
        policy: policy_string(p, cfg),
    }
}

/// The shape of a quantized ring chunk `r` of tensor `t`, when it is whole rows of it (a
/// piece of a 1-D tensor is a 1-D tensor of the same role); `None` (element counts only)
/// when the chunk cuts through rows.
pub(crate) fn chunk_info(t: &TensorInfo, r: &std::ops::Range<usize>) -> Option<TensorInfo> {
    if r.is_empty() {
        return None;
    }
    if !t.is_matrix() {
        return Some(TensorInfo::new([r.len()], t.role));
    }
    let col = t.column_len();
    (r.start.is_multiple_of(col) && r.len().is_multiple_of(col)).then(|| t.rows(r.len() / col))
}

/// The policy string of an unregistered all-reduce (dense, no momentum).
pub(crate) const ADHOC_POLICY: &str = "none@dense";

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

/// The selection units of `policies`: the tensors of each global-scope top-k policy (same
/// codec and strategy, sparse all-reduce or gather) when it covers at least two tensors,
/// as registration indices, in order of first appearance. Aji & Heafield's one threshold
/// over the whole gradient: each unit has one codec whose layout is all of its tensors.
pub(crate) fn selection_units(policies: &[Policy]) -> Vec<Vec<usize>> {
    let mut units: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, p) in policies.iter().enumerate() {
        let global = matches!(&p.codec, CodecConfig::TopK(c) if c.scope == TopKScope::Global);
        if !global || !matches!(p.strategy, Strategy::Sparse | Strategy::Gather) {
            continue;
        }
        let key = format!("{}@{}", p.codec, p.strategy);
        match units.iter_mut().find(|(k, _)| *k == key) {
            Some((_, ids)) => ids.push(i),
            None => units.push((key, vec![i])),
        }
    }
    units
        .into_iter()
        .map(|(_, ids)| ids)
        .filter(|ids| ids.len() > 1)
        .collect()
}

/// A cycle failed: every queued and pending operation gets the error, the engine is marked
/// exited, and the worker (with the transport) is dropped so that peers see this rank gone.
fn fail(slot: &mut Option<Worker>, e: Error) {
    let Some(mut w) = slot.take() else {
        return;
    };
    tracing::error!(rank = w.rank, "engine failed: {e}");
    let mut q = lock(&w.shared.queue);
    q.exited = true;
    q.fatal = Some(e.clone());
    for s in q.subs.drain(..) {
        s.slot.complete(Err(e.clone()));
    }
    drop(q);
    for (_, s) in w.pending.drain() {
        s.slot.complete(Err(e.clone()));
    }
    w.shared.wake.notify_all();
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

/// Calls `f(tensor, range inside it)` for each piece of the batch's element range `r`
/// (the batch being `batch`'s tensors laid end to end), in order.
fn for_pieces(
    batch: &[&[f32]],
    r: std::ops::Range<usize>,
    mut f: impl FnMut(usize, std::ops::Range<usize>),
) {
    let mut off = 0;
    for (i, t) in batch.iter().enumerate() {
        let (lo, hi) = (r.start.max(off), r.end.min(off + t.len()));
        if lo < hi {
            f(i, lo - off..hi - off);
        }
        off += t.len();
        if off >= r.end {
            break;
        }
    }
}

/// Appends the bytes of the batch's element range `r` to `out`, one slice per tensor it
/// touches (a vectored send's pieces; nothing copied).
fn byte_pieces<'a>(batch: &[&'a [f32]], r: std::ops::Range<usize>, out: &mut Vec<&'a [u8]>) {
    for_pieces(batch, r, |i, p| {
        out.push(bytemuck::cast_slice(&batch[i][p]))
    });
}

/// Copies the batch's element range `r` into `out` (`r.len()` floats).
fn copy_range(batch: &[&[f32]], r: std::ops::Range<usize>, out: &mut [f32]) {
    let mut at = 0;
    for_pieces(batch, r, |i, p| {
        out[at..at + p.len()].copy_from_slice(&batch[i][p.clone()]);
        at += p.len();
    });
}

/// The speculative batch, reduced and all-gathered in the negotiation round.
pub(crate) struct SpecDone {
    /// Bytes this rank sent for it (its parts and the all-gather).
    bytes: u64,
    /// When the all-gather began and ended, µs.
    gather_us: (u64, u64),
}

/// The speculative batch's buffers as submitted (empty unless `attach`, which means the
/// whole batch is pending), in `spec` order: parts are sent straight from them (vectored),
/// nothing is fused before the round.
fn spec_batch<'a>(
    pending: &'a Pending,
    spec: &[usize],
    attach: bool,
    mut out: Vec<&'a [f32]>,
) -> Vec<&'a [f32]> {
    out.clear();
    if attach {
        out.extend(
            spec.iter()
                .map(|&id| pending.data(id).expect("the whole batch is pending")),
        );
    }
    out
}

/// The speculative batch's buffers (the pending submissions of `spec`'s ids, ascending),
/// mutable, in `spec` order (in `out`, a kept allocation); every one must be pending.
fn batch_mut<'a>(
    pending: &'a mut Pending,
    spec: &[usize],
    out: Vec<&'a mut [f32]>,
) -> Vec<&'a mut [f32]> {
    pending
        .data_mut(spec, out)
        .expect("the whole batch is pending")
}

/// Allocations of vectors of borrowed slices (`&[f32]`, `&mut [f32]`, `&[u8]`: all of one
/// size and alignment), kept empty between rounds so that a round allocates none of them.
#[derive(Default)]
pub(crate) struct Spares(Vec<Vec<&'static [u8]>>);

impl Spares {
    /// An empty vector (of slices, for the allocation to fit), on a kept allocation when
    /// there is one.
    fn take<U>(&mut self) -> Vec<U> {
        self.0.pop().map(recycle).unwrap_or_default()
    }

    /// Keeps `v`'s allocation (emptied) for a later [`Spares::take`].
    fn put<T>(&mut self, v: Vec<T>) {
        if v.capacity() > 0 {
            self.0.push(recycle(v));
        }
    }
}

/// `v` emptied, as a vector of another element type: the same allocation when the types
/// have the same size and alignment (the standard library collects in place), else a new,
/// empty vector.
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter()
        .map(|_| -> U { unreachable!("the vector is empty") })
        .collect()
}

/// The pieces of the batch's element ranges `a` and `b` (disjoint), one per tensor each
/// touches, in order: both mutable at once, carved out of the tensors' buffers.
fn carve<'a>(
    batch: &'a mut [&mut [f32]],
    a: std::ops::Range<usize>,
    b: std::ops::Range<usize>,
    spares: &mut Spares,
) -> (Vec<&'a mut [f32]>, Vec<&'a mut [f32]>) {
    debug_assert!(a.end <= b.start || b.end <= a.start || a.is_empty() || b.is_empty());
    let (mut pa, mut pb): (Vec<&mut [f32]>, Vec<&mut [f32]>) = (spares.take(), spares.take());
    let mut off = 0;
    for t in batch.iter_mut() {
        let end = off + t.len();
        let mut rest: &'a mut [f32] = t;
        let mut pos = off;
        let mut cuts = [a.start, a.end, b.start, b.end, end];
        cuts.sort_unstable();
        for c in cuts {
            if c <= pos || c > end {
                continue;
            }
            let (seg, tail) = std::mem::take(&mut rest).split_at_mut(c - pos);
            if a.contains(&pos) {
                pa.push(seg);
            } else if b.contains(&pos) {
                pb.push(seg);
            }
            rest = tail;
            pos = c;
        }
        off = end;
    }
    (pa, pb)
}

/// All-gathers the batch (`len` elements; chunk `r` owned by rank `r`, already reduced
/// there) in the tensors' own buffers: recursive doubling on power-of-two worlds (`log2 P`
/// exchanges), the ring otherwise (`P-1`), each exchange sent from and received into the
/// pieces of the tensors it touches. A copy, no arithmetic: any schedule gives the same
/// bits. Returns the bytes sent.
fn gather_in_place(
    t: &mut dyn Transport,
    batch: &mut [&mut [f32]],
    len: usize,
    spares: &mut Spares,
) -> Result<u64> {
    use gradwire_collective::chunks::span;
    let (rank, world) = (t.rank(), t.world_size());
    let mut sent = 0u64;
    let mut step = |t: &mut dyn Transport,
                    batch: &mut [&mut [f32]],
                    to: usize,
                    from: usize,
                    send: std::ops::Range<usize>,
                    recv: std::ops::Range<usize>|
     -> Result<()> {
        let (a, b) = carve(batch, send, recv, spares);
        // Same-sized elements: both collects reuse carve's allocations, which go back to
        // `spares` after.
        let out: Vec<&[u8]> = a
            .into_iter()
            .map(|p| &*bytemuck::cast_slice_mut::<f32, u8>(p))
            .collect();
        let mut into: Vec<&mut [u8]> = b.into_iter().map(bytemuck::cast_slice_mut).collect();
        sent += out.iter().map(|p| p.len() as u64).sum::<u64>();
        let res = t.send_recv_parts_into(to, &out, from, &mut into);
        spares.put(out);
        spares.put(into);
        res.map_err(gradwire_collective::Error::from)?;
        Ok(())
    };
    if world.is_power_of_two() {
        let mut d = 1;
        while d < world {
            let partner = rank ^ d;
            let (mine, theirs) = ((rank / d) * d, (partner / d) * d);
            let (send, recv) = (
                span(len, world, mine, mine + d),
                span(len, world, theirs, theirs + d),
            );
            step(t, batch, partner, partner, send, recv)?;
            d *= 2;
        }
    } else {
        let (to, from) = ((rank + 1) % world, (rank + world - 1) % world);
        for s in 0..world - 1 {
            let send = (rank + world - s) % world;
            let recv = (rank + world - s - 1) % world;
            let (send, recv) = (
                span(len, world, send, send + 1),
                span(len, world, recv, recv + 1),
            );
            step(t, batch, to, from, send, recv)?;
        }
    }
    Ok(sent)
}

/// The tree round's partial sums of elements `base + r`: in `buf` from byte `at` when
/// `at` is set, else in `acc` (see `Worker::tree_acc`).
fn acc_of<'a>(
    buf: &'a [u8],
    at: Option<usize>,
    acc: &'a [f32],
    r: std::ops::Range<usize>,
) -> &'a [f32] {
    match at {
        Some(at) => bytemuck::cast_slice(&buf[at + 4 * r.start..at + 4 * r.end]),
        None => &acc[r],
    }
}

/// [`acc_of`], mutable.
fn acc_of_mut<'a>(
    buf: &'a mut [u8],
    at: Option<usize>,
    acc: &'a mut [f32],
    r: std::ops::Range<usize>,
) -> &'a mut [f32] {
    match at {
        Some(at) => bytemuck::cast_slice_mut(&mut buf[at + 4 * r.start..at + 4 * r.end]),
        None => &mut acc[r],
    }
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

/// Makes `v` at least `n` long. Spare space for parts that arrive off a 4-byte boundary,
/// which the padding makes rare: sized once, not cut and zeroed again every step (its
/// length alternates between the tree round's steps).
fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// `bytes` (a peer's floats as they arrived) read as floats: in place when they start on a
/// 4-byte boundary, otherwise copied into `spare` (as many floats).
fn floats_in_place<'a>(bytes: &'a [u8], spare: &'a mut [f32]) -> &'a [f32] {
    match bytemuck::try_cast_slice(bytes) {
        Ok(f) => f,
        Err(_) => {
            bytemuck::cast_slice_mut::<f32, u8>(spare).copy_from_slice(bytes);
            spare
        }
    }
}

/// Rounds per submission of the speculative batch in which a rank attaches its parts: the
/// first (the one a rank that submitted early waits in) and one more (in case another
/// rank's stall check took that round); after that the batch goes the normal way, so a rank
/// waiting on a slow one does not resend it every cycle.
const SPEC_TRIES: u32 = 2;

/// The speculative batch's size limit: larger batches are bandwidth-bound, where saving a
/// round does not matter and a failed speculation would waste a real transfer.
const SPEC_MAX_BYTES: usize = 256 << 10;

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

    fn build_state(&self, index: usize, p: &Policy) -> TensorState {
        let len = p.tensor.len();
        let (rank, world) = (self.rank, self.world);
        let seed = tensor_seed(self.cfg.seed, index);
        let info = p.tensor.info();
        let ctx = BuildContext::new(seed, rank, world, vec![len]).with_tensors(vec![info.clone()]);
        let mut state = TensorState {
            kind: Kind::Dense,
            codec: None,
            quantized: None,
            stripe: None,
            powersgd: None,
            velocity: self.cfg.momentum.map(|_| vec![0.0; len]),
        };
        match p.strategy {
            Strategy::Dense | Strategy::Auto => {}
            Strategy::Gather => {
                state.kind = Kind::Gather;
                state.codec = Some(p.codec.build(&ctx));
            }
            Strategy::Sparse => {
                state.kind = Kind::Sparse;
                state.codec = Some(p.codec.build(&ctx));
            }
            Strategy::Stripe => {
                state.kind = Kind::Stripe;
                state.stripe = Some(StripeAllReduce::new(&p.codec, &ctx, len));
            }
            Strategy::PowerSgd => {
                let CodecConfig::PowerSgd(c) = &p.codec else {
                    unreachable!("plan() admits only the powersgd codec under powersgd")
                };
                state.kind = Kind::PowerSgd;
                state.powersgd = Some(PowerSgdAllReduce::new(c, &ctx, len));
            }
            Strategy::Quantized => {
                let codec = p.codec.clone();
                let q = QuantizedAllReduce::new(len, rank, world, |leg, chunk| {
                    let r = gradwire_collective::chunks::range(len, world, chunk);
                    let leg_no: u64 = match leg {
                        Leg::ReduceScatter => 0,
                        Leg::AllGather => 1,
                    };
                    let c = BuildContext::new(
                        seed ^ ((leg_no + 1) << 40) ^ ((chunk as u64) << 20),
                        rank,
                        world,
                        vec![r.len()],
                    );
                    codec.build(&match chunk_info(&info, &r) {
                        Some(t) => c.with_tensors(vec![t]),
                        None => c,
                    })
                });
                state.kind = Kind::Quantized;
                state.quantized = Some(q);
            }
        }
        state
    }

    /// The queued submissions, leaving the queue this worker's spare (emptied) buffer: the
    /// two swap every round instead of the queue growing a new one per burst.
    fn take_queued(&mut self, q: &mut Queue) -> Vec<Submission> {
        std::mem::replace(&mut q.subs, std::mem::take(&mut self.subs_spare))
    }

    /// The state of tensor `index`, a member of selection unit `unit`: its own velocity; the
    /// unit's first tensor also holds the unit's codec, built with that tensor's seed and the
    /// layout of every tensor of the unit (one top-k over their concatenation).
    fn build_unit_state(&self, unit: usize, index: usize, policies: &[Policy]) -> TensorState {
        let ids = &self.units[unit];
        let p = &policies[index];
        let codec = (ids[0] == index).then(|| {
            let layout = ids.iter().map(|&i| policies[i].tensor.len()).collect();
            let infos = ids.iter().map(|&i| policies[i].tensor.info()).collect();
            let seed = tensor_seed(self.cfg.seed, index);
            let ctx = BuildContext::new(seed, self.rank, self.world, layout).with_tensors(infos);
            p.codec.build(&ctx)
        });
        TensorState {
            kind: match p.strategy {
                Strategy::Sparse => Kind::SparseUnit(unit),
                _ => Kind::GatherUnit(unit),
            },
            codec,
            quantized: None,
            stripe: None,
            powersgd: None,
            velocity: self.cfg.momentum.map(|_| vec![0.0; p.tensor.len()]),
        }
    }

    fn push_entry(&mut self, desc: Descriptor, state: TensorState) -> usize {
        let id = self.entries.len();
        let len = desc.shape.iter().product::<u64>() as usize;
        self.by_name.insert(desc.name.clone(), id);
        self.entries.push(Entry { desc, len });
        self.states.push(state);
        self.ready_at.push(vec![0; self.world]);
        id
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

    /// The negotiation round: every rank's message reaches every rank (`self.gathered`).
    ///
    /// Steady state without a second round (the speculative batch): when the registered dense
    /// tensors qualify (`self.spec`, the same on every rank), the round is the canonical
    /// reduce-scatter's pairwise exchange (`P-1` steps, rank `r` sends to `r+s` and receives
    /// from `r-s`, so every rank hears from every other) and each message carries the
    /// negotiation message, plus, when this rank has the whole batch pending (in at most
    /// [`SPEC_TRIES`] rounds per submission: the round a rank that submitted early waits in
    /// until the last rank submits, and one more), its part of the fused batch for the
    /// receiver's chunk. If every rank sent its parts, every rank had the whole batch pending, so it is
    /// ready everywhere, and each owner sums its chunk in rank order exactly as
    /// [`crate::dense`] does: the result is bit for bit the normal path's, one negotiation
    /// round (`log2 P` steps on power-of-two worlds) earlier. Otherwise the parts are dropped
    /// (every rank sees the same flags) and the cycle goes on as usual. Without a speculative
    /// batch: the small all-gather of `rd_gather`.
    ///
    /// Copies: the parts go out straight from the submissions' buffers (one vectored send per
    /// step, header first: `wire::encode_exchange_header`), each peer's part is summed where
    /// it landed in that peer's receive buffer, and only this rank's own part is copied (into
    /// `own_part`); nothing is fused (the version of `e8e5690` fused the batch, assembled every
    /// send, copied each received part out, all-gathered the fusion buffer and unfused it:
    /// 5x the batch in copies per step, against 0.25x here, and flat's 2x).
    ///
    /// When the batch was reduced, every rank then all-gathers the chunks in place
    /// ([`gather_in_place`]): the submissions hold the results, and nothing is fused or
    /// unfused. Returns the bytes that took and when the all-gather ran.
    fn negotiate(&mut self) -> Result<Option<SpecDone>> {
        let (rank, world) = (self.rank, self.world);
        if self.spec.is_empty() {
            crate::rd_gather::all_gather_small(
                &mut *self.t,
                &self.msg_buf,
                &mut self.gathered,
                &mut self.rd_send,
                &mut self.rd_recv,
            )?;
            return Ok(None);
        }
        let attach =
            self.spec_tries < SPEC_TRIES && self.spec.iter().all(|&id| self.pending.has_id(id));
        self.spec_tries += u32::from(attach);
        let len: usize = self.spec.iter().map(|&id| self.entries[id].len).sum();
        self.gathered.resize_with(world, Vec::new);
        self.gathered[rank].clear();
        self.gathered[rank].extend_from_slice(&self.msg_buf);
        let reduced = if world.is_power_of_two() {
            self.speculate_tree(attach, len)?
        } else {
            self.speculate_pairwise(attach, len)?
        };
        let Some(part_bytes) = reduced else {
            return Ok(None);
        };
        // Then every chunk to every rank, received straight into the submissions.
        let mut outs = batch_mut(&mut self.pending, &self.spec, self.spares.take());
        let gather_start = stamp(self.shared.timeline);
        let gathered = gather_in_place(&mut *self.t, &mut outs, len, &mut self.spares);
        self.spares.put(outs);
        let gathered = gathered?;
        Ok(Some(SpecDone {
            bytes: part_bytes + gathered,
            gather_us: (gather_start, stamp(self.shared.timeline)),
        }))
    }

    /// The speculative round on worlds that are not a power of two: the pairwise exchange
    /// (`P-1` steps), each peer's part summed in rank order where it arrived. Returns the
    /// part bytes sent when every rank attached (this rank's chunk of the submissions then
    /// holds its mean), else `None` (the submissions untouched).
    fn speculate_pairwise(&mut self, attach: bool, len: usize) -> Result<Option<u64>> {
        let (rank, world) = (self.rank, self.world);
        let batch = spec_batch(&self.pending, &self.spec, attach, self.spares.take());
        let mine = gradwire_collective::chunks::range(len, world, rank);
        let m = mine.len();
        if attach {
            self.own_part.resize(m, 0.0); // every element overwritten here
            copy_range(&batch, mine.clone(), &mut self.own_part);
        }
        self.rd_recvs.resize_with(world, Vec::new);
        // Where each peer's part starts in its receive buffer.
        let mut part_at = vec![None; world];
        let mut part_bytes = 0u64;
        for s in 1..world {
            let (to, from) = ((rank + s) % world, (rank + world - s) % world);
            crate::wire::encode_exchange_header(&self.msg_buf, attach, &mut self.rd_send);
            let mut pieces: Vec<&[u8]> = vec![&self.rd_send];
            if attach {
                let r = gradwire_collective::chunks::range(len, world, to);
                part_bytes += 4 * r.len() as u64;
                byte_pieces(&batch, r, &mut pieces);
            }
            let recv = &mut self.rd_recvs[from];
            self.t
                .send_recv_parts(to, &pieces, from, recv)
                .map_err(gradwire_collective::Error::from)?;
            let (msg, part) = crate::wire::decode_exchange(from, recv, m)?;
            self.gathered[from].clear();
            self.gathered[from].extend_from_slice(msg);
            part_at[from] = part.map(|p| p.as_ptr() as usize - recv.as_ptr() as usize);
        }
        if !attach
            || part_at
                .iter()
                .enumerate()
                .any(|(r, p)| r != rank && p.is_none())
        {
            return Ok(None);
        }
        // Each peer's part is summed where it arrived (a part off a 4-byte boundary, which
        // the padding makes rare, is copied out first).
        grow(&mut self.spec_parts, world * m);
        let mut spare = self.spec_parts[..world * m].chunks_mut(m.max(1));
        let mut parts: Vec<&[f32]> = Vec::with_capacity(world);
        for (r, at) in part_at.iter().enumerate() {
            let sp: &mut [f32] = if m == 0 {
                &mut []
            } else {
                spare.next().expect("one spare chunk per rank")
            };
            parts.push(match *at {
                None => &self.own_part,
                Some(at) => floats_in_place(&self.rd_recvs[r][at..at + 4 * m], sp),
            });
        }
        // This rank's chunk: the rank-order mean written straight into the submissions.
        self.spares.put(batch);
        let mut outs = batch_mut(&mut self.pending, &self.spec, self.spares.take());
        let (own, _) = carve(&mut outs, mine, 0..0, &mut self.spares);
        let mut at = 0;
        for piece in own {
            let n = piece.len();
            let sub: Vec<&[f32]> = parts.iter().map(|p| &p[at..at + n]).collect();
            crate::dense::rank_order_mean(&sub, piece);
            at += n;
        }
        Ok(Some(part_bytes))
    }

    /// The speculative round on power-of-two worlds, along recursive halving: the hypercube
    /// tree of [`crate::dense`] (and of the collective layer's Rabenseifner), so the result
    /// is bit for bit the normal path's. At the step with partner distance `mask` (`P/2`
    /// down to 1) rank `r` and `r ^ mask` exchange every negotiation message each knows
    /// (`P / 2 mask` of them: the all-gather of messages rides the halving) and, while the
    /// sender and every rank it carries attached, its partial sums of the half the receiver
    /// keeps (`wire::encode_tree_header`). The first step sends straight from the
    /// submissions and writes `own + partner` over the partner's part where it arrived in
    /// the receive buffer, which then holds the partial sums of the kept half (`tree_buf`;
    /// `tree_acc` when the part lay off a 4-byte boundary); later steps send from and add
    /// into those, except the last (partner distance 1): it knows every flag, and when all
    /// attached it writes `(acc + partner) / P` (on two ranks `(own + partner) / P`) in one
    /// pass straight into this rank's chunk of the submissions. Returns the part bytes sent
    /// then, else `None` (the submissions untouched).
    ///
    /// Summing where the part arrived, rather than into a third buffer, is what brought the engine
    /// level with flat on LeNet (`38ac0c7`, `docs/results/engine`): the received part is warm from
    /// the socket copy, and the adder reads two streams and writes one it just read, as flat's
    /// in-place add does.
    fn speculate_tree(&mut self, attach: bool, len: usize) -> Result<Option<u64>> {
        use gradwire_collective::chunks::span;
        let (rank, world) = (self.rank, self.world);
        let batch = spec_batch(&self.pending, &self.spec, attach, self.spares.take());
        let mut all = attach;
        let mut part_bytes = 0u64;
        let (mut lo, mut hi) = (0, world);
        let mut mask = world / 2;
        // `tree_acc[i - base]`: partial sum of element `i` of the first step's kept half.
        let mut base = 0;
        let mut first = true;
        while mask > 0 {
            let partner = rank ^ mask;
            let mid = lo + mask;
            let (keep, give) = if rank & mask == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            let kr = span(len, world, keep.0, keep.1);
            let gr = span(len, world, give.0, give.1);
            // Before this step a rank knows the ranks that differ from it above `mask`.
            let known = |of: usize, r: usize| (r ^ of) & (2 * mask - 1) == 0;
            let gathered = &self.gathered;
            let carried = (0..world)
                .filter(|&r| known(rank, r))
                .map(|r| (r, &gathered[r][..]));
            crate::wire::encode_tree_header(carried, all, &mut self.rd_send);
            let mut pieces: Vec<&[u8]> = self.spares.take();
            pieces.push(&self.rd_send);
            if all {
                part_bytes += 4 * gr.len() as u64;
                if first {
                    byte_pieces(&batch, gr.clone(), &mut pieces);
                } else {
                    pieces.push(bytemuck::cast_slice(acc_of(
                        &self.tree_buf,
                        self.acc_at,
                        &self.tree_acc,
                        gr.start - base..gr.end - base,
                    )));
                }
            }
            let res = self
                .t
                .send_recv_parts(partner, &pieces, partner, &mut self.rd_recv);
            self.spares.put(pieces);
            res.map_err(gradwire_collective::Error::from)?;
            let step = crate::wire::decode_tree_exchange(
                partner,
                &self.rd_recv,
                world,
                world / (2 * mask),
                |r| known(partner, r),
                kr.len(),
            )?;
            for (r, m) in step.msgs {
                self.gathered[r].clear();
                self.gathered[r].extend_from_slice(m);
            }
            if mask == 1 {
                // The last step: `kr` is this rank's chunk. When every rank attached, the sum
                // goes straight into the submissions and is divided there: the additions and
                // the division of summing into `tree_acc` first, without the copy out of it.
                self.spares.put(batch);
                let Some(part) = step.part.filter(|_| all) else {
                    return Ok(None);
                };
                grow(&mut self.spec_parts, kr.len());
                let other = floats_in_place(part, &mut self.spec_parts[..kr.len()]);
                let mut outs = batch_mut(&mut self.pending, &self.spec, self.spares.take());
                let (mut own, rest) = carve(&mut outs, kr.clone(), 0..0, &mut self.spares);
                self.spares.put(rest);
                let mut at = 0;
                for piece in own.iter_mut() {
                    let (n, theirs) = (piece.len(), &other[at..at + piece.len()]);
                    // The sum and the division in one pass; `first`: own + theirs in place
                    // (a world of two: no partial sums yet).
                    let r = kr.start - base + at..kr.start - base + at + n;
                    let acc =
                        (!first).then(|| acc_of(&self.tree_buf, self.acc_at, &self.tree_acc, r));
                    crate::dense::add_divide_into(piece, acc, theirs, world);
                    at += n;
                }
                self.spares.put(own);
                self.spares.put(outs);
                return Ok(Some(part_bytes));
            }
            let got = step.part.is_some();
            if let (true, Some(part)) = (all, step.part) {
                let n = kr.len();
                if first && part.as_ptr().align_offset(4) == 0 {
                    // own + theirs written where theirs arrived (warm from the socket, so
                    // no third buffer is read or written); that buffer then holds the
                    // partial sums, and the next step receives into the other one.
                    base = kr.start;
                    let at = part.as_ptr() as usize - self.rd_recv.as_ptr() as usize;
                    let acc: &mut [f32] =
                        bytemuck::cast_slice_mut(&mut self.rd_recv[at..at + 4 * n]);
                    let mut k = 0;
                    for_pieces(&batch, kr.clone(), |i, p| {
                        let m = p.len();
                        crate::dense::add_before(&mut acc[k..k + m], &batch[i][p]);
                        k += m;
                    });
                    std::mem::swap(&mut self.rd_recv, &mut self.tree_buf);
                    self.acc_at = Some(at);
                } else if first {
                    // Off a 4-byte boundary (the padding makes it rare): into `tree_acc`.
                    base = kr.start;
                    grow(&mut self.spec_parts, n);
                    let other = floats_in_place(part, &mut self.spec_parts[..n]);
                    self.tree_acc.resize(n, 0.0); // every element written below
                    let acc = &mut self.tree_acc;
                    let mut k = 0;
                    for_pieces(&batch, kr.clone(), |i, p| {
                        let (own, m) = (&batch[i][p.clone()], p.len());
                        crate::dense::add_into(&mut acc[k..k + m], own, &other[k..k + m]);
                        k += m;
                    });
                    self.acc_at = None;
                } else {
                    grow(&mut self.spec_parts, n);
                    let other = floats_in_place(part, &mut self.spec_parts[..n]);
                    <f32 as gradwire_collective::Element>::reduce(
                        gradwire_collective::ReduceOp::Sum,
                        acc_of_mut(
                            &mut self.tree_buf,
                            self.acc_at,
                            &mut self.tree_acc,
                            kr.start - base..kr.end - base,
                        ),
                        other,
                    );
                }
            }
            all &= got;
            (lo, hi) = keep;
            mask /= 2;
            first = false;
        }
        // The last step (mask 1) returned; only a world of one gets here, and it never
        // speculates (nothing to exchange): the normal path then runs.
        Ok(None)
    }

    /// Checks and caches the uncached tensors every rank has now requested.
    fn complete_adhoc(&mut self, ready: &mut Vec<usize>) {
        let mut i = 0;
        while i < self.adhoc.len() {
            if self.adhoc[i].by_rank.iter().any(Option::is_none) {
                i += 1;
                continue;
            }
            let a = self.adhoc.remove(i);
            let entries: Vec<(u64, Descriptor)> = a.by_rank.into_iter().flatten().collect();
            let reference = &entries[0].1;
            let mut bad = Vec::new();
            let mut first = None;
            for (r, (_, d)) in entries.iter().enumerate().skip(1) {
                if let Some(diff) = reference.diff(d) {
                    bad.push(r);
                    first.get_or_insert((r, diff));
                }
            }
            if let Some((r, (field, a0, ar))) = first {
                let e = Error::Mismatch {
                    tensor: a.name.clone(),
                    field,
                    reference: 0,
                    ranks: bad,
                    detail: format!("rank 0: {a0}, rank {r}: {ar}"),
                };
                tracing::error!("{e}");
                if let Some(s) = self.pending.take_new(&a.name) {
                    s.slot.complete(Err(e));
                }
                continue;
            }
            let desc = reference.clone();
            let kind = match desc.op {
                OpKind::AllReduce => Kind::Dense,
                OpKind::AllGather => Kind::AllGather,
                OpKind::Broadcast => Kind::Broadcast(desc.root as usize),
                OpKind::Barrier => Kind::Barrier,
            };
            let id = self.push_entry(
                desc,
                TensorState {
                    kind,
                    codec: None,
                    quantized: None,
                    stripe: None,
                    powersgd: None,
                    velocity: None,
                },
            );
            for (r, (t, _)) in entries.iter().enumerate() {
                self.ready_at[id][r] = *t;
            }
            if let Some(s) = self.pending.take_new(&a.name) {
                self.pending.insert_id(id, s);
            }
            ready.push(id);
        }
    }

    /// The stall inspector: tensors some ranks submitted and others did not.
    fn inspect(&mut self, msgs: &[Message], now: u64) -> Result<()> {
        let mut stalls: Vec<(String, Vec<usize>, Vec<usize>, u64)> = Vec::new();
        for id in 0..self.entries.len() {
            let count = msgs.iter().filter(|m| m.bit(id)).count();
            if count == 0 || count == self.world {
                continue;
            }
            let have: Vec<usize> = (0..self.world).filter(|&r| msgs[r].bit(id)).collect();
            let first = have
                .iter()
                .map(|&r| self.ready_at[id][r])
                .min()
                .unwrap_or(now);
            let missing = (0..self.world).filter(|r| !have.contains(r)).collect();
            stalls.push((self.entries[id].desc.name.clone(), have, missing, first));
        }
        // A selection unit waits for all of its tensors: one nobody submitted holds back
        // those submitted everywhere (reported as missing on every rank, since the first of
        // those).
        for unit in &self.units {
            let count = |id: usize| msgs.iter().filter(|m| m.bit(id)).count();
            let first = unit
                .iter()
                .filter(|&&id| count(id) == self.world)
                .flat_map(|&id| self.ready_at[id].iter().copied())
                .min();
            let Some(first) = first else { continue };
            for &id in unit.iter().filter(|&&id| count(id) == 0) {
                let missing = (0..self.world).collect();
                stalls.push((self.entries[id].desc.name.clone(), vec![], missing, first));
            }
        }
        for a in &self.adhoc {
            let have: Vec<usize> = (0..self.world)
                .filter(|&r| a.by_rank[r].is_some())
                .collect();
            let first = a
                .by_rank
                .iter()
                .flatten()
                .map(|(t, _)| *t)
                .min()
                .unwrap_or(now);
            let missing = (0..self.world).filter(|r| !have.contains(r)).collect();
            stalls.push((a.name.clone(), have, missing, first));
        }
        for (tensor, ready_ranks, missing_ranks, first) in stalls {
            let waited = Duration::from_micros(now.saturating_sub(first));
            if let Some(abort) = self.cfg.stall_abort {
                if waited >= abort {
                    return Err(Error::Stalled {
                        tensor,
                        missing_ranks,
                        waited,
                    });
                }
            }
            if let Some(warn) = self.cfg.stall_warning {
                if waited >= warn && !self.warned.contains(&tensor) {
                    tracing::warn!(
                        tensor = %tensor,
                        ?missing_ranks,
                        ?ready_ranks,
                        "stall: tensor '{tensor}' submitted by ranks {ready_ranks:?} but not by \
                         ranks {missing_ranks:?} for {waited:?}"
                    );
                    self.warned.insert(tensor.clone());
                    lock(&self.shared.stats).stalls.push(StallReport {
                        tensor,
                        ready_ranks,
                        missing_ranks,
                        waited_ms: waited.as_millis() as u64,
                    });
                }
            }
        }
        Ok(())
    }

    /// Executes the ready tensors, fused, in id order. A selection unit runs once all of its
    /// tensors are ready; until then its ready ones stay pending (the ready set is the same
    /// on every rank, so every rank holds the same ones back).
    fn execute(&mut self, ready: &[usize], negotiated_us: u64) -> Result<()> {
        if ready.is_empty() {
            return Ok(());
        }
        // Which units are complete, looked up once per round (not per member: a unit can
        // hold every tensor of the model); nothing allocated without units.
        let unit_ready: Vec<bool> = if self.units.is_empty() {
            Vec::new()
        } else {
            let mut is_ready = vec![false; self.entries.len()];
            for &id in ready {
                is_ready[id] = true;
            }
            self.units
                .iter()
                .map(|u| u.iter().all(|&m| is_ready[m]))
                .collect()
        };
        let plan: Vec<(usize, Kind, usize)> = ready
            .iter()
            .filter(|&&id| match self.states[id].kind {
                Kind::SparseUnit(u) | Kind::GatherUnit(u) => unit_ready[u],
                _ => true,
            })
            .map(|&id| (id, self.states[id].kind, 4 * self.entries[id].len))
            .collect();
        for mut group in plan_groups(&plan, self.cfg.fusion_bytes) {
            group.sort_unstable();
            self.run_group(&group, negotiated_us, None)?;
        }
        Ok(())
    }

    /// Runs one group; `reduced`: the speculative batch's buffer, whose owned chunk the
    /// combined round has already reduced (only the all-gather is left), with the bytes that
    /// round sent for it.
    fn run_group(
        &mut self,
        group: &[usize],
        negotiated_us: u64,
        reduced: Option<SpecDone>,
    ) -> Result<()> {
        let timeline = self.shared.timeline;
        let start = stamp(timeline);
        // Last group's (emptied) buffer: no allocation per group.
        let mut subs = std::mem::take(&mut self.group_subs);
        subs.extend(group.iter().map(|&id| {
            if !self.warned.is_empty() {
                self.warned.remove(&self.entries[id].desc.name);
            }
            self.pending
                .take_id(id)
                .expect("ready tensors are pending here")
        }));
        let kind = self.states[group[0]].kind;
        let spec_sent = reduced.as_ref().map_or(0, |d| d.bytes);
        let mut clock = Clock::start(timeline);
        let before = self.t.bytes_sent() + self.exec.local_bytes_sent();
        let res = if let Some(done) = &reduced {
            // Reduced and gathered in the negotiation round, in the submissions' buffers.
            clock.span(Phase::Wire, done.gather_us.0, done.gather_us.1);
            Ok(())
        } else {
            let mut items: Vec<Item<'_>> = Vec::with_capacity(group.len());
            let mut subs_it = subs.iter_mut();
            for (id, state) in self.states.iter_mut().enumerate() {
                if group.binary_search(&id).is_ok() {
                    let s = subs_it.next().expect("one submission per id");
                    items.push(Item {
                        state,
                        data: &mut s.data,
                        progress: s.progress,
                    });
                }
            }
            self.exec.run(
                &mut *self.t,
                self.cfg.momentum.as_ref(),
                &mut items,
                &mut clock,
            )
        };
        let wire =
            (self.t.bytes_sent() + self.exec.local_bytes_sent()).saturating_sub(before) + spec_sent;
        if let Err(e) = res {
            for s in subs.drain(..) {
                s.slot.complete(Err(e.clone()));
            }
            self.group_subs = subs;
            return Err(e);
        }
        // Stragglers: per rank, the latest submit time among the group's tensors.
        let per_rank = (0..self.world).map(|r| {
            group
                .iter()
                .map(|&id| self.ready_at[id][r])
                .max()
                .unwrap_or(0)
        });
        let (mut last_rank, mut hi, mut lo) = (0, 0u64, u64::MAX);
        for (r, t) in per_rank.enumerate() {
            if t > hi {
                hi = t;
                last_rank = r;
            }
            lo = lo.min(t);
        }
        {
            let mut st = lock(&self.shared.stats);
            if matches!(kind, Kind::AllGather | Kind::Broadcast(_) | Kind::Barrier) {
                st.bytes.other_bytes += wire;
            } else {
                let raw: u64 = group
                    .iter()
                    .map(|&id| 4 * self.entries[id].len as u64)
                    .sum();
                st.add_step(subs[0].progress.step, raw, wire, group.len() as u64);
            }
            st.stragglers.record(
                self.world,
                &self.entries[group[0]].desc.name,
                group.len(),
                last_rank,
                hi.saturating_sub(lo),
            );
        }
        if timeline {
            let mut spans = lock(&self.shared.spans);
            for s in &subs {
                let tensor = &s.desc.name;
                let mut push = |phase, start_us, end_us| {
                    spans.push(Span {
                        tensor: tensor.clone(),
                        phase,
                        rank: self.rank,
                        start_us,
                        end_us,
                    })
                };
                push(Phase::Negotiate, s.ready_us, negotiated_us.max(s.ready_us));
                push(Phase::Queue, negotiated_us, start.max(negotiated_us));
                for &(phase, a, b) in &clock.spans {
                    push(phase, a, b);
                }
            }
        }
        for s in subs.drain(..) {
            s.slot.complete(Ok(s.data));
        }
        self.group_subs = subs;
        Ok(())
    }

    /// At shutdown: what some ranks submitted and others never did fails, naming them.
    fn fail_unmatched(&mut self, msgs: &[Message]) {
        for (id, s) in self.pending.drain() {
            let name = s.desc.name.clone();
            let missing = match id {
                Some(id) => (0..self.world).filter(|&r| !msgs[r].bit(id)).collect(),
                None => self
                    .adhoc
                    .iter()
                    .find(|a| a.name == name)
                    .map(|a| {
                        (0..self.world)
                            .filter(|&r| a.by_rank[r].is_none())
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            s.slot.complete(Err(Error::NotSubmittedEverywhere {
                tensor: name,
                missing_ranks: missing,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch's pieces for every range equal the same range of the tensors concatenated
    /// by hand, as bytes (what a vectored send puts on the wire) and as a copy.
    #[test]
    fn batch_ranges_equal_the_concatenation() {
        let tensors: Vec<Vec<f32>> = [5usize, 0, 1, 7, 3]
            .iter()
            .enumerate()
            .map(|(t, &n)| (0..n).map(|i| (t * 100 + i) as f32).collect())
            .collect();
        let batch: Vec<&[f32]> = tensors.iter().map(Vec::as_slice).collect();
        let mut whole = Vec::new();
        for t in &tensors {
            whole.extend_from_slice(t);
        }
        for lo in 0..=whole.len() {
            for hi in lo..=whole.len() {
                let mut pieces = Vec::new();
                byte_pieces(&batch, lo..hi, &mut pieces);
                assert!(pieces.iter().all(|p| !p.is_empty()), "{lo}..{hi}");
                let bytes: Vec<u8> = pieces.concat();
                assert_eq!(bytes, bytemuck::cast_slice::<f32, u8>(&whole[lo..hi]));
                let mut out = vec![f32::NAN; hi - lo];
                copy_range(&batch, lo..hi, &mut out);
                assert_eq!(out, whole[lo..hi]);
            }
        }
    }

    /// `carve` hands out exactly the elements of two disjoint ranges, mutable at once: every
    /// pair of disjoint ranges over a batch with an empty and a one-element tensor.
    #[test]
    fn carve_gives_exactly_both_ranges() {
        let lens = [4usize, 0, 1, 6, 3];
        let total: usize = lens.iter().sum();
        for a0 in 0..=total {
            for a1 in a0..=total {
                for b0 in 0..=total {
                    for b1 in b0..=total {
                        if !(a1 <= b0 || b1 <= a0) {
                            continue;
                        }
                        let mut tensors: Vec<Vec<f32>> =
                            lens.iter().map(|&n| vec![0.0; n]).collect();
                        let mut batch: Vec<&mut [f32]> =
                            tensors.iter_mut().map(Vec::as_mut_slice).collect();
                        let (pa, pb) = carve(&mut batch, a0..a1, b0..b1, &mut Spares::default());
                        assert!(pa.iter().chain(&pb).all(|p| !p.is_empty()));
                        for p in pa {
                            p.iter_mut().for_each(|x| *x += 1.0);
                        }
                        for p in pb {
                            p.iter_mut().for_each(|x| *x += 2.0);
                        }
                        let flat: Vec<f32> = tensors.concat();
                        for (i, x) in flat.iter().enumerate() {
                            let want = if (a0..a1).contains(&i) {
                                1.0
                            } else if (b0..b1).contains(&i) {
                                2.0
                            } else {
                                0.0
                            };
                            assert_eq!(*x, want, "a {a0}..{a1} b {b0}..{b1} at {i}");
                        }
                    }
                }
            }
        }
    }

    /// Floats read where they arrived, and copied out when they are off a 4-byte boundary.
    #[test]
    fn floats_in_place_and_off_boundary() {
        let want = [1.5f32, -0.25, 3.0e-7];
        let mut buf = [0u8; 4 + 12 + 4];
        let aligned = (4 - buf.as_ptr() as usize % 4) % 4;
        for (off, copied) in [(aligned, false), (aligned + 1, true), (aligned + 2, true)] {
            for (i, x) in want.iter().enumerate() {
                buf[off + 4 * i..off + 4 * i + 4].copy_from_slice(&x.to_ne_bytes());
            }
            let mut spare = [f32::NAN; 3];
            let got = floats_in_place(&buf[off..off + 12], &mut spare).to_vec();
            assert_eq!(got, want, "offset {off}");
            assert_eq!(
                spare == want,
                copied,
                "offset {off}: copied only when off a boundary"
            );
        }
    }
}
