//! A parameter-server job's settings: the flags ([`PsSettings`]), checked against the mode
//! and the rest of the plan into a [`PsPlan`] (the shards, the server-side updater mirroring
//! the optimizer, Downpour's periods, the push codec, Sandblaster's [`SbPlan`]).
//!
//! - `ps-sync`: BSP rounds; `ps-async`: DistBelief's Downpour (`--n-fetch`, `--n-push`,
//!   paper default 1 and 1), whose shards run Downpour's Adagrad ([`downpour_default`])
//!   unless an optimizer is given; `ps-ssp:S`: stale synchronous parallel with bound S.
//! - `sandblaster`: DistBelief's batch L-BFGS; its workers are threads of one coordinator.
//! - `--codec C` compresses every push with error feedback at the worker (`ef=true` is forced
//!   into the spec); `--push-codec` takes the ps crate's grammar (MXNet's 2-bit quantizer).
//!   PowerSGD and DGC are refused by name: a shard cannot decode PowerSGD's factors, and DGC
//!   owns its momentum, which the shards' updater would apply again.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use gradwire_codec::{CodecConfig, CodecId};
use gradwire_ps::{Consistency, DeadPolicy, PushCodec, UpdaterSpec};
use gradwire_train::sync::ps::mirror_optimizer;
use gradwire_train::{OptimizerConfig, OptimizerKind};

use crate::settings::Settings;
use crate::sync_mode::PsMode;

/// The parameter-server flags of `gradwire train`.
#[derive(Args, Debug, Clone, Default)]
pub struct PsSettings {
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
    /// The flags given on the command line.
    pub flags: &'a Settings,
    /// The parameter-server flags.
    pub ps: &'a PsSettings,
    /// Tables: the partitions per replica under model parallelism, else 1.
    pub tables: usize,
    /// Whether the settings file names an optimizer, and a learning rate.
    pub file_names: (bool, bool),
    /// The codec.
    pub codec: &'a CodecConfig,
    /// The optimizer (after momentum correction).
    pub optimizer: &'a OptimizerConfig,
    /// Under a launcher.
    pub launched: bool,
    /// This process is one rank started by the parent.
    pub worker: bool,
    /// The ranks run as threads of one process.
    pub threads_as_workers: bool,
    /// The emulated link, if any.
    pub link: bool,
}

/// A parameter-server setting that cannot run, naming the flag.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    /// A parameter-server flag without a parameter-server mode.
    #[error("{0} is a parameter-server flag: it needs --sync ps-sync, ps-async or ps-ssp:S")]
    NeedsPs(&'static str),
    /// A Sandblaster flag outside `--sync sandblaster`.
    #[error("{flag} is Sandblaster's: it needs --sync sandblaster{with}")]
    NeedsSandblaster {
        /// The flag.
        flag: &'static str,
        /// `, not --sync MODE` when another mode was asked for.
        with: String,
    },
    /// An all-reduce setting under a parameter server.
    #[error("{flag} is an all-reduce setting; it does not apply to --sync {mode}")]
    AllReduceFlag {
        /// The flag.
        flag: &'static str,
        /// The mode.
        mode: PsMode,
    },
    /// Downpour's flags under `ps-sync`.
    #[error(
        "--n-fetch, --n-push and --local-lr are Downpour's: they need --sync ps-async or ps-ssp:S"
    )]
    DownpourUnderSync,
    /// `--dead-policy` under `ps-async`.
    #[error("--dead-policy applies to ps-sync and ps-ssp:S (ps-async never waits for a worker)")]
    DeadPolicyUnderAsync,
    /// A zero period.
    #[error("--n-fetch and --n-push must be at least 1")]
    ZeroPeriod,
    /// The optimizer has no server-side updater.
    #[error("--sync {mode}: {source}")]
    Updater {
        /// The mode.
        mode: PsMode,
        /// Why the updater cannot mirror the optimizer.
        source: gradwire_train::Error,
    },
    /// A negative or non-finite local rate.
    #[error("--local-lr must be >= 0, not {0}")]
    LocalLr(f64),
    /// Under a launcher without running shards.
    #[error(
        "--sync {0} under a launcher: start the shards with `gradwire ps serve --workers N` \
         and pass their addresses with --ps-servers ADDR,..."
    )]
    LaunchedWithoutShards(PsMode),
    /// `--codec` and `--push-codec` both.
    #[error("--codec {codec} and --push-codec {push}: give one of them")]
    TwoCodecs {
        /// `--codec`.
        codec: CodecConfig,
        /// `--push-codec`.
        push: PushCodec,
    },
    /// PowerSGD pushes.
    #[error(
        "--codec {codec} with --sync {mode}: PowerSGD's factors need an all-reduce, a shard \
         cannot decode a push of them; use a quantizer or sparsifier (qsgd, topk, 2bit...)"
    )]
    PowerSgd {
        /// The codec.
        codec: CodecConfig,
        /// The mode.
        mode: PsMode,
    },
    /// DGC pushes.
    #[error(
        "--codec {codec} with --sync {mode}: DGC owns its momentum (momentum correction), \
         which the shards' updater would apply again; use topk for sparsified pushes"
    )]
    Dgc {
        /// The codec.
        codec: CodecConfig,
        /// The mode.
        mode: PsMode,
    },
    /// The codec with error feedback forced on does not parse.
    #[error("--codec {spec} with error feedback: {source}")]
    ErrorFeedback {
        /// The spec with `ef=true`.
        spec: String,
        /// What the codec parser said.
        source: gradwire_codec::ConfigError,
    },
    /// `--servers` disagrees with `--ps-servers`.
    #[error("--servers {servers}{per} but --ps-servers names {given} shard(s)")]
    ServerCount {
        /// `--servers`.
        servers: usize,
        /// ` (K tables of S)` under model parallelism.
        per: String,
        /// Addresses given.
        given: usize,
    },
    /// Too few or too many shards.
    #[error("--servers must be between 1 and 64 (shards in all under --model-parallel)")]
    ServerBounds,
    /// Sandblaster under a launcher or as a worker.
    #[error(
        "--sync sandblaster runs its workers as threads of one coordinator process: run \
         `gradwire train --sync sandblaster --workers N` without a launcher"
    )]
    SandblasterLaunched,
    /// Sandblaster with `--push-codec`.
    #[error("--push-codec with --sync sandblaster: L-BFGS needs exact batch gradients")]
    SandblasterPushCodec,
    /// Sandblaster with `--codec`.
    #[error(
        "--codec {0} with --sync sandblaster: L-BFGS needs exact batch gradients; drop --codec"
    )]
    SandblasterCodec(CodecConfig),
    /// A flag Sandblaster does not take.
    #[error(
        "{0} does not apply to --sync sandblaster (batch L-BFGS with a line search; see \
         --sb-iters, --sb-history, --sb-batch, --sb-unit)"
    )]
    SandblasterFlag(&'static str),
    /// A zero Sandblaster count.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// Too long an L-BFGS history.
    #[error("--sb-history must be at most 512 (the shards keep 2m vectors)")]
    History,
}

/// The all-reduce engine's settings, each with whether it was given: no parameter-server
/// mode takes them.
fn all_reduce_flags(cx: &PlanContext<'_>) -> [(&'static str, bool); 5] {
    let t = cx.flags;
    [
        ("--rule", !t.rules.is_empty()),
        ("--timeline", t.timeline.is_some()),
        ("--link", t.link.is_some() || cx.link),
        ("--fusion-bytes", t.fusion_bytes.is_some()),
        ("--threads-as-workers", cx.threads_as_workers),
    ]
}

/// Checks the PS flags against the mode and the rest of the plan; `None` without a PS mode.
pub fn plan(mode: Option<PsMode>, cx: &PlanContext<'_>) -> Result<Option<PsPlan>, PsError> {
    let a = cx.ps;
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
            return Err(PsError::NeedsPs(flag));
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
    if let Some((flag, _)) = all_reduce_flags(cx).into_iter().find(|(_, g)| *g) {
        return Err(PsError::AllReduceFlag { flag, mode });
    }
    let downpour = a.n_fetch.is_some() || a.n_push.is_some() || a.local_lr.is_some();
    if downpour && consistency == Consistency::Sync {
        return Err(PsError::DownpourUnderSync);
    }
    if a.dead_policy.is_some() && consistency == Consistency::Async {
        return Err(PsError::DeadPolicyUnderAsync);
    }
    let (n_fetch, n_push) = (a.n_fetch.unwrap_or(1), a.n_push.unwrap_or(1));
    if n_fetch == 0 || n_push == 0 {
        return Err(PsError::ZeroPeriod);
    }
    let optimizer = downpour_default(cx, consistency).unwrap_or_else(|| cx.optimizer.clone());
    let updater =
        mirror_optimizer(&optimizer).map_err(|source| PsError::Updater { mode, source })?;
    let local_lr = match a.local_lr {
        Some(l) if !(l.is_finite() && l >= 0.0) => return Err(PsError::LocalLr(l)),
        Some(l) => l as f32,
        None => match optimizer.kind {
            OptimizerKind::Sgd { .. } => optimizer.lr as f32,
            _ => 0.0,
        },
    };
    if a.ps_servers.is_empty() && cx.launched {
        return Err(PsError::LaunchedWithoutShards(mode));
    }
    let servers = server_count(a, cx.tables)?;
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
/// `--optimizer` nor the settings file names an optimizer: the default momentum SGD, applied
/// by the shards to every stale worker's push, multiplies the step and diverged. The rate is
/// `--lr` (or the file's `lr`) if given, else [`DOWNPOUR_ADAGRAD_LR`]. `None` for other
/// modes, or when the user chose the optimizer (momentum SGD stays available by name:
/// `--optimizer sgd:lr=0.05,momentum=0.9`).
pub fn downpour_default(cx: &PlanContext<'_>, consistency: Consistency) -> Option<OptimizerConfig> {
    let (file_optimizer, file_lr) = cx.file_names;
    if consistency != Consistency::Async || cx.flags.optimizer.is_some() || file_optimizer {
        return None;
    }
    let lr = if cx.flags.lr.is_some() || file_lr {
        cx.optimizer.lr
    } else {
        DOWNPOUR_ADAGRAD_LR
    };
    Some(OptimizerConfig::adagrad(lr))
}

/// The push codec of a PS run from `--codec` or `--push-codec` (error feedback forced on),
/// or why it cannot work.
fn push_codec(
    codec: &CodecConfig,
    push: Option<&PushCodec>,
    mode: PsMode,
) -> Result<PushCodec, PsError> {
    let chosen = match push {
        Some(p) => {
            if codec.id() != CodecId::None {
                return Err(PsError::TwoCodecs {
                    codec: codec.clone(),
                    push: p.clone(),
                });
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
        CodecId::PowerSgd => return Err(PsError::PowerSgd { codec: c, mode }),
        CodecId::Dgc => return Err(PsError::Dgc { codec: c, mode }),
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
    match spec.parse::<CodecConfig>() {
        Ok(c) => Ok(PushCodec::Codec(c)),
        Err(source) => Err(PsError::ErrorFeedback { spec, source }),
    }
}

/// The shard count: the length of `--ps-servers` (which `--servers` times `tables`, if
/// given, must match), else `--servers` (default 1, shards per table: `tables` is the
/// partition count under `--model-parallel`, else 1); between 1 and 64 in all.
fn server_count(a: &PsSettings, tables: usize) -> Result<usize, PsError> {
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
            return Err(PsError::ServerCount {
                servers: s,
                per,
                given: a.ps_servers.len(),
            });
        }
        a.ps_servers.len()
    };
    if !(1..=64).contains(&servers) || (a.ps_servers.is_empty() && servers * tables > 64) {
        return Err(PsError::ServerBounds);
    }
    Ok(servers)
}

/// Refuses a `--sb-*` flag outside `--sync sandblaster`.
fn sb_flags_need_sandblaster(a: &PsSettings, mode: Option<PsMode>) -> Result<(), PsError> {
    let given = [
        ("--sb-iters", a.sb_iters.is_some()),
        ("--sb-history", a.sb_history.is_some()),
        ("--sb-batch", a.sb_batch.is_some()),
        ("--sb-unit", a.sb_unit.is_some()),
        ("--sb-no-backups", a.sb_no_backups),
    ];
    match given.iter().find(|(_, g)| *g) {
        Some((flag, _)) => Err(PsError::NeedsSandblaster {
            flag,
            with: mode.map_or(String::new(), |m| format!(", not --sync {m}")),
        }),
        None => Ok(()),
    }
}

/// Checks the flags of `--sync sandblaster`.
fn plan_sandblaster(cx: &PlanContext<'_>) -> Result<Option<PsPlan>, PsError> {
    let (t, a) = (cx.flags, cx.ps);
    if cx.launched || cx.worker {
        return Err(PsError::SandblasterLaunched);
    }
    if a.push_codec.is_some() {
        return Err(PsError::SandblasterPushCodec);
    }
    if cx.codec.id() != CodecId::None {
        return Err(PsError::SandblasterCodec(cx.codec.clone()));
    }
    let refused = [
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
    .find(|(_, given)| *given);
    if let Some((flag, _)) = refused {
        return Err(PsError::SandblasterFlag(flag));
    }
    let positive = |flag: &'static str, v: Option<usize>| match v {
        Some(0) => Err(PsError::Zero(flag)),
        _ => Ok(v),
    };
    let iters = positive("--sb-iters", a.sb_iters)?.unwrap_or(10);
    let history = positive("--sb-history", a.sb_history)?.unwrap_or(10);
    if history > 512 {
        return Err(PsError::History);
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
