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

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::str::FromStr;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use gradwire_codec::{CodecConfig, CodecId};
use gradwire_ps::{Consistency, DeadPolicy, PushCodec, UpdaterSpec};
use gradwire_train::sync::ps::mirror_optimizer;
use gradwire_train::{
    EvalMode, OptimizerConfig, OptimizerKind, PsConfig, PsSync, StepInfo, SyncStrategy, Trainer,
};

use crate::launch::{describe, spawn_quiet, RankSpec};
use crate::plot::human_bytes;
use crate::ps::{ShardOptions, Shards};
use crate::train::{Plan, TrainArgs};

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
    /// Parameter-server shards to start (with --sync ps-sync, ps-async, ps-ssp:S)
    /// [default: 1].
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
    /// Shards to start (or the number given by `--ps-servers`).
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
    let servers = server_count(a)?;
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
/// The shard count: the length of `--ps-servers` (which `--servers`, if given, must match),
/// else `--servers` (default 1); between 1 and 64.
fn server_count(a: &PsArgs) -> Result<usize> {
    let servers = if a.ps_servers.is_empty() {
        a.servers.unwrap_or(1)
    } else {
        if let Some(s) = a.servers.filter(|&s| s != a.ps_servers.len()) {
            bail!(
                "--servers {s} but --ps-servers names {} shard(s)",
                a.ps_servers.len()
            );
        }
        a.ps_servers.len()
    };
    if !(1..=64).contains(&servers) {
        bail!("--servers must be between 1 and 64");
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
    let servers = server_count(a)?;
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

/// Writes `params` as little-endian f32 to `path`.
pub fn save_params(path: &Path, params: &[f32]) -> Result<()> {
    let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Runs a parameter-server `train` (parent, or one worker).
pub fn run(
    args: &TrainArgs,
    plan: &Plan,
    launched: Option<&gradwire_run::join::Launched>,
) -> Result<()> {
    let ps = plan.ps.as_ref().expect("a ps plan");
    if let Some(l) = launched {
        return run_worker(l.config.rank, l.config.world_size, plan, ps, args.quiet);
    }
    if args.worker {
        bail!("--worker is internal: it needs the environment `gradwire train` sets for its ranks");
    }
    if let Some(sb) = &ps.sb {
        return crate::train_sandblaster::run(plan, ps, sb, args.quiet);
    }
    let mut shards = None;
    let addrs = if ps.addrs.is_empty() {
        let s = Shards::start(ps.servers, plan.workers, &ShardOptions::for_run(&plan.out))?;
        let a = s.addrs.clone();
        shards = Some(s);
        a
    } else {
        ps.addrs.clone()
    };
    let mut ps_run = ps.clone();
    ps_run.addrs = addrs.clone();
    if plan.workers == 1 {
        return run_worker(0, 1, plan, &ps_run, args.quiet);
    }
    std::fs::create_dir_all(&plan.out)
        .with_context(|| format!("creating {}", plan.out.display()))?;
    for r in 0..plan.workers {
        let _ = std::fs::remove_file(worker_file(&plan.out, r));
    }
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
    let mut child_args: Vec<String> = std::env::args().skip(1).collect();
    child_args.push("--worker".into());
    child_args.push(format!(
        "--ps-servers={}",
        addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    ));
    let spec = RankSpec {
        np: plan.workers,
        master: None,
        timeout: None,
        program: exe.display().to_string(),
        args: child_args,
    };
    let statuses = spawn_quiet(&spec)?.wait_all()?;
    let restarts = shards.as_ref().map_or_else(Vec::new, Shards::restarts);
    drop(shards);
    let lost: Vec<(usize, ExitStatus)> = statuses
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.success())
        .map(|(r, s)| (r, *s))
        .collect();
    for (r, s) in &lost {
        // Killed by a signal: lost; an exit code: it failed (its own error says why).
        let what = if s.code().is_none() {
            "was lost"
        } else {
            "failed"
        };
        eprintln!("gradwire train: worker {r} {what} ({})", describe(*s));
    }
    if let Some((_, s)) = lost.iter().find(|(r, _)| *r == 0) {
        bail!("worker 0 failed ({}): no report", describe(*s));
    }
    if ps.consistency == Consistency::Sync
        && ps.dead_policy == DeadPolicy::Strict
        && !lost.is_empty()
    {
        bail!(
            "worker {} failed under ps-sync ({})",
            lost[0].0,
            describe(lost[0].1)
        );
    }
    if !lost.is_empty() {
        eprintln!(
            "gradwire train: the other workers trained on without them (--sync {})",
            PsMode::Table(ps.consistency)
        );
    }
    merge_worker_reports(&plan.out, plan.workers, &lost, &restarts)
}

fn worker_file(out: &Path, rank: usize) -> PathBuf {
    out.join(format!("ps-worker-{rank}.json"))
}

/// Adds every finished worker's summary, the lost workers and each shard's restarts to
/// rank 0's run.json.
fn merge_worker_reports(
    out: &Path,
    workers: usize,
    lost: &[(usize, ExitStatus)],
    restarts: &[u32],
) -> Result<()> {
    let path = out.join("run.json");
    let mut run: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("parsing {}", path.display()))?;
    let mut reports = Vec::new();
    let (mut pushed, mut pulled) = (0u64, 0u64);
    for r in 0..workers {
        if let Ok(text) = std::fs::read_to_string(worker_file(out, r)) {
            let v: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", worker_file(out, r).display()))?;
            pushed += v["bytes_pushed"].as_u64().unwrap_or(0);
            pulled += v["bytes_pulled"].as_u64().unwrap_or(0);
            reports.push(v);
        }
    }
    let ps = &mut run["ps"];
    ps["workers"] = serde_json::json!(reports);
    ps["workers_lost"] = serde_json::json!(lost
        .iter()
        .map(|(r, s)| serde_json::json!({"rank": r, "status": describe(*s)}))
        .collect::<Vec<_>>());
    ps["shard_restarts"] = serde_json::json!(restarts);
    ps["bytes_pushed_all"] = pushed.into();
    ps["bytes_pulled_all"] = pulled.into();
    std::fs::write(&path, serde_json::to_string_pretty(&run)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// One worker: trains against the shards; rank 0 reports.
fn run_worker(rank: usize, world: usize, plan: &Plan, ps: &PsPlan, quiet: bool) -> Result<()> {
    gradwire_train::init_threads(plan.threads);
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .with_context(|| format!("worker {rank}: loading {}", plan.dataset.name()))?;
    let model = plan.model.build(data.shape(), plan.train.seed)?;
    let cfg = PsConfig {
        n_fetch: ps.n_fetch,
        n_push: ps.n_push,
        local_lr: ps.local_lr,
        dead_policy: ps.dead_policy,
        codec: ps.codec.clone(),
        ..PsConfig::new(ps.addrs.clone(), ps.consistency, ps.updater)
    };
    let sync = PsSync::connect(rank, world, model.num_params(), cfg)
        .with_context(|| format!("worker {rank}: connecting to the shards"))?;
    let mode = PsMode::Table(ps.consistency).to_string();
    eprintln!(
        "gradwire train: ps worker {rank}/{world} connected to {} shard(s)",
        ps.addrs.len()
    );
    let mut train = plan.train.clone();
    train.optimizer = ps.optimizer.clone();
    train.eval = if ps.consistency == Consistency::Sync {
        EvalMode::Sharded
    } else {
        EvalMode::Rank0
    };
    let mut trainer = Trainer::new(model, sync, train, data.train.len())
        .with_context(|| format!("worker {rank}: initializing the parameter table"))?;
    let steps = trainer.steps_per_epoch(data.train.len());
    let reporting = rank == 0;
    if reporting {
        eprintln!(
            "gradwire train: {} on {} ({} train / {} held out), {world} worker(s), {} shard(s), --sync {mode}, server updater {}, pushes {}{}, {} steps/epoch x {} epochs, batch {} per worker",
            plan.model.name(),
            plan.dataset.name(),
            data.train.len(),
            data.test.len(),
            ps.addrs.len(),
            ps.updater,
            ps.codec,
            if ps.n_fetch > 1 || ps.n_push > 1 {
                format!(", n_fetch {} n_push {} local lr {}", ps.n_fetch, ps.n_push, ps.local_lr)
            } else {
                String::new()
            },
            steps,
            plan.train.epochs,
            plan.train.batch_size
        );
        if ps.consistency != Consistency::Sync && matches!(ps.updater, UpdaterSpec::Momentum { .. })
        {
            eprintln!(
                "gradwire train: warning: under --sync {mode} the shards apply every worker's push \
                 with momentum, so {world} stale workers take steps up to {world}/(1-mu) times \
                 larger than one; if it diverges use --optimizer adagrad:lr=... (DistBelief's \
                 Downpour) or plain SGD"
            );
        }
        std::fs::create_dir_all(&plan.out)
            .with_context(|| format!("creating {}", plan.out.display()))?;
        let _ = std::fs::remove_file(plan.out.join("metrics.jsonl"));
    }
    let mut run = plan.run_record(world, steps);
    // The PS path has no momentum correction (the shards run the optimizer).
    run.momentum_correction = None;
    run.codec = ps.codec.to_string();
    let mut total_steps = 0u64;
    let mut last = String::new();
    for epoch in 0..plan.train.epochs {
        let bar = (reporting && !quiet)
            .then(|| crate::train::progress_bar(steps, epoch, plan.train.epochs));
        let start = Instant::now();
        let pulled0 = trainer.sync().bytes().1;
        let mut on_step = |s: &StepInfo| {
            if let Some(b) = &bar {
                b.set_position(s.step as u64 + 1);
                let ms = start.elapsed().as_secs_f64() * 1e3 / (s.step + 1) as f64;
                b.set_message(format!("loss {:.4}{last} | {ms:.0} ms/step", s.loss));
            }
        };
        let stats = trainer
            .run_epoch(&data, &mut on_step)
            .with_context(|| format!("worker {rank}, epoch {}", epoch + 1))?;
        total_steps += steps as u64;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if reporting {
            let rec = crate::train::record(&stats);
            last = rec
                .test_accuracy
                .map_or(String::new(), |a| format!(" | acc {:.2}%", a * 100.0));
            let mut line = serde_json::to_value(&rec)?;
            line["servers"] = ps.addrs.len().into();
            line["mode"] = mode.clone().into();
            line["bytes_pulled"] = trainer.sync().bytes().1.saturating_sub(pulled0).into();
            println!("{}", serde_json::to_string(&line)?);
            eprintln!(
                "epoch {}/{}: loss {:.4}{last} | {:.1} s (compute {:.1}, ps {:.1}) | pushed {} pulled {}",
                rec.epoch,
                plan.train.epochs,
                rec.train_loss,
                rec.wall_s,
                rec.compute_s,
                rec.comm_s,
                human_bytes(rec.bytes_sent as f64),
                human_bytes(line["bytes_pulled"].as_f64().unwrap_or(0.0))
            );
            append_line(&plan.out.join("metrics.jsonl"), &line)?;
            if let Some(j) = &plan.json {
                append_line(j, &line)?;
            }
            run.epochs.push(rec);
        }
    }
    if reporting {
        if let Some(p) = &plan.save_params {
            save_params(p, trainer.params())?;
        }
    }
    let (_, sync) = trainer.into_parts();
    let (pushed, pulled) = sync.bytes();
    let (pushes, pulls) = sync.ops();
    sync.leave()
        .with_context(|| format!("worker {rank}: leaving the shards"))?;
    let summary = serde_json::json!({
        "rank": rank,
        "steps": total_steps,
        "pushes": pushes,
        "pulls": pulls,
        "bytes_pushed": pushed,
        "bytes_pulled": pulled,
    });
    eprintln!(
        "gradwire train: ps worker {rank} finished: {total_steps} steps, {pushes} pushes, {pulls} pulls, pushed {} pulled {}",
        human_bytes(pushed as f64),
        human_bytes(pulled as f64)
    );
    if world > 1 {
        std::fs::create_dir_all(&plan.out).ok();
        std::fs::write(worker_file(&plan.out, rank), summary.to_string() + "\n")
            .with_context(|| format!("writing {}", worker_file(&plan.out, rank).display()))?;
    }
    if reporting {
        crate::train::write_run(&run, &plan.out)?;
        let path = plan.out.join("run.json");
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        v["ps"] = serde_json::json!({
            "mode": mode,
            "servers": ps.addrs.len(),
            "updater": ps.updater.to_string(),
            "codec": ps.codec.to_string(),
            "n_fetch": ps.n_fetch,
            "n_push": ps.n_push,
            // Through its shortest decimal form, so 0.05 reads 0.05 and not 0.0500000007.
            "local_lr": ps.local_lr.to_string().parse::<f64>().unwrap_or(0.0),
            "bytes_pushed": pushed,
            "bytes_pulled": pulled,
            "rank0": summary,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&v)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("gradwire train: wrote {}", plan.out.display());
    }
    Ok(())
}

fn append_line(path: &Path, v: &serde_json::Value) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{v}").with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::Host;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TrainArgs,
    }

    const ALONE: Host = Host {
        cores: 8,
        launched: None,
    };

    fn plan_of(flags: &[&str]) -> Result<Plan> {
        let a = Cli::try_parse_from(std::iter::once("train").chain(flags.iter().copied()))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .args;
        a.plan(ALONE)
    }

    fn refused(flags: &[&str], words: &[&str]) {
        let e = format!("{:#}", plan_of(flags).unwrap_err());
        for w in words {
            assert!(e.contains(w), "{flags:?}: {e}");
        }
    }

    #[test]
    fn ps_modes_parse_and_mirror_the_optimizer() {
        let p = plan_of(&["--sync", "ps-async", "--workers", "4", "--servers", "2"]).unwrap();
        let ps = p.ps.unwrap();
        assert_eq!(ps.consistency, Consistency::Async);
        assert_eq!((ps.servers, ps.n_fetch, ps.n_push), (2, 1, 1));
        assert!(
            matches!(ps.updater, UpdaterSpec::Adagrad { lr, .. } if lr == 0.01),
            "ps-async defaults to Downpour's Adagrad, not {}",
            ps.updater
        );
        assert_eq!(
            (ps.local_lr, ps.optimizer.clone()),
            (0.0, OptimizerConfig::adagrad(0.01))
        );
        let p = plan_of(&["--sync", "ps-ssp:3", "--optimizer", "adagrad:lr=0.1"]).unwrap();
        let ps = p.ps.unwrap();
        assert_eq!(ps.consistency, Consistency::Ssp { staleness: 3 });
        assert!(matches!(ps.updater, UpdaterSpec::Adagrad { .. }));
        assert_eq!(ps.local_lr, 0.0);
        let p = plan_of(&["--sync", "ps-sync"]).unwrap();
        assert_eq!(p.ps.unwrap().servers, 1);
        let p = plan_of(&["--sync", "sandblaster", "--servers", "2", "--sb-unit", "50"]).unwrap();
        let ps = p.ps.unwrap();
        assert_eq!((ps.mode, ps.servers), (PsMode::Sandblaster, 2));
        let sb = ps.sb.unwrap();
        assert_eq!(
            (sb.iters_per_epoch, sb.history, sb.unit),
            (10, 10, Some(50))
        );
        assert!(sb.backups && sb.batch.is_none());
        assert!(plan_of(&["--sync", "dense"]).unwrap().ps.is_none());
        // Codecs on pushes: error feedback forced on, 2-bit by --push-codec, none is dense.
        let codec_of = |flags: &[&str]| plan_of(flags).unwrap().ps.unwrap().codec.to_string();
        let c = codec_of(&["--sync", "ps-async", "--codec", "qsgd:bits=4"]);
        assert!(c.starts_with("qsgd") && c.contains("ef=true"), "{c}");
        let c = codec_of(&["--sync", "ps-sync", "--codec", "topk:ratio=0.1,ef=false"]);
        assert!(c.contains("ef=true") && !c.contains("ef=false"), "{c}");
        let c = codec_of(&["--sync", "ps-ssp:2", "--push-codec", "2bit:threshold=0.25"]);
        assert!(c.starts_with("2bit") && c.contains("0.25"), "{c}");
        assert_eq!(codec_of(&["--sync", "ps-sync", "--codec", "none"]), "dense");
    }

    #[test]
    fn ps_async_defaults_to_adagrad_and_keeps_a_named_optimizer() {
        let updater = |flags: &[&str]| plan_of(flags).unwrap().ps.unwrap().updater;
        let adagrad_at = |u: UpdaterSpec| match u {
            UpdaterSpec::Adagrad { lr, .. } => Some(lr),
            _ => None,
        };
        assert_eq!(adagrad_at(updater(&["--sync", "ps-async"])), Some(0.01));
        assert_eq!(
            adagrad_at(updater(&["--sync", "ps-async", "--lr", "0.02"])),
            Some(0.02),
            "--lr sets the default Adagrad's rate"
        );
        assert_eq!(
            updater(&[
                "--sync",
                "ps-async",
                "--optimizer",
                "sgd:lr=0.05,momentum=0.9"
            ]),
            UpdaterSpec::Momentum { lr: 0.05, mu: 0.9 },
            "momentum SGD by name"
        );
        // The other modes keep mirroring the run's optimizer.
        for mode in ["ps-sync", "ps-ssp:2"] {
            assert_eq!(
                updater(&["--sync", mode]),
                UpdaterSpec::Momentum { lr: 0.05, mu: 0.9 },
                "{mode}"
            );
        }
        // An optimizer in the --config file is the user's choice too.
        let dir = std::env::temp_dir().join(format!("gw-ps-default-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("train.toml");
        std::fs::write(&file, "optimizer = \"sgd:lr=0.03,momentum=0.5\"\n").unwrap();
        let f = file.to_str().unwrap();
        assert_eq!(
            updater(&["--sync", "ps-async", "--config", f]),
            UpdaterSpec::Momentum { lr: 0.03, mu: 0.5 }
        );
        std::fs::write(&file, "lr = 0.004\n").unwrap();
        assert_eq!(
            adagrad_at(updater(&["--sync", "ps-async", "--config", f])),
            Some(0.004)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_ps_flag_combinations_are_refused_by_name() {
        refused(&["--servers", "2"], &["--servers", "ps-sync"]);
        refused(&["--n-fetch", "3", "--sync", "dense"], &["--n-fetch"]);
        refused(
            &["--sync", "ps-sync", "--n-push", "2"],
            &["Downpour", "ps-async"],
        );
        refused(
            &["--sync", "sandblaster", "--optimizer", "adam:lr=0.001"],
            &["--optimizer", "sandblaster"],
        );
        refused(&["--sync", "ps-sync", "--sb-iters", "3"], &["--sb-iters"]);
        refused(
            &["--sync", "sandblaster", "--sb-history", "0"],
            &["--sb-history"],
        );
        refused(
            &["--sync", "ps-async", "--codec", "powersgd"],
            &["--codec", "PowerSGD", "all-reduce"],
        );
        refused(
            &["--sync", "ps-sync", "--codec", "dgc"],
            &["DGC", "momentum"],
        );
        refused(
            &[
                "--sync",
                "ps-sync",
                "--codec",
                "qsgd",
                "--push-codec",
                "2bit",
            ],
            &["--push-codec", "one of them"],
        );
        refused(&["--push-codec", "2bit"], &["--push-codec", "ps-sync"]);
        refused(
            &["--sync", "sandblaster", "--codec", "qsgd"],
            &["--codec", "sandblaster"],
        );
        refused(
            &["--sync", "ps-async", "--optimizer", "sgd:lr=0.1,wd=0.0001"],
            &["weight decay"],
        );
        refused(&["--sync", "ps-sync", "--servers", "0"], &["--servers"]);
        refused(
            &["--sync", "ps-sync", "--timeline", "t.json"],
            &["--timeline", "all-reduce"],
        );
        refused(
            &["--sync", "ps-async", "--dead-policy", "shrink"],
            &["--dead-policy"],
        );
        let e = Cli::try_parse_from(["train", "--sync", "ps-bogus"])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("ps-async"), "{e}");
    }
}
