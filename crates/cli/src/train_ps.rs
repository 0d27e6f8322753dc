//! `gradwire train --sync ps-sync|ps-async|ps-ssp:S`: data-parallel training against
//! parameter-server shards (`crates/ps`) instead of an all-reduce.
//!
//! As the parent (no launcher in the environment), `train` starts `--servers S` shard
//! processes (`gradwire ps serve`, each printing its address), then `--workers N` worker
//! processes of this binary (with `--worker --ps-servers ADDR,...`), waits for them and
//! stops the shards. Under a launcher (`gradwire launch`, mpirun, srun, torchrun) each rank
//! is one worker and the shards must already run: pass their addresses with
//! `--ps-servers`. Workers never form a rank mesh: they talk only to the shards, so under
//! `ps-async` a lost worker stalls nobody.
//!
//! - `ps-sync`: BSP rounds (the gradient averaged over the round's workers, then the
//!   server-side updater), the same parameters as all-reduce SGD up to float rounding;
//!   the epoch loss and the sharded evaluation are averaged through the PS.
//! - `ps-async`: DistBelief's Downpour (`--n-fetch`, `--n-push`, paper default 1 and 1);
//!   rank 0 evaluates the parameters it last fetched and reports its own loss. The shards
//!   run Downpour's Adagrad (`adagrad:lr=0.01`, [`downpour_default`]) unless an optimizer is
//!   given: server-side momentum applied to every stale worker's push multiplies the step
//!   (4 workers with momentum 0.9 diverged on the MLP, and LeNet with 2 workers ended at
//!   10%; rank 0 warns when momentum is asked for by name).
//! - `ps-ssp:S`: stale synchronous parallel with bound S (reporting as `ps-async`).
//! - with `--model-parallel K` (`ps-sync`, `ps-async`, `ps-ssp:S`): `--workers R` replicas
//!   of K partitions (R·K processes, a TCP mesh per replica for the activations); partition
//!   j of every replica pushes and pulls its own tensors as table j on its own `--servers`
//!   shards (`crate::train_parallel`).
//! - `sandblaster`: DistBelief's batch L-BFGS on the same models and data
//!   (`crate::train_sandblaster`): a coordinator, `--workers` worker threads and the shards;
//!   one epoch is `--sb-iters` accepted L-BFGS steps.
//!
//! `--codec C` compresses every worker's push of the parameter table with gradwire codec `C`
//! (the shards `decode_add`), with error feedback at the worker (a residual per chunk):
//! error feedback is always on for compressed pushes (`ef=true` is forced into the spec).
//! `--push-codec SPEC` takes the ps crate's push-codec grammar instead, which adds MXNet's
//! 2-bit quantizer (`2bit[:threshold=T]`, default 0.5, with its own residual). Pulls stay
//! dense f32. PowerSGD (its factors need an all-reduce) and DGC (it owns its momentum, which
//! the shards' updater would apply again) are refused by name; `none`/`fp32` are dense.
//! Bytes in the JSON lines are the measured frame bytes, and `compression_ratio` is the dense
//! push size over the measured push frames (headers included).
//!
//! The server-side updater mirrors `--optimizer` (`gradwire_train::sync::ps::mirror_optimizer`):
//! SGD, SGD with momentum, Adagrad (DistBelief) and Adam, constant rate; anything else is
//! refused before a process starts. Output: the same JSON lines, metrics.jsonl and run.json
//! as all-reduce training, plus `servers`, `mode` and the measured `bytes_pulled` per epoch
//! (`bytes_sent` is what rank 0 pushed), and a `ps` object in run.json with every worker's
//! pushes, pulls and bytes, and the workers lost.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use anyhow::{bail, Context, Result};
use clap::Args;
use gradwire_codec::{CodecConfig, CodecId};
use gradwire_ps::{Consistency, DeadPolicy, PushCodec, UpdaterSpec};
use gradwire_train::sync::ps::mirror_optimizer;
use gradwire_train::{OptimizerConfig, OptimizerKind, SyncStrategy};

use crate::train::TrainArgs;

mod run;
#[cfg(test)]
mod tests;

pub use run::{run, save_params};

/// What `--sync` asks for: an all-reduce strategy or a parameter-server mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SyncMode {
    /// Gradients reduced by the engine with this strategy.
    AllReduce(SyncStrategy),
    /// Parameters and optimizer on parameter-server shards.
    Ps(PsMode),
}

impl Default for SyncMode {
    fn default() -> Self {
        SyncMode::AllReduce(SyncStrategy::default())
    }
}

/// The parameter-server modes of `--sync`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PsMode {
    /// `ps-sync`, `ps-async` or `ps-ssp:S`.
    Table(Consistency),
    /// `sandblaster`: DistBelief's batch L-BFGS (`crate::train_sandblaster`).
    Sandblaster,
}

impl std::fmt::Display for PsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PsMode::Table(c) => write!(f, "ps-{c}"),
            PsMode::Sandblaster => f.write_str("sandblaster"),
        }
    }
}

impl FromStr for SyncMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        if t == "sandblaster" {
            return Ok(SyncMode::Ps(PsMode::Sandblaster));
        }
        if t.starts_with("ps-") {
            return t
                .parse::<Consistency>()
                .map(|c| SyncMode::Ps(PsMode::Table(c)))
                .map_err(|_| {
                    format!("unknown parameter-server mode '{s}' (ps-sync, ps-async, ps-ssp:S)")
                });
        }
        t.parse::<SyncStrategy>()
            .map(SyncMode::AllReduce)
            .map_err(|e| {
                format!("{e}; or a parameter server: ps-sync, ps-async, ps-ssp:S, sandblaster")
            })
    }
}

impl SyncMode {
    /// The all-reduce strategy (auto for a PS mode) and the PS mode, if any.
    pub fn split(self) -> (SyncStrategy, Option<PsMode>) {
        match self {
            SyncMode::AllReduce(s) => (s, None),
            SyncMode::Ps(m) => (SyncStrategy::default(), Some(m)),
        }
    }
}

/// The parameter-server flags of `gradwire train`.
#[derive(Args, Debug, Clone, Default)]
pub struct PsArgs {
    /// Parameter-server shards to start (with --sync ps-sync, ps-async, ps-ssp:S); per
    /// partition's table under --model-parallel K (K·S in all) [default: 1].
    #[arg(long)]
    pub servers: Option<usize>,
    /// Use these running shards (`gradwire ps serve`), in shard order, instead of starting
    /// them; needed under a launcher.
    #[arg(long, value_delimiter = ',', value_name = "ADDR,...")]
    pub ps_servers: Vec<SocketAddr>,
    /// Downpour: fetch the parameters every this many steps [default: 1, as the paper's
    /// experiments] (ps-async, ps-ssp).
    #[arg(long)]
    pub n_fetch: Option<u64>,
    /// Downpour: push the accrued gradient every this many steps [default: 1] (ps-async,
    /// ps-ssp).
    #[arg(long)]
    pub n_push: Option<u64>,
    /// Downpour: learning rate of the local update between fetches [default: the
    /// optimizer's for SGD, 0 for Adagrad and Adam].
    #[arg(long)]
    pub local_lr: Option<f64>,
    /// What a synchronous round (or SSP read) does about a dead worker: strict (every
    /// worker fails, naming it) or shrink (it is left out) [default: strict].
    #[arg(long)]
    pub dead_policy: Option<DeadPolicy>,
    /// Write rank 0's final flat parameters to this file (little-endian f32).
    #[arg(long, value_name = "FILE")]
    pub save_params: Option<PathBuf>,
    /// Compress pushes with this push codec (ps-sync, ps-async, ps-ssp): `2bit` (MXNet's
    /// 2-bit quantizer, `2bit:threshold=0.5`), `dense`, or any gradwire codec spec (as
    /// --codec) [default: --codec's].
    #[arg(long, value_name = "SPEC")]
    pub push_codec: Option<PushCodec>,
    /// Sandblaster: accepted L-BFGS steps per epoch (one JSON line each) [default: 10].
    #[arg(long)]
    pub sb_iters: Option<usize>,
    /// Sandblaster: L-BFGS history length m [default: 10].
    #[arg(long)]
    pub sb_history: Option<usize>,
    /// Sandblaster: examples in the full batch, a seeded sample of the training set
    /// [default: the whole training set].
    #[arg(long)]
    pub sb_batch: Option<usize>,
    /// Sandblaster: examples per work unit [default: the batch / (16 x workers), so each
    /// worker takes about 16 units a pass].
    #[arg(long)]
    pub sb_unit: Option<usize>,
    /// Sandblaster: no backup copies of straggling units near the end of a pass.
    #[arg(long)]
    pub sb_no_backups: bool,
}

/// Sandblaster's settings (`--sb-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct SbPlan {
    /// Accepted L-BFGS steps per epoch.
    pub iters_per_epoch: usize,
    /// History length m.
    pub history: usize,
    /// Examples in the full batch (`None`: the training set).
    pub batch: Option<usize>,
    /// Examples per unit (`None`: batch / (16 x workers)).
    pub unit: Option<usize>,
    /// Backup copies of straggling units.
    pub backups: bool,
}

/// A validated parameter-server run.
#[derive(Debug, Clone, PartialEq)]
pub struct PsPlan {
    /// The mode.
    pub mode: PsMode,
    /// Sandblaster's settings (with `--sync sandblaster`).
    pub sb: Option<SbPlan>,
    /// The consistency of the parameter table (async for Sandblaster's).
    pub consistency: Consistency,
    /// Shards to start for each table (one table, or one per partition under
    /// `--model-parallel`; or the number given by `--ps-servers`, all tables together).
    pub servers: usize,
    /// Running shards to use instead of starting them.
    pub addrs: Vec<SocketAddr>,
    /// The server-side updater.
    pub updater: UpdaterSpec,
    /// The optimizer the updater mirrors (the workers' own; `--optimizer`'s, or
    /// [`downpour_default`]'s).
    pub optimizer: OptimizerConfig,
    /// Downpour's fetch period.
    pub n_fetch: u64,
    /// Downpour's push period.
    pub n_push: u64,
    /// Downpour's local learning rate.
    pub local_lr: f32,
    /// Dead-worker policy.
    pub dead_policy: DeadPolicy,
    /// How the workers' pushes are compressed.
    pub codec: PushCodec,
}

/// What the rest of the plan says, for the checks that involve a PS flag.
pub struct PlanContext<'a> {
    /// The flags.
    pub args: &'a TrainArgs,
    /// The codec.
    pub codec: &'a CodecConfig,
    /// The optimizer (after momentum correction).
    pub optimizer: &'a OptimizerConfig,
    /// Under a launcher.
    pub launched: bool,
    /// The emulated link, if any.
    pub link: bool,
}

/// The all-reduce engine's settings, each with whether it was given: no parameter-server
/// mode takes them.
fn all_reduce_flags(cx: &PlanContext<'_>) -> [(&'static str, bool); 5] {
    let t = cx.args;
    [
        ("--rule", !t.rules.is_empty()),
        ("--timeline", t.timeline.is_some()),
        ("--link", t.link.is_some() || cx.link),
        ("--fusion-bytes", t.fusion_bytes.is_some()),
        ("--threads-as-workers", t.threads_as_workers),
    ]
}

/// Checks the PS flags against the mode and the rest of the plan; `None` without a PS mode.
pub fn plan(mode: Option<PsMode>, cx: &PlanContext<'_>) -> Result<Option<PsPlan>> {
    let a = &cx.args.ps;
    let Some(mode) = mode else {
        let given = [
            ("--servers", a.servers.is_some()),
            ("--ps-servers", !a.ps_servers.is_empty()),
            ("--n-fetch", a.n_fetch.is_some()),
            ("--n-push", a.n_push.is_some()),
            ("--local-lr", a.local_lr.is_some()),
            ("--dead-policy", a.dead_policy.is_some()),
            ("--push-codec", a.push_codec.is_some()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
            bail!(
                "{flag} is a parameter-server flag: it needs --sync ps-sync, ps-async or ps-ssp:S"
            );
        }
        sb_flags_need_sandblaster(a, None)?;
        return Ok(None);
    };
    let consistency = match mode {
        PsMode::Table(c) => {
            sb_flags_need_sandblaster(a, Some(mode))?;
            c
        }
        PsMode::Sandblaster => return plan_sandblaster(cx),
    };
    let codec = push_codec(cx.codec, a.push_codec.as_ref(), mode)?;
    for (flag, given) in all_reduce_flags(cx) {
        if given {
            bail!("{flag} is an all-reduce setting; it does not apply to --sync {mode}");
        }
    }
    let downpour = a.n_fetch.is_some() || a.n_push.is_some() || a.local_lr.is_some();
    if downpour && consistency == Consistency::Sync {
        bail!("--n-fetch, --n-push and --local-lr are Downpour's: they need --sync ps-async or ps-ssp:S");
    }
    if a.dead_policy.is_some() && consistency == Consistency::Async {
        bail!("--dead-policy applies to ps-sync and ps-ssp:S (ps-async never waits for a worker)");
    }
    let (n_fetch, n_push) = (a.n_fetch.unwrap_or(1), a.n_push.unwrap_or(1));
    if n_fetch == 0 || n_push == 0 {
        bail!("--n-fetch and --n-push must be at least 1");
    }
    let optimizer = match downpour_default(cx, consistency)? {
        Some(o) => o,
        None => cx.optimizer.clone(),
    };
    let updater =
        mirror_optimizer(&optimizer).map_err(|e| anyhow::anyhow!("--sync {mode}: {e:#}"))?;
    let local_lr = match a.local_lr {
        Some(l) if !(l.is_finite() && l >= 0.0) => bail!("--local-lr must be >= 0, not {l}"),
        Some(l) => l as f32,
        None => match optimizer.kind {
            OptimizerKind::Sgd { .. } => optimizer.lr as f32,
            _ => 0.0,
        },
    };
    if a.ps_servers.is_empty() && cx.launched {
        bail!(
            "--sync {mode} under a launcher: start the shards with `gradwire ps serve \
             --workers N` and pass their addresses with --ps-servers ADDR,..."
        );
    }
    let tables = cx.args.mp.model_parallel.unwrap_or(1).max(1);
    let servers = server_count(a, tables)?;
    Ok(Some(PsPlan {
        mode,
        sb: None,
        consistency,
        servers,
        addrs: a.ps_servers.clone(),
        updater,
        optimizer,
        n_fetch,
        n_push,
        local_lr,
        dead_policy: a.dead_policy.unwrap_or_default(),
        codec,
    }))
}

/// Learning rate of the Adagrad updater `--sync ps-async` uses when no optimizer is given
/// (LeNet on Fashion-MNIST, 2 workers, 2 shards, 2 epochs: 87.15%).
pub const DOWNPOUR_ADAGRAD_LR: f64 = 0.01;

/// Downpour's own updater, Adagrad (Dean et al. 2012), for `--sync ps-async` when neither
/// `--optimizer` nor the `--config` file names an optimizer: the default momentum SGD,
/// applied by the shards to every stale worker's push, multiplies the step and diverged.
/// The rate is `--lr` (or the file's `lr`) if given, else [`DOWNPOUR_ADAGRAD_LR`]. `None`
/// for other modes, or when the user chose the optimizer (momentum SGD stays available by
/// name: `--optimizer sgd:lr=0.05,momentum=0.9`).
pub fn downpour_default(
    cx: &PlanContext<'_>,
    consistency: Consistency,
) -> Result<Option<OptimizerConfig>> {
    if consistency != Consistency::Async || cx.args.optimizer.is_some() {
        return Ok(None);
    }
    let (file_optimizer, file_lr) = match &cx.args.config {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let v: toml::Value =
                toml::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
            (v.get("optimizer").is_some(), v.get("lr").is_some())
        }
        None => (false, false),
    };
    if file_optimizer {
        return Ok(None);
    }
    let lr = if cx.args.lr.is_some() || file_lr {
        cx.optimizer.lr
    } else {
        DOWNPOUR_ADAGRAD_LR
    };
    Ok(Some(OptimizerConfig::adagrad(lr)))
}

/// The push codec of a PS run from `--codec` or `--push-codec` (error feedback forced on),
/// or why it cannot work.
fn push_codec(codec: &CodecConfig, push: Option<&PushCodec>, mode: PsMode) -> Result<PushCodec> {
    let chosen = match push {
        Some(p) => {
            if codec.id() != CodecId::None {
                bail!("--codec {codec} and --push-codec {p}: give one of them");
            }
            p.clone()
        }
        None if codec.id() == CodecId::None => PushCodec::Dense,
        None => PushCodec::Codec(codec.clone()),
    };
    let c = match chosen {
        PushCodec::Codec(c) => c,
        other => return Ok(other),
    };
    match c.id() {
        CodecId::None => return Ok(PushCodec::Dense),
        CodecId::PowerSgd => bail!(
            "--codec {c} with --sync {mode}: PowerSGD's factors need an all-reduce, a shard \
             cannot decode a push of them; use a quantizer or sparsifier (qsgd, topk, 2bit...)"
        ),
        CodecId::Dgc => bail!(
            "--codec {c} with --sync {mode}: DGC owns its momentum (momentum correction), which \
             the shards' updater would apply again; use topk for sparsified pushes"
        ),
        _ => {}
    }
    let spec = c.to_string();
    let spec = if spec.contains("ef=false") {
        spec.replace("ef=false", "ef=true")
    } else if spec.contains("ef=") {
        spec
    } else if spec.contains(':') {
        format!("{spec},ef=true")
    } else {
        format!("{spec}:ef=true")
    };
    let c: CodecConfig = spec
        .parse()
        .map_err(|e| anyhow::anyhow!("--codec {spec} with error feedback: {e}"))?;
    Ok(PushCodec::Codec(c))
}

/// Refuses a `--sb-*` flag outside `--sync sandblaster`.
/// The shard count: the length of `--ps-servers` (which `--servers` times `tables`, if
/// given, must match), else `--servers` (default 1, shards per table: `tables` is the
/// partition count under `--model-parallel`, else 1); between 1 and 64 in all.
fn server_count(a: &PsArgs, tables: usize) -> Result<usize> {
    let servers = if a.ps_servers.is_empty() {
        a.servers.unwrap_or(1)
    } else {
        if let Some(s) = a
            .servers
            .filter(|&s| s.saturating_mul(tables) != a.ps_servers.len())
        {
            let per = if tables > 1 {
                format!(" ({tables} tables of {s})")
            } else {
                String::new()
            };
            bail!(
                "--servers {s}{per} but --ps-servers names {} shard(s)",
                a.ps_servers.len()
            );
        }
        a.ps_servers.len()
    };
    if !(1..=64).contains(&servers) || (a.ps_servers.is_empty() && servers * tables > 64) {
        bail!("--servers must be between 1 and 64 (shards in all under --model-parallel)");
    }
    Ok(servers)
}

fn sb_flags_need_sandblaster(a: &PsArgs, mode: Option<PsMode>) -> Result<()> {
    let given = [
        ("--sb-iters", a.sb_iters.is_some()),
        ("--sb-history", a.sb_history.is_some()),
        ("--sb-batch", a.sb_batch.is_some()),
        ("--sb-unit", a.sb_unit.is_some()),
        ("--sb-no-backups", a.sb_no_backups),
    ];
    if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
        let with = mode.map_or(String::new(), |m| format!(", not --sync {m}"));
        bail!("{flag} is Sandblaster's: it needs --sync sandblaster{with}");
    }
    Ok(())
}

/// Checks the flags of `--sync sandblaster`.
fn plan_sandblaster(cx: &PlanContext<'_>) -> Result<Option<PsPlan>> {
    let (t, a) = (cx.args, &cx.args.ps);
    if cx.launched || t.worker {
        bail!(
            "--sync sandblaster runs its workers as threads of one coordinator process: run \
             `gradwire train --sync sandblaster --workers N` without a launcher"
        );
    }
    if a.push_codec.is_some() {
        bail!("--push-codec with --sync sandblaster: L-BFGS needs exact batch gradients");
    }
    if cx.codec.id() != CodecId::None {
        bail!(
            "--codec {} with --sync sandblaster: L-BFGS needs exact batch gradients; drop --codec",
            cx.codec
        );
    }
    for (flag, given) in [
        ("--optimizer", t.optimizer.is_some()),
        ("--lr", t.lr.is_some()),
        ("--batch", t.batch.is_some()),
        ("--max-steps", t.max_steps.is_some()),
        ("--overlap-steps", t.overlap_steps.is_some()),
        ("--momentum-correction", t.momentum_correction.is_some()),
        ("--n-fetch", a.n_fetch.is_some()),
        ("--n-push", a.n_push.is_some()),
        ("--local-lr", a.local_lr.is_some()),
        ("--dead-policy", a.dead_policy.is_some()),
    ]
    .into_iter()
    .chain(all_reduce_flags(cx))
    {
        if given {
            bail!(
                "{flag} does not apply to --sync sandblaster (batch L-BFGS with a line search; \
                 see --sb-iters, --sb-history, --sb-batch, --sb-unit)"
            );
        }
    }
    let positive = |flag: &str, v: Option<usize>| match v {
        Some(0) => bail!("{flag} must be at least 1"),
        _ => Ok(v),
    };
    let iters = positive("--sb-iters", a.sb_iters)?.unwrap_or(10);
    let history = positive("--sb-history", a.sb_history)?.unwrap_or(10);
    if history > 512 {
        bail!("--sb-history must be at most 512 (the shards keep 2m vectors)");
    }
    let batch = positive("--sb-batch", a.sb_batch)?;
    let unit = positive("--sb-unit", a.sb_unit)?;
    let servers = server_count(a, 1)?;
    Ok(Some(PsPlan {
        mode: PsMode::Sandblaster,
        sb: Some(SbPlan {
            iters_per_epoch: iters,
            history,
            batch,
            unit,
            backups: !a.sb_no_backups,
        }),
        consistency: Consistency::Async,
        servers,
        addrs: a.ps_servers.clone(),
        updater: UpdaterSpec::Sum,
        optimizer: cx.optimizer.clone(),
        n_fetch: 1,
        n_push: 1,
        local_lr: 0.0,
        dead_policy: DeadPolicy::default(),
        codec: PushCodec::Dense,
    }))
}
