//! Sandblaster L-BFGS (DistBelief, Dean et al. 2012): batch optimization driven by a
//! coordinator that never holds the parameters.
//!
//! - The parameters live in a PS table; the L-BFGS history (`s_i`, `y_i`), the gradient and
//!   the search direction live next to them on the shards as scratch vectors. The
//!   coordinator runs the two-loop recursion by sending small vector commands ([`VecOp`]:
//!   dot, axpy, scale) that every shard executes on its own slices; only partial dot
//!   products come back.
//! - A batch gradient is computed by worker threads, each with its own [`KvStore`], over
//!   *work units* much smaller than 1/N of the batch. A worker that finishes asks for the
//!   next unit, so fast workers do more (load balancing). Near the end of a pass, when no
//!   unit is left to hand out, idle workers get *backup copies* of units still running
//!   elsewhere; the first result for a unit wins, later ones are dropped, and a copy still
//!   running (the emulated per-unit delay) stops once its unit is done.
//! - Workers fetch the parameters once per pass. Unit results go to the coordinator, which
//!   writes the summed gradient into the shards' gradient slot (a simplification of
//!   DistBelief, where workers push gradients to the PS every few units).
//!
//! The line search is backtracking (Armijo, c = 1e-4): the step is applied on the shards
//! with an axpy, the next pass evaluates loss and gradient there, and a rejected step is
//! undone with the opposite axpy.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::spec::{ChunkId, Consistency, Key, TableSpec, WorkerId};
use crate::updater::UpdaterSpec;
use crate::wire::{Request, Response, VecOp};
use crate::{ClientConfig, Error, KvStore, Result, Role};

mod mlp;
pub use mlp::Mlp;

/// A batch objective split into work units.
pub trait Objective: Send + Sync {
    /// Number of parameters.
    fn dim(&self) -> usize;
    /// Number of work units.
    fn units(&self) -> usize;
    /// Number of examples (the loss is the mean over them plus the regularizer).
    fn examples(&self) -> usize;
    /// L2 regularization strength λ (the loss adds λ/2·|w|²).
    fn l2(&self) -> f64;
    /// Adds unit `u`'s summed example gradients at `w` into `grad` and returns its summed
    /// example loss.
    fn unit_loss_grad(&self, u: usize, w: &[f32], grad: &mut [f64]) -> f64;

    /// The full-batch loss at `w`, regularizer included (a reference, computed locally).
    fn loss(&self, w: &[f32]) -> f64 {
        let mut g = vec![0.0; self.dim()];
        let s: f64 = (0..self.units())
            .map(|u| self.unit_loss_grad(u, w, &mut g))
            .sum();
        s / self.examples() as f64
            + 0.5 * self.l2() * w.iter().map(|v| (*v as f64).powi(2)).sum::<f64>()
    }
}

/// Binary logistic regression on synthetic data (labels from a hidden weight vector, with
/// 5% of them flipped).
#[derive(Debug, Clone)]
pub struct LogisticRegression {
    x: Vec<f32>,
    y: Vec<f32>,
    dim: usize,
    unit_size: usize,
    l2: f64,
}

impl LogisticRegression {
    /// `n` examples of `dim` features, units of `unit_size` examples, seeded.
    pub fn synthetic(n: usize, dim: usize, unit_size: usize, l2: f64, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let truth: Vec<f32> = (0..dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let mut x = Vec::with_capacity(n * dim);
        let mut y = Vec::with_capacity(n);
        for _ in 0..n {
            let row: Vec<f32> = (0..dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let z: f32 = row.iter().zip(&truth).map(|(a, b)| a * b).sum();
            let mut label = if z >= 0.0 { 1.0 } else { -1.0 };
            if rng.gen_bool(0.05) {
                label = -label;
            }
            x.extend_from_slice(&row);
            y.push(label);
        }
        LogisticRegression {
            x,
            y,
            dim,
            unit_size: unit_size.max(1),
            l2,
        }
    }
}

impl Objective for LogisticRegression {
    fn dim(&self) -> usize {
        self.dim
    }
    fn units(&self) -> usize {
        self.y.len().div_ceil(self.unit_size)
    }
    fn examples(&self) -> usize {
        self.y.len()
    }
    fn l2(&self) -> f64 {
        self.l2
    }
    fn unit_loss_grad(&self, u: usize, w: &[f32], grad: &mut [f64]) -> f64 {
        let lo = u * self.unit_size;
        let hi = (lo + self.unit_size).min(self.y.len());
        let mut loss = 0.0;
        for i in lo..hi {
            let row = &self.x[i * self.dim..(i + 1) * self.dim];
            let m = self.y[i] as f64
                * row
                    .iter()
                    .zip(w)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>();
            // log(1 + exp(-m)), stably.
            loss += if m > 0.0 {
                (-m).exp().ln_1p()
            } else {
                -m + m.exp().ln_1p()
            };
            let coef = -self.y[i] as f64 / (1.0 + m.exp());
            for (g, a) in grad.iter_mut().zip(row) {
                *g += coef * *a as f64;
            }
        }
        loss
    }
}

/// Settings of a Sandblaster run.
#[derive(Debug, Clone)]
pub struct SandblasterConfig {
    /// L-BFGS iterations (accepted steps).
    pub iterations: usize,
    /// History length m.
    pub history: usize,
    /// Hand out backup copies of running units when no fresh unit is left.
    pub backups: bool,
    /// Most copies of one unit running at once (original included).
    pub max_copies: usize,
    /// Extra time each worker spends per unit (emulates slower machines; index = worker).
    pub unit_delay: Vec<Duration>,
    /// Parameter table key.
    pub key: Key,
    /// Chunk size of the parameter table (small, to spread it over shards).
    pub chunk_elems: usize,
}

impl Default for SandblasterConfig {
    fn default() -> Self {
        SandblasterConfig {
            iterations: 10,
            history: 5,
            backups: true,
            max_copies: 2,
            unit_delay: Vec::new(),
            key: Key(1),
            chunk_elems: 1 << 16,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Loss after each accepted step (index 0: at the start).
    pub losses: Vec<f64>,
    /// Gradient passes made.
    pub passes: usize,
    /// Units computed in all (backups and losers included).
    pub units_run: usize,
    /// Backup copies handed out.
    pub backups_issued: usize,
    /// Units whose first result came from a backup copy.
    pub backups_won: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// The final parameters.
    pub params: Vec<f32>,
    /// Frame bytes written and read by the coordinator and the workers together.
    pub bytes: (u64, u64),
    /// Wall time in gradient passes (handing out units until the last result is in, and
    /// writing the gradient to the shards); the rest is the coordinator's vector ops.
    pub pass_time: Duration,
}

/// What the observer of [`run_observed`] sees after each accepted L-BFGS step.
pub struct Progress<'a> {
    /// Accepted steps so far (1 after the first).
    pub iteration: usize,
    /// The full-batch loss after this step.
    pub loss: f64,
    /// Gradient passes made so far (line-search trials included).
    pub passes: usize,
    /// Units computed so far (backups and losers included).
    pub units_run: usize,
    /// Backup copies handed out so far.
    pub backups_issued: usize,
    /// Units whose first result came from a backup copy, so far.
    pub backups_won: usize,
    /// Frame bytes written and read so far by the coordinator and the workers (the
    /// workers' as of their last parameter fetch).
    pub bytes: (u64, u64),
    /// Wall time in gradient passes so far (see [`Report::pass_time`]).
    pub pass_time: Duration,
    coord: &'a mut Coordinator,
    dim: usize,
}

impl Progress<'_> {
    /// Fetches the current parameters from the shards (one pull, counted in later
    /// [`Progress::bytes`]).
    pub fn params(&mut self) -> Result<Vec<f32>> {
        let mut w = vec![0.0; self.dim];
        let key = self.coord.key;
        self.coord.kv.pull(key, &mut w)?;
        Ok(w)
    }
}

struct Pass {
    id: u64,
    pending: VecDeque<usize>,
    running: BTreeMap<usize, Vec<usize>>,
    done: Vec<bool>,
    remaining: usize,
    loss: f64,
    grad: Vec<f64>,
}

#[derive(Default)]
struct SchedState {
    pass: Option<Pass>,
    pass_id: u64,
    shutdown: bool,
    units_run: usize,
    backups_issued: usize,
    backups_won: usize,
    /// Each worker's frame bytes (written, read) as of its last fetch.
    worker_bytes: Vec<(u64, u64)>,
}

impl SchedState {
    fn worker_bytes(&self) -> (u64, u64) {
        self.worker_bytes
            .iter()
            .fold((0, 0), |(a, b), (w, r)| (a + w, b + r))
    }
}

/// Hands out work units (and backups), keeps the first result per unit.
struct Scheduler {
    st: Mutex<SchedState>,
    cv: Condvar,
    backups: bool,
    max_copies: usize,
}

impl Scheduler {
    fn lock(&self) -> std::sync::MutexGuard<'_, SchedState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a pass newer than `seen`; `None` at shutdown.
    fn wait_pass(&self, seen: u64) -> Option<u64> {
        let mut st = self.lock();
        loop {
            if st.shutdown {
                return None;
            }
            if st.pass_id > seen && st.pass.is_some() {
                return Some(st.pass_id);
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The next unit for `worker` in pass `id`, or `None` when the pass is over for it.
    fn next(&self, worker: usize, id: u64) -> Option<usize> {
        let mut st = self.lock();
        loop {
            let backups = self.backups;
            let max = self.max_copies;
            let p = st.pass.as_mut().filter(|p| p.id == id)?;
            if p.remaining == 0 {
                return None;
            }
            if let Some(u) = p.pending.pop_front() {
                p.running.insert(u, vec![worker]);
                return Some(u);
            }
            if backups {
                let pick = p
                    .running
                    .iter_mut()
                    .find(|(u, ws)| !p.done[**u] && ws.len() < max && !ws.contains(&worker));
                if let Some((u, ws)) = pick {
                    ws.push(worker);
                    let u = *u;
                    st.backups_issued += 1;
                    return Some(u);
                }
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Whether unit `u` of pass `id` already has a result (or the pass is over): a copy
    /// still running may stop.
    fn is_done(&self, id: u64, u: usize) -> bool {
        let st = self.lock();
        st.pass
            .as_ref()
            .filter(|p| p.id == id)
            .is_none_or(|p| p.done[u])
    }

    fn complete(&self, id: u64, u: usize, worker: usize, loss: f64, grad: &[f64]) {
        let mut st = self.lock();
        st.units_run += 1;
        let Some(p) = st.pass.as_mut().filter(|p| p.id == id) else {
            return;
        };
        if p.done[u] {
            return; // a copy already won
        }
        p.done[u] = true;
        p.remaining -= 1;
        p.loss += loss;
        for (a, g) in p.grad.iter_mut().zip(grad) {
            *a += g;
        }
        let first = p.running.remove(&u).and_then(|ws| ws.first().copied());
        if first != Some(worker) {
            st.backups_won += 1;
        }
        self.cv.notify_all();
    }
}

// Scratch slots live in the table's own namespace: (key + 1) << 32 | n.
fn scratch(key: Key, n: u64) -> u64 {
    ((key.0 + 1) << 32) | n
}
const G: u64 = 1;
const GOLD: u64 = 2;
const D: u64 = 3;
const Q: u64 = 4;
fn s_slot(i: usize) -> u64 {
    16 + i as u64
}
fn y_slot(i: usize) -> u64 {
    1024 + i as u64
}
/// The slot of the parameter table itself.
const W: u64 = u64::MAX;

/// The coordinator's handle on the shards: vector ops by slot.
struct Coordinator {
    kv: KvStore,
    key: Key,
}

impl Coordinator {
    fn slot(&self, n: u64) -> u64 {
        if n == W {
            self.key.0
        } else {
            scratch(self.key, n)
        }
    }

    fn op(&mut self, op: VecOp) -> Result<f64> {
        let op = match op {
            VecOp::Dot { a, b } => VecOp::Dot {
                a: self.slot(a),
                b: self.slot(b),
            },
            VecOp::Axpy { a, b, c, alpha } => VecOp::Axpy {
                a: self.slot(a),
                b: self.slot(b),
                c: self.slot(c),
                alpha,
            },
            VecOp::Scale { a, c, alpha } => VecOp::Scale {
                a: self.slot(a),
                c: self.slot(c),
                alpha,
            },
        };
        let mut sum = 0.0;
        for s in 0..self.kv.num_shards() {
            match self.kv.call(s, &Request::VecOp(op))? {
                Response::Ok { value } => {
                    if matches!(op, VecOp::Dot { .. }) {
                        sum += f64::from_bits(value);
                    }
                }
                other => {
                    return Err(Error::Remote {
                        shard: s,
                        code: crate::ErrorCode::InvalidArgument,
                        worker: None,
                        message: format!("unexpected reply to a vector op: {other:?}"),
                    })
                }
            }
        }
        Ok(sum)
    }
    fn dot(&mut self, a: u64, b: u64) -> Result<f64> {
        self.op(VecOp::Dot { a, b })
    }
    fn axpy(&mut self, a: u64, b: u64, c: u64, alpha: f64) -> Result<()> {
        self.op(VecOp::Axpy {
            a,
            b,
            c,
            alpha: alpha as f32,
        })
        .map(|_| ())
    }
    fn scale(&mut self, a: u64, c: u64, alpha: f64) -> Result<()> {
        self.op(VecOp::Scale {
            a,
            c,
            alpha: alpha as f32,
        })
        .map(|_| ())
    }
    fn set(&mut self, slot: u64, v: &[f32]) -> Result<()> {
        let places = self
            .kv
            .chunks(self.key)
            .ok_or(Error::UnknownKey(self.key.0))?
            .to_vec();
        for p in places {
            let req = Request::SetVec {
                slot: scratch(self.key, slot),
                chunk: ChunkId {
                    key: self.key,
                    index: p.index,
                },
                values: v[p.start..p.start + p.len].to_vec(),
            };
            self.kv.call(p.shard, &req)?;
        }
        Ok(())
    }
}

/// Runs Sandblaster L-BFGS on `objective` from `w0`, with `workers` worker threads, against
/// PS shards at `shards` (configured for at least `workers + 1` workers: the coordinator
/// is worker `workers`).
pub fn run(
    shards: Vec<SocketAddr>,
    objective: Arc<dyn Objective>,
    w0: &[f32],
    workers: usize,
    cfg: &SandblasterConfig,
) -> Result<Report> {
    run_observed(shards, objective, w0, workers, cfg, &mut |_| true)
}

/// [`run`], calling `observe` after each accepted L-BFGS step; the run stops early (with
/// the report so far) when it returns `false`.
pub fn run_observed(
    shards: Vec<SocketAddr>,
    objective: Arc<dyn Objective>,
    w0: &[f32],
    workers: usize,
    cfg: &SandblasterConfig,
    observe: &mut dyn FnMut(&mut Progress<'_>) -> bool,
) -> Result<Report> {
    let t0 = Instant::now();
    // The coordinator (worker id `workers`) creates the table and runs the vector ops; the
    // worker threads only read it.
    let client = |w: usize| {
        let mut c = ClientConfig::new(WorkerId(w as u32), shards.clone());
        c.chunk_elems = cfg.chunk_elems;
        c.role = if w == workers {
            Role::Coordinator
        } else {
            Role::Worker
        };
        c
    };
    let spec = TableSpec::new(Consistency::Async, UpdaterSpec::Sum);
    let mut coord = Coordinator {
        kv: KvStore::connect(client(workers))?,
        key: cfg.key,
    };
    coord.kv.init(cfg.key, spec.clone(), w0)?;
    let sched = Arc::new(Scheduler {
        st: Mutex::new(SchedState {
            worker_bytes: vec![(0, 0); workers],
            ..SchedState::default()
        }),
        cv: Condvar::new(),
        backups: cfg.backups,
        max_copies: cfg.max_copies.max(1),
    });
    let dim = objective.dim();
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let (sched, obj, spec) = (sched.clone(), objective.clone(), spec.clone());
            let delay = cfg.unit_delay.get(w).copied().unwrap_or_default();
            let mut kv_cfg = client(w);
            kv_cfg.heartbeat = None;
            let (key, w0) = (cfg.key, w0.to_vec());
            std::thread::spawn(move || -> Result<()> {
                let mut kv = KvStore::connect(kv_cfg)?;
                kv.init(key, spec, &w0)?;
                let mut params = vec![0.0f32; dim];
                let mut grad = vec![0.0f64; dim];
                let mut seen = 0;
                while let Some(id) = sched.wait_pass(seen) {
                    seen = id;
                    kv.pull(key, &mut params)?;
                    sched.lock().worker_bytes[w] = kv.bytes();
                    while let Some(u) = sched.next(w, id) {
                        grad.iter_mut().for_each(|g| *g = 0.0);
                        let loss = obj.unit_loss_grad(u, &params, &mut grad);
                        // The emulated extra compute, in slices: a copy whose unit another
                        // worker already finished is cancelled (first finisher wins).
                        let until = Instant::now() + delay;
                        let mut cancelled = false;
                        while Instant::now() < until {
                            if sched.is_done(id, u) {
                                cancelled = true;
                                break;
                            }
                            let left = until.saturating_duration_since(Instant::now());
                            std::thread::sleep(left.min(Duration::from_millis(1)));
                        }
                        if !cancelled {
                            sched.complete(id, u, w, loss, &grad);
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    let result = lbfgs(&mut coord, &sched, objective.as_ref(), cfg, dim, observe);
    {
        let mut st = sched.lock();
        st.shutdown = true;
        sched.cv.notify_all();
    }
    for h in handles {
        h.join().expect("worker thread does not panic")?;
    }
    let mut report = result?;
    let st = sched.lock();
    report.units_run = st.units_run;
    report.backups_issued = st.backups_issued;
    report.backups_won = st.backups_won;
    report.elapsed = t0.elapsed();
    let workers_bytes = st.worker_bytes();
    let mut params = vec![0.0; dim];
    drop(st);
    coord.kv.pull(cfg.key, &mut params)?;
    report.params = params;
    let (w, r) = coord.kv.bytes();
    report.bytes = (w + workers_bytes.0, r + workers_bytes.1);
    Ok(report)
}

/// One distributed pass: loss at the shards' parameters; the gradient lands in slot G.
fn pass(
    coord: &mut Coordinator,
    sched: &Scheduler,
    obj: &dyn Objective,
    dim: usize,
    report: &mut Report,
) -> Result<f64> {
    let units = obj.units();
    let t0 = Instant::now();
    {
        let mut st = sched.lock();
        st.pass_id += 1;
        let id = st.pass_id;
        st.pass = Some(Pass {
            id,
            pending: (0..units).collect(),
            running: BTreeMap::new(),
            done: vec![false; units],
            remaining: units,
            loss: 0.0,
            grad: vec![0.0; dim],
        });
        sched.cv.notify_all();
    }
    let (loss, grad) = {
        let mut st = sched.lock();
        while st.pass.as_ref().is_some_and(|p| p.remaining > 0) {
            st = sched.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        let p = st.pass.take().expect("pass in progress");
        (p.loss, p.grad)
    };
    report.passes += 1;
    let n = obj.examples() as f64;
    let g: Vec<f32> = grad.iter().map(|g| (g / n) as f32).collect();
    coord.set(G, &g)?;
    let l2 = obj.l2();
    let ww = coord.dot(W, W)?;
    if l2 != 0.0 {
        coord.axpy(G, W, G, l2)?;
    }
    report.pass_time += t0.elapsed();
    Ok(loss / n + 0.5 * l2 * ww)
}

fn lbfgs(
    coord: &mut Coordinator,
    sched: &Scheduler,
    obj: &dyn Objective,
    cfg: &SandblasterConfig,
    dim: usize,
    observe: &mut dyn FnMut(&mut Progress<'_>) -> bool,
) -> Result<Report> {
    let mut report = Report::default();
    let m = cfg.history.max(1);
    let mut hist: VecDeque<(usize, f64)> = VecDeque::new();
    let mut f = pass(coord, sched, obj, dim, &mut report)?;
    report.losses.push(f);
    for it in 0..cfg.iterations {
        // Two-loop recursion on the shards: Q = H·G.
        coord.scale(G, Q, 1.0)?;
        let mut alphas = Vec::with_capacity(hist.len());
        for &(i, rho) in hist.iter().rev() {
            let a = rho * coord.dot(s_slot(i), Q)?;
            coord.axpy(Q, y_slot(i), Q, -a)?;
            alphas.push(a);
        }
        let gamma = match hist.back() {
            Some(&(i, _)) => coord.dot(s_slot(i), y_slot(i))? / coord.dot(y_slot(i), y_slot(i))?,
            None => 1.0 / coord.dot(G, G)?.sqrt().max(1e-12),
        };
        coord.scale(Q, Q, gamma)?;
        for (&(i, rho), a) in hist.iter().zip(alphas.iter().rev()) {
            let b = rho * coord.dot(y_slot(i), Q)?;
            coord.axpy(Q, s_slot(i), Q, a - b)?;
        }
        coord.scale(Q, D, -1.0)?;
        let mut gd = coord.dot(G, D)?;
        if gd >= 0.0 {
            hist.clear();
            coord.scale(G, D, -1.0)?;
            gd = coord.dot(G, D)?;
        }
        // Backtracking line search (the pass at the trial point also gives its gradient).
        coord.scale(G, GOLD, 1.0)?;
        let mut t = 1.0;
        let mut f_new;
        let mut tries = 0;
        loop {
            coord.axpy(W, D, W, t)?;
            f_new = pass(coord, sched, obj, dim, &mut report)?;
            tries += 1;
            if f_new <= f + 1e-4 * t * gd || tries >= 20 {
                break;
            }
            coord.axpy(W, D, W, -t)?;
            t *= 0.5;
        }
        let idx = it % m;
        hist.retain(|(i, _)| *i != idx);
        coord.scale(D, s_slot(idx), t)?;
        coord.axpy(G, GOLD, y_slot(idx), -1.0)?;
        let sy = coord.dot(s_slot(idx), y_slot(idx))?;
        if sy > 1e-12 {
            hist.push_back((idx, 1.0 / sy));
            while hist.len() > m {
                hist.pop_front();
            }
        }
        f = f_new;
        report.losses.push(f);
        let (units_run, backups_issued, backups_won, wb) = {
            let st = sched.lock();
            (
                st.units_run,
                st.backups_issued,
                st.backups_won,
                st.worker_bytes(),
            )
        };
        let cb = coord.kv.bytes();
        let mut p = Progress {
            iteration: it + 1,
            loss: f,
            passes: report.passes,
            units_run,
            backups_issued,
            backups_won,
            bytes: (cb.0 + wb.0, cb.1 + wb.1),
            pass_time: report.pass_time,
            coord: &mut *coord,
            dim,
        };
        if !observe(&mut p) {
            break;
        }
    }
    Ok(report)
}
