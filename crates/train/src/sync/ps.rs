//! [`PsSync`]: data-parallel training against `gradwire-ps` parameter-server shards instead
//! of an all-reduce. The servers own the parameters and the optimizer: each step a worker
//! pushes its gradient and pulls the parameters to continue from
//! ([`ServerSync::server_step`], through [`GradientSync::server`]); the trainer's own
//! optimizer is not used.
//!
//! - **Parameters**: one flat table (key 1) of the model's parameters, cut into one chunk
//!   per shard (consistent hashing with bounded loads puts one on each), so a push or pull
//!   talks to every shard in parallel. Every worker `init`s it with its own initial
//!   parameters (identical on every rank: same seed); the first init wins on each shard.
//! - **Updater**: the server-side updater mirrors the chosen optimizer
//!   ([`mirror_optimizer`]): SGD → `sgd`, SGD with momentum → `momentum` (PyTorch's heavy
//!   ball: `v = mu v + g; w -= lr v`), Adagrad → `adagrad` (DistBelief's Downpour with
//!   Adagrad), Adam → `adam`. What a shard cannot do (weight decay, warm-up, decay
//!   schedules, clipping, Nesterov, dampening, AdamW, a non-zero Adagrad accumulator start)
//!   is refused rather than silently dropped.
//! - **Consistency**: `sync` (BSP: a round closes after one push from each live worker, the
//!   gradient averaged, so PS synchronous SGD computes what all-reduce SGD computes), `async`
//!   (Downpour: each push is applied as it arrives with the full learning rate) and
//!   `ssp:S` (a pull waits until the slowest worker is within S pushes).
//! - **Downpour** (DistBelief's supplementary algorithm): with `n_fetch = n_push = 1` (the
//!   paper's experiments; the default) a step is one `push_pull`. Otherwise the worker
//!   applies each gradient to its local copy (`w -= local_lr · g`), accrues it, pushes the
//!   accrued gradient every `n_push` steps and fetches the parameters every `n_fetch` steps.
//!   The trainer computes the gradient before calling the sync, so the fetch that the paper
//!   does at the top of step `k` is done here at the end of step `k - 1` (the same sequence).
//! - **Codec**: [`PsConfig::codec`] compresses every push of the parameter table (any
//!   gradwire codec, the server `decode_add`s; or MXNet's 2-bit quantizer), each chunk with
//!   its own worker-side residual when the spec has error feedback. Pulls stay dense f32.
//! - **Metrics**: under `sync`, [`GradientSync::average_metrics`] averages through one
//!   synchronous `assign` table per metric length, created on first use and reused for the
//!   whole run (the shards replace its value with each round's mean: exact in f32, and the
//!   shards hold a fixed number of tables however many evaluations run), so the epoch's loss
//!   and the sharded evaluation match all-reduce training. Under `async` and SSP nothing waits for the other
//!   workers (a dead one must not stall the rest), so metrics stay this worker's own.
//! - **Partition tables** (model parallelism composed with Downpour, DistBelief's Figure 2):
//!   [`PsConfig::table`] `j` names the table a client owns, key `1 + j` (metric tables from
//!   `METRICS_BASE + j·2^16`), holding partition `j`'s flat parameters only; the default,
//!   table 0, is the whole model's table at key 1, with the same keys and wire bytes as
//!   before partitions existed. Partition `j` of every replica shares table `j`, the
//!   replicas being its workers (worker id = replica index, world = replicas). A shard
//!   counts a sync round's live workers over every worker registered with it, across
//!   tables, and fences a worker id by its incarnation, so the partitions of one replica
//!   cannot share a shard under one id, nor take distinct ids on a shard whose rounds would
//!   then wait for the other partitions' workers: the caller gives each partition's table
//!   its own shards (`gradwire train` starts `K` sets of `--servers` shards, each for
//!   `replicas` workers), so every round counts exactly the replicas.
//! - **Bytes**: every frame byte the worker's client writes and reads (`KvStore::bytes`),
//!   headers and retries included; heartbeats run on their own connections and are not
//!   counted.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gradwire_ps::{
    ClientConfig, Consistency, DeadPolicy, Key, KvStore, PushCodec, TableSpec, UpdaterSpec,
    WorkerId,
};

use super::{GradientSync, ServerSync, SyncStats};
use crate::error::{ConfigError, Error, Result};
use crate::optim::{LrDecay, OptimizerConfig, OptimizerKind};

/// The parameter table's key.
const PARAMS: Key = Key(1);
/// Metric tables take keys from here up (one per metric length, in order of first use).
const METRICS_BASE: u64 = 1 << 32;
/// Key distance between two partition tables' metric tables.
const METRICS_PER_TABLE: u64 = 1 << 16;

/// How a worker trains against the parameter server.
#[derive(Debug, Clone, PartialEq)]
pub struct PsConfig {
    /// The shards' addresses, in shard order.
    pub shards: Vec<SocketAddr>,
    /// BSP, Downpour (async) or SSP.
    pub consistency: Consistency,
    /// The server-side optimizer (see [`mirror_optimizer`]).
    pub updater: UpdaterSpec,
    /// What a sync round or SSP read does about a dead worker.
    pub dead_policy: DeadPolicy,
    /// Fetch the parameters every this many steps (Downpour's `n_fetch`; 1 in the paper).
    pub n_fetch: u64,
    /// Push the accrued gradient every this many steps (Downpour's `n_push`; 1 in the paper).
    pub n_push: u64,
    /// Learning rate of the local update between fetches (unused when `n_fetch` is 1).
    pub local_lr: f32,
    /// How long one PS operation may take, retries included.
    pub deadline: Duration,
    /// How pushes of the parameter table are compressed (dense by default).
    pub codec: PushCodec,
    /// The table this client owns: 0 (the default) for a whole model's, `j` for partition
    /// `j`'s under model parallelism (parameters at key `1 + j`; see the module doc).
    pub table: u32,
}

impl PsConfig {
    /// The key of the parameter table this client owns.
    pub fn params_key(&self) -> Key {
        Key(PARAMS.0 + u64::from(self.table))
    }

    /// The key of this client's `i`th metric table.
    fn metrics_key(&self, i: usize) -> Key {
        Key(METRICS_BASE + u64::from(self.table) * METRICS_PER_TABLE + i as u64)
    }
}

impl PsConfig {
    /// Synchronous rounds, no Downpour loop, strict dead-worker policy, 60 s deadline.
    pub fn new(shards: Vec<SocketAddr>, consistency: Consistency, updater: UpdaterSpec) -> Self {
        PsConfig {
            shards,
            consistency,
            updater,
            dead_policy: DeadPolicy::Strict,
            n_fetch: 1,
            n_push: 1,
            local_lr: 0.0,
            deadline: Duration::from_secs(60),
            codec: PushCodec::Dense,
            table: 0,
        }
    }
}

/// The server-side updater that performs `o`'s update, or why a shard cannot.
pub fn mirror_optimizer(o: &OptimizerConfig) -> Result<UpdaterSpec> {
    let refuse = |what: &'static str| {
        Err(ConfigError::PsOptimizer {
            optimizer: o.to_string(),
            what,
        }
        .into())
    };
    if o.weight_decay != 0.0 {
        return refuse("weight decay");
    }
    if o.warmup_steps != 0 || !matches!(o.decay, LrDecay::Constant) {
        return refuse("a learning-rate schedule");
    }
    if o.clip_norm.is_some() {
        return refuse("gradient clipping");
    }
    let lr = o.lr as f32;
    match o.kind {
        OptimizerKind::Sgd {
            momentum,
            dampening,
            nesterov,
            corrected,
        } => {
            if nesterov {
                return refuse("Nesterov momentum");
            }
            if corrected {
                return refuse("momentum-corrected gradients (sgd:...,corrected)");
            }
            if momentum == 0.0 {
                Ok(UpdaterSpec::Sgd { lr })
            } else if dampening != 0.0 {
                refuse("momentum dampening")
            } else {
                Ok(UpdaterSpec::Momentum {
                    lr,
                    mu: momentum as f32,
                })
            }
        }
        OptimizerKind::Adagrad {
            eps,
            initial_accumulator,
        } => {
            if initial_accumulator != 0.0 {
                return refuse("a non-zero initial accumulator");
            }
            Ok(UpdaterSpec::Adagrad {
                lr,
                eps: eps as f32,
            })
        }
        OptimizerKind::Adam {
            beta1,
            beta2,
            eps,
            decoupled,
        } => {
            if decoupled {
                return refuse("decoupled weight decay (AdamW)");
            }
            Ok(UpdaterSpec::Adam {
                lr,
                beta1: beta1 as f32,
                beta2: beta2 as f32,
                eps: eps as f32,
            })
        }
    }
}

/// One worker's handle on the parameter server, as the trainer's sync (see the module doc).
pub struct PsSync {
    kv: Option<KvStore>,
    cfg: PsConfig,
    rank: usize,
    world: usize,
    len: usize,
    step: u64,
    accrued: Vec<f32>,
    /// The metric tables made so far: (length, key).
    metric_tables: Vec<(usize, Key)>,
    sent: u64,
    pushes: u64,
    pulls: u64,
}

impl PsSync {
    /// Connects worker `rank` of `world` to the shards, for a model of `n_params`
    /// parameters. Fails (naming the shard) when one is unreachable before the deadline.
    pub fn connect(rank: usize, world: usize, n_params: usize, cfg: PsConfig) -> Result<Self> {
        if cfg.shards.is_empty() {
            return Err(ConfigError::NoShards.into());
        }
        if cfg.consistency == Consistency::Sync && (cfg.n_fetch > 1 || cfg.n_push > 1) {
            return Err(ConfigError::DownpourNeedsAsync.into());
        }
        let mut c = ClientConfig::new(WorkerId(rank as u32), cfg.shards.clone());
        c.chunk_elems = n_params.div_ceil(cfg.shards.len()).max(1);
        c.deadline = cfg.deadline;
        c.attempt_timeout = cfg.deadline.mul_f64(2.0 / 3.0);
        c.seed = rank as u64;
        let kv = KvStore::connect(c)?;
        Ok(PsSync {
            kv: Some(kv),
            rank,
            world,
            len: n_params,
            step: 0,
            accrued: Vec::new(),
            metric_tables: Vec::new(),
            sent: 0,
            pushes: 0,
            pulls: 0,
            cfg,
        })
    }

    fn kv(&mut self) -> &mut KvStore {
        self.kv.as_mut().expect("client present until leave")
    }

    /// Frame bytes written to (pushed) and read from (pulled) the shards so far.
    pub fn bytes(&self) -> (u64, u64) {
        self.kv.as_ref().map_or((0, 0), KvStore::bytes)
    }

    /// Pushes and pulls of the parameter table so far.
    pub fn ops(&self) -> (u64, u64) {
        (self.pushes, self.pulls)
    }

    /// The settings.
    pub fn config(&self) -> &PsConfig {
        &self.cfg
    }

    /// Pushes any gradient still accrued (Downpour) and leaves, so sync rounds and SSP
    /// reads stop waiting for this worker.
    pub fn leave(mut self) -> Result<()> {
        if self.accrued.iter().any(|a| *a != 0.0) {
            let acc = std::mem::take(&mut self.accrued);
            let key = self.cfg.params_key();
            self.kv().push(key, &acc)?;
            self.pushes += 1;
        }
        if let Some(kv) = self.kv.take() {
            kv.leave()?;
        }
        Ok(())
    }

    fn table(&self) -> TableSpec {
        TableSpec::new(self.cfg.consistency, self.cfg.updater)
            .with_dead_policy(self.cfg.dead_policy)
            .with_codec(self.cfg.codec.clone())
    }

    /// Metric tables on the shards so far (one per metric length used).
    pub fn metric_tables(&self) -> usize {
        self.metric_tables.len()
    }
}

impl GradientSync for PsSync {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    /// Initializes the parameter table (first init wins) and pulls it.
    fn broadcast_params(&mut self, params: &mut [f32]) -> Result<()> {
        Error::check_len("parameters", self.len, params.len())?;
        let (spec, key) = (self.table(), self.cfg.params_key());
        self.kv().init(key, spec, params)?;
        self.kv().pull(key, params)?;
        self.pulls += 1;
        self.sent = self.bytes().0;
        Ok(())
    }

    fn sync(&mut self, _grads: &mut [f32]) -> Result<SyncStats> {
        Err(ConfigError::ServerStep.into())
    }

    fn server(&mut self) -> Option<&mut dyn ServerSync> {
        Some(self)
    }

    /// Under `sync`: the mean over the live workers, through the synchronous `assign` table
    /// of this length (made on first use). Otherwise the values stay this worker's own (nothing may wait for a worker
    /// that might be dead).
    fn average_metrics(&mut self, values: &mut [f64]) -> Result<()> {
        if self.world == 1 || self.cfg.consistency != Consistency::Sync || values.is_empty() {
            return Ok(());
        }
        let n = values.len();
        let key = match self.metric_tables.iter().find(|(len, _)| *len == n) {
            Some(&(_, key)) => key,
            None => {
                // Every worker makes its tables in the same order: the keys agree.
                let key = self.cfg.metrics_key(self.metric_tables.len());
                let spec = TableSpec::new(Consistency::Sync, UpdaterSpec::Assign)
                    .with_dead_policy(self.cfg.dead_policy);
                self.kv().init(key, spec, &vec![0.0; n])?;
                self.metric_tables.push((n, key));
                key
            }
        };
        let mine: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        let mut out = vec![0.0f32; n];
        self.kv().push_pull(key, &mine, &mut out)?;
        for (v, o) in values.iter_mut().zip(&out) {
            *v = f64::from(*o);
        }
        Ok(())
    }
}

impl ServerSync for PsSync {
    fn server_step(&mut self, grads: &[f32], params: &mut [f32]) -> Result<SyncStats> {
        for (what, got) in [("gradients", grads.len()), ("parameters", params.len())] {
            Error::check_len(what, self.len, got)?;
        }
        let t0 = Instant::now();
        let key = self.cfg.params_key();
        let (n_fetch, n_push) = (self.cfg.n_fetch.max(1), self.cfg.n_push.max(1));
        self.step += 1;
        let mut pushed = false;
        if n_fetch == 1 && n_push == 1 {
            let kv = self.kv.as_mut().expect("client present until leave");
            kv.push_pull(key, grads, params)?;
            (self.pushes, self.pulls) = (self.pushes + 1, self.pulls + 1);
            pushed = true;
        } else {
            if self.accrued.len() != self.len {
                self.accrued = vec![0.0; self.len];
            }
            let lr = self.cfg.local_lr;
            for ((p, a), g) in params.iter_mut().zip(self.accrued.iter_mut()).zip(grads) {
                *p -= lr * g;
                *a += g;
            }
            let kv = self.kv.as_mut().expect("client present until leave");
            if self.step.is_multiple_of(n_push) {
                kv.push(key, &self.accrued)?;
                self.accrued.iter_mut().for_each(|a| *a = 0.0);
                self.pushes += 1;
                pushed = true;
            }
            if self.step.is_multiple_of(n_fetch) {
                kv.pull(key, params)?;
                self.pulls += 1;
            }
        }
        let sent = self.bytes().0;
        let delta = sent.saturating_sub(self.sent);
        self.sent = sent;
        let raw = if pushed { 4 * self.len as u64 } else { 0 };
        Ok(SyncStats {
            bytes_sent: delta,
            comm_s: t0.elapsed().as_secs_f64(),
            raw_bytes: raw,
            encoded_bytes: if pushed { delta } else { 0 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two workers average five rounds of metrics of one length and one of another: every
    /// mean is the hand-computed one, and the shards hold one table per length (a probe
    /// client finds the first length's table already there, holding the last mean, and no
    /// third table).
    #[test]
    fn metric_tables_are_reused_across_calls() {
        use gradwire_ps::{Server, ServerConfig, ShardConfig};
        let server = Server::start(ServerConfig::loopback(ShardConfig {
            num_workers: 2,
            ..ShardConfig::default()
        }))
        .unwrap();
        let addr = server.local_addr();
        let workers: Vec<_> = (0..2)
            .map(|rank| {
                std::thread::spawn(move || {
                    let cfg = PsConfig::new(vec![addr], Consistency::Sync, UpdaterSpec::Sum);
                    let mut ps = PsSync::connect(rank, 2, 4, cfg).unwrap();
                    let mut means = Vec::new();
                    for call in 0..5 {
                        let x = (call * 10 + rank) as f64;
                        let mut v = [x, 2.0 * x, -x];
                        ps.average_metrics(&mut v).unwrap();
                        means.push(v);
                    }
                    let mut other = [rank as f64, 4.0];
                    ps.average_metrics(&mut other).unwrap();
                    (means, other, ps.metric_tables())
                })
            })
            .collect();
        for h in workers {
            let (means, other, tables) = h.join().unwrap();
            for (call, v) in means.iter().enumerate() {
                let m = call as f64 * 10.0 + 0.5;
                assert_eq!(*v, [m, 2.0 * m, -m], "call {call}");
            }
            assert_eq!(other, [0.5, 4.0]);
            assert_eq!(tables, 2);
        }
    }

    /// Table 0 keeps the whole model's keys; partition table `j` is key `1 + j` with its
    /// own metric keys. Two replicas of partition 1 (worker ids 0 and 1 on a shard of two
    /// workers) close BSP rounds on table 1: both end with the mean-gradient SGD step.
    #[test]
    fn a_partition_table_has_its_own_keys_and_closes_rounds_over_the_replicas() {
        use gradwire_ps::{Server, ServerConfig, ShardConfig};
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let whole = PsConfig::new(vec![addr], Consistency::Sync, UpdaterSpec::Sum);
        assert_eq!(whole.params_key(), Key(1));
        assert_eq!(whole.metrics_key(2), Key(METRICS_BASE + 2));
        let part = PsConfig { table: 3, ..whole };
        assert_eq!(part.params_key(), Key(4));
        assert_eq!(
            part.metrics_key(0),
            Key(METRICS_BASE + 3 * METRICS_PER_TABLE)
        );

        let server = Server::start(ServerConfig::loopback(ShardConfig {
            num_workers: 2,
            ..ShardConfig::default()
        }))
        .unwrap();
        let addr = server.local_addr();
        let replicas: Vec<_> = (0..2)
            .map(|replica| {
                std::thread::spawn(move || {
                    let cfg = PsConfig {
                        table: 1,
                        ..PsConfig::new(vec![addr], Consistency::Sync, UpdaterSpec::Sgd { lr: 0.5 })
                    };
                    let mut ps = PsSync::connect(replica, 2, 3, cfg).unwrap();
                    let mut params = [1.0f32, 2.0, 3.0];
                    ps.broadcast_params(&mut params).unwrap();
                    let g = [replica as f32, 2.0, -2.0];
                    ps.server_step(&g, &mut params).unwrap();
                    let mut loss = [replica as f64];
                    ps.average_metrics(&mut loss).unwrap();
                    ps.leave().unwrap();
                    (params, loss[0])
                })
            })
            .collect();
        for h in replicas {
            let (params, loss) = h.join().unwrap();
            assert_eq!(params, [0.75, 1.0, 4.0]);
            assert_eq!(loss, 0.5);
        }
    }

    #[test]
    fn optimizers_mirror_to_updaters_or_are_refused_by_name() {
        let m = |s: &str| mirror_optimizer(&s.parse::<OptimizerConfig>().unwrap());
        assert_eq!(
            m("sgd:lr=0.1,momentum=0").unwrap(),
            UpdaterSpec::Sgd { lr: 0.1 }
        );
        assert_eq!(
            m("sgd:lr=0.05,momentum=0.9").unwrap(),
            UpdaterSpec::Momentum { lr: 0.05, mu: 0.9 }
        );
        assert_eq!(
            m("adagrad:lr=0.1").unwrap(),
            UpdaterSpec::Adagrad {
                lr: 0.1,
                eps: 1e-10
            }
        );
        assert!(matches!(
            m("adam:lr=0.001").unwrap(),
            UpdaterSpec::Adam { lr, .. } if lr == 0.001
        ));
        for (spec, word) in [
            ("sgd:lr=0.1,wd=0.0005", "weight decay"),
            ("sgd:lr=0.1,momentum=0.9,nesterov", "Nesterov"),
            ("sgd:lr=0.1,warmup=10", "schedule"),
            ("adam:lr=0.001,clip=5", "clipping"),
        ] {
            let e = m(spec).unwrap_err().to_string();
            assert!(e.contains(word), "{spec}: {e}");
        }
    }
}
