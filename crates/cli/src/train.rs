//! `gradwire train`: data-parallel training of a real model on real data with any codec.
//!
//! Runs as the parent of `--workers` rank processes (TCP on loopback), or as one rank when a
//! launcher set the environment (`gradwire launch`, mpirun, srun, torchrun). Rank 0 shows a
//! progress bar and, per epoch, appends one JSON line (`epoch`, `train_loss`,
//! `test_accuracy` or `val_perplexity`, `wall_s`, `compute_s`, `comm_s`, `bytes_sent`,
//! `compression_ratio`); at the end it writes `run.json` and the plots into `--out`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use gradwire_codec::CodecConfig;
use gradwire_train::data::{default_data_dir, DatasetKind};
use gradwire_train::{
    EngineConfig, EngineSync, EpochStats, GradientSync, ModelKind, MomentumConfig, OptimizerConfig,
    OptimizerKind, Rule, StepInfo, SyncStrategy, TrainConfig, Trainer,
};
use gradwire_transport::link::{LinkConfig, Throttled};
use gradwire_transport::local::Local;
use gradwire_transport::Transport;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use crate::launch::{describe, spawn_quiet, RankSpec};
use crate::plot::human_bytes;
use crate::records::{append_jsonl, EpochRecord, RunRecord};

pub use gradwire_run::rules::{ClipScope, MomentumMode};

/// Arguments of `gradwire train` (each may also come from `--config FILE.toml`, same keys).
/// Values are parsed here, at the edge: a bad one is refused with the allowed values.
#[derive(Args, Debug, Clone, Default)]
pub struct TrainArgs {
    /// TOML file with any of these settings (flags given on the command line win).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Model: mlp, mlp:hidden=2048x3 (hidden widths; mlp:wide is 784-2048x3-10), lenet,
    /// resnet, lstm (hidden 256; lstm:hidden=128 for another size) [default: lenet].
    #[arg(long)]
    pub model: Option<ModelKind>,
    /// Data set: fashion-mnist, mnist, shakespeare, cifar10 [default: fashion-mnist, or
    /// shakespeare for lstm].
    #[arg(long)]
    pub dataset: Option<DatasetKind>,
    /// Number of worker processes (data-parallel ranks) to start [default: 1]. Under a
    /// launcher (gradwire launch, mpirun, srun, torchrun) the launcher's world size is used.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Gradient codec spec, e.g. none, fp16, onebit, topk:ratio=0.01, qsgd:bits=4,
    /// dgc:ratio=0.001 [default: none]. `auto` chooses per tensor, from --auto-codecs, the
    /// codec (or none) the cost model predicts to be fastest over this job's link and world
    /// size; run.json records the choice and the predictions (`codec_choice`).
    #[arg(long)]
    pub codec: Option<crate::auto_codec::CodecArg>,
    /// The candidates of `--codec auto`, comma-separated [default: the codecs within 0.5
    /// points of dense in paper mode under the job's optimizer: none,fp16,qsgd:bits=4, and
    /// onebit too under AdaGrad or SGD without momentum]; others with measured costs:
    /// terngrad, topk:ratio=0.01.
    #[arg(long, value_name = "LIST")]
    pub auto_codecs: Option<String>,
    /// How gradients are reduced: auto (from the codec), dense, gather, quantized, sparse
    /// [default: auto]; or a parameter server: ps-sync, ps-async (Downpour), ps-ssp:S
    /// (see --servers), sandblaster (DistBelief's batch L-BFGS: one epoch is --sb-iters
    /// L-BFGS steps over the --sb-batch full batch).
    #[arg(long)]
    pub sync: Option<crate::train_ps::SyncMode>,
    /// A per-tensor codec rule, `SELECTOR=>CODEC[@STRATEGY]`, first match wins; selectors
    /// `name=GLOB`, `min=N`, `max=N` (elements), `dims=D`. Repeatable. Example: `--rule
    /// 'dims=1=>none' --rule 'name=fc3.*=>fp16'`. Tensors no rule matches take --codec.
    #[arg(long = "rule", value_name = "RULE")]
    pub rules: Vec<Rule>,
    /// Fuse ready tensors of one policy into buffers of at most this many bytes (0: off)
    /// [default: 4194304].
    #[arg(long)]
    pub fusion_bytes: Option<usize>,
    /// Emulate a network link between the ranks: `BANDWIDTH[,LATENCY][,jitter=D]`, e.g.
    /// `1gbit,50us` or `100mbit,1ms`; `;rankN=100mbit` makes rank N the slow one. Also read
    /// from GRADWIRE_LINK (and GRADWIRE_LINK_RANK_N) when not given.
    #[arg(long, value_name = "SPEC")]
    pub link: Option<LinkConfig>,
    /// Write a Chrome trace of every rank's step phases and tensor operations (open it in
    /// Perfetto): FILE merged, FILE with `.rankN` before its extension per rank, and one
    /// step drawn as FILE with the extension `.png`.
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// Momentum correction (DGC, sections 3.2 and 3.3). `auto` (the default) follows each
    /// paper: the optimizer applies momentum after aggregation for every codec but DGC,
    /// whose momentum correction is part of the method. `on` uses it for every codec (SGD
    /// with momentum only): each worker folds momentum into its gradient before the codec,
    /// zeroes it where a sparsifying codec sent (momentum factor masking), and the optimizer
    /// keeps momentum for weight decay alone (the DGC reference optimizer). `off` equals
    /// `auto` (DGC always owns its momentum).
    #[arg(long, value_enum)]
    pub momentum_correction: Option<MomentumMode>,
    /// Run DGC under an adaptive optimizer (Adam, Adagrad) anyway. Refused by default: the
    /// per-coordinate normalisation turns DGC's accumulated sparse update into one ordinary
    /// step, losing the accumulation (the char-LSTM report measured +71% perplexity).
    #[arg(long)]
    pub allow_dgc_adaptive: bool,
    /// Where the optimizer's `clip=C` applies. `global` (the default): to the aggregated
    /// gradient, as on one machine, except for DGC, whose paper clips each worker's gradient
    /// at C/sqrt(N) before accumulation. `local`: that for every codec (and dense), so error
    /// feedback keeps what a clip of the aggregate would cut: a sparsifier's aggregate
    /// carries residuals of many steps, and clipping it loses them. Needs `clip=C` in the
    /// optimizer.
    #[arg(long, value_enum)]
    pub clip_scope: Option<ClipScope>,
    /// Epochs to train [default: 1].
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Base learning rate (overrides the optimizer spec's).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Optimizer spec, e.g. `sgd:lr=0.05,momentum=0.9` or `adam:lr=1e-3` (default per model).
    #[arg(long)]
    pub optimizer: Option<OptimizerConfig>,
    /// Samples per step on each worker [default: 64, or 32 for lstm].
    #[arg(long)]
    pub batch: Option<usize>,
    /// Seed of initialization, shuffles and stochastic codecs (a run repeats exactly)
    /// [default: 42].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Cap on steps per epoch (for short runs).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Cap on held-out samples evaluated per epoch.
    #[arg(long)]
    pub eval_limit: Option<usize>,
    /// 1: one-step-stale double buffering (CNTK's 1-bit SGD): step t's gradient is averaged
    /// while step t+1's forward/backward runs, and applied one step late — a deviation from
    /// synchronous SGD, which needs a smaller learning rate with momentum (LeNet: lr 0.02 at
    /// momentum 0.9). 0 (default): synchronous.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub overlap_steps: Option<u8>,
    /// Characters per training sequence (language models) [default: 64].
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Compute threads per worker (default: the host's cores divided among the ranks on it).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where the data sets are (default: $GRADWIRE_DATA, else ./data).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Append each epoch's JSON line to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Directory for metrics.jsonl, run.json and the plots (default out/<model>-<codec>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write a checkpoint every N steps (0: never) under `OUT/checkpoints/`: one file per
    /// rank (parameters, optimizer and engine state, position in the run, configuration),
    /// and `step-<S>.complete` once every rank's is written; the two newest complete ones
    /// are kept. Not with parameter servers or --overlap-steps 1.
    #[arg(long, value_name = "N")]
    pub checkpoint_every: Option<u64>,
    /// Continue the run whose --out folder is DIR from its newest complete checkpoint (same
    /// settings and world size; refused otherwise), ending bit for bit where the
    /// uninterrupted run would. --out defaults to DIR.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Run the workers as threads of this process instead of processes (`--transport
    /// local` does the same).
    #[arg(long)]
    pub threads_as_workers: bool,
    /// The transport between the ranks (help text: `join::TRANSPORT_HELP`).
    #[arg(long, value_enum, default_value = "auto", help = gradwire_run::join::TRANSPORT_HELP)]
    pub transport: gradwire_run::join::TransportKind,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Internal: this process is one rank started by the parent.
    #[arg(long, hide = true)]
    pub worker: bool,
    /// Parameter-server settings.
    #[command(flatten)]
    pub ps: crate::train_ps::PsArgs,
    /// Model-parallel settings.
    #[command(flatten)]
    pub mp: crate::train_parallel::ModelParallelArgs,
    /// Elastic settings.
    #[command(flatten)]
    pub elastic: crate::train_elastic::ElasticArgs,
}

/// The same settings as read from a TOML file (parsed with the same rules as the flags).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrainFile {
    model: Option<String>,
    dataset: Option<String>,
    workers: Option<usize>,
    codec: Option<String>,
    sync: Option<String>,
    rules: Option<Vec<String>>,
    fusion_bytes: Option<usize>,
    timeline: Option<PathBuf>,
    link: Option<String>,
    momentum_correction: Option<MomentumMode>,
    allow_dgc_adaptive: Option<bool>,
    clip_scope: Option<ClipScope>,
    epochs: Option<usize>,
    lr: Option<f64>,
    optimizer: Option<String>,
    batch: Option<usize>,
    seed: Option<u64>,
    max_steps: Option<usize>,
    eval_limit: Option<usize>,
    seq_len: Option<usize>,
    threads: Option<usize>,
    data: Option<PathBuf>,
    json: Option<PathBuf>,
    out: Option<PathBuf>,
    checkpoint_every: Option<u64>,
}

/// Parses one string setting of the TOML file, naming the file and key on error.
fn from_file<T>(file: &str, key: &str, v: Option<String>) -> Result<Option<T>>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Display,
{
    v.map(|s| {
        s.parse::<T>()
            .map_err(|e| anyhow::anyhow!("{file}: {key} = {s:?}: {e}"))
    })
    .transpose()
}

/// Validated settings of a run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The model.
    pub model: ModelKind,
    /// The data set.
    pub dataset: DatasetKind,
    /// Ranks: data-parallel workers, times the partitions per replica under model
    /// parallelism.
    pub workers: usize,
    /// Model parallelism: each replica split over this many ranks, if asked for.
    pub model_parallel: Option<crate::train_parallel::ModelParallel>,
    /// The codec spec (canonical).
    pub codec: CodecConfig,
    /// Reduction strategy of tensors no rule matches.
    pub sync: SyncStrategy,
    /// Per-tensor codec rules.
    pub rules: Vec<Rule>,
    /// Fusion buffer size in bytes.
    pub fusion_bytes: usize,
    /// Where the merged timeline goes.
    pub timeline: Option<PathBuf>,
    /// The emulated link, if any.
    pub link: Option<LinkConfig>,
    /// Momentum correction in the sync: `(beta, nesterov)` taken from the optimizer.
    pub momentum_correction: Option<(f64, bool)>,
    /// Trainer settings.
    pub train: TrainConfig,
    /// Sequence length for text.
    pub seq_len: usize,
    /// Compute threads per worker.
    pub threads: usize,
    /// Data directory.
    pub data: PathBuf,
    /// JSON-lines file.
    pub json: Option<PathBuf>,
    /// Output directory.
    pub out: PathBuf,
    /// The parameter-server run, when --sync names a PS mode.
    pub ps: Option<crate::train_ps::PsPlan>,
    /// Where rank 0 writes its final parameters.
    pub save_params: Option<PathBuf>,
    /// What `--codec auto` chose (its rules are in `rules`, after the user's).
    pub codec_choice: Option<crate::auto_codec::Choice>,
    /// Steps between checkpoints (0: none).
    pub checkpoint_every: u64,
    /// The `--out` folder of the run to continue.
    pub resume: Option<PathBuf>,
    /// Elastic training, if asked for.
    pub elastic: Option<crate::train_elastic::Elastic>,
}

impl Plan {
    /// A warning for a combination the reports found to train badly, if this is one: 1-bit
    /// SGD or adaptive quantization (error feedback on both legs of the stripes) under SGD
    /// whose momentum is applied after aggregation. The wide MLP fell to 17% with 1-bit SGD at
    /// momentum 0.9, and LeNet ended 2.9 (1-bit) and 54 (adaptive) points under dense, while
    /// under AdaGrad, the optimizer of Seide et al., both tracked dense (docs/fidelity.md).
    /// `--codec` and every `--rule` count (a rule sending some tensors through 1-bit SGD
    /// trains those tensors the same way).
    pub(crate) fn momentum_warning(&self) -> Option<String> {
        let name = std::iter::once(&self.codec)
            .chain(self.rules.iter().map(|r| &r.codec))
            .find_map(|c| match c {
                CodecConfig::OneBit(_) => Some("1-bit SGD (onebit)"),
                CodecConfig::Adaptive(_) => Some("adaptive quantization"),
                _ => None,
            })?;
        let (beta, _) = self.train.optimizer.sgd_momentum()?;
        Some(format!(
            "{name} under SGD with momentum {beta} applied after aggregation trains badly or \
             diverges here (the mass its error feedback holds back returns in bursts that the \
             momentum repeats; the wide MLP fell to 17%); Seide et al. pair 1-bit SGD with \
             AdaGrad (--optimizer adagrad:lr=0.01 tracked dense on LeNet and the wide MLP); \
             --momentum-correction on or a smaller learning rate also help (docs/fidelity.md)"
        ))
    }

    /// The run's record before its first epoch: setup, seed and provenance.
    pub(crate) fn run_record(&self, world: usize, steps_per_epoch: usize) -> RunRecord {
        RunRecord {
            codec: if self.codec_choice.is_some() {
                "auto".into()
            } else {
                self.codec.to_string()
            },
            model: self.model.to_string(),
            dataset: self.dataset.name().into(),
            workers: world,
            steps_per_epoch,
            epochs: Vec::new(),
            momentum_correction: self.momentum_correction.map(|(beta, _)| beta),
            seed: Some(self.train.seed),
            provenance: Some(crate::records::Provenance::current()),
            engine: None,
            link: self.link.as_ref().map(link_label),
            codec_choice: self
                .codec_choice
                .as_ref()
                .and_then(|c| serde_json::to_value(c).ok()),
            model_parallel: None,
            membership: None,
        }
    }
}

/// What the environment says about where this process runs.
#[derive(Debug, Clone, Copy)]
pub struct Host {
    /// Cores of this host.
    pub cores: usize,
    /// Under a launcher: its world size and the ranks on this host.
    pub launched: Option<(usize, usize)>,
}

impl Host {
    /// This process's host, with the launcher detected from the environment.
    pub fn detect(launched: Option<&gradwire_run::join::Launched>) -> Host {
        Host {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            launched: launched.map(|l| (l.config.world_size, l.local_size)),
        }
    }
}

impl TrainArgs {
    /// Merges the TOML file (if any) under the flags and validates everything before any
    /// thread or process starts.
    pub fn plan(&self, host: Host) -> Result<Plan> {
        let file: TrainFile = match &self.config {
            Some(p) => toml::from_str(
                &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            )
            .with_context(|| format!("parsing {}", p.display()))?,
            None => TrainFile::default(),
        };
        let name = self
            .config
            .as_ref()
            .map_or(String::new(), |p| p.display().to_string());
        self.merge(file, &name, host)
    }

    /// Flags over the file's settings over the defaults.
    fn merge(&self, file: TrainFile, name: &str, host: Host) -> Result<Plan> {
        let model = match self.model {
            Some(m) => m,
            None => from_file(name, "model", file.model)?.unwrap_or(ModelKind::LeNet),
        };
        let dataset = match self.dataset {
            Some(d) => d,
            None => {
                from_file(name, "dataset", file.dataset)?.unwrap_or(if model.is_language_model() {
                    DatasetKind::Shakespeare
                } else {
                    DatasetKind::FashionMnist
                })
            }
        };
        let model_parallel = crate::train_parallel::ModelParallel::from_args(&self.mp, model)?;
        let k = model_parallel.map_or(1, |m| m.partitions);
        // Under model parallelism --workers counts replicas, each of K ranks.
        let asked = self.workers.or(file.workers).map(|w| w.saturating_mul(k));
        let workers = match host.launched {
            Some((world, _)) => {
                if let Some(w) = asked.filter(|&w| w != world) {
                    tracing::warn!("--workers {w} ignored: the launcher started {world} ranks");
                }
                world
            }
            None => asked.unwrap_or(k),
        };
        if workers == 0 || (host.launched.is_none() && workers > 64) {
            bail!("--workers must be between 1 and 64 (ranks in all under --model-parallel)");
        }
        if let Some(mp) = &model_parallel {
            mp.replicas(workers)?;
        }
        let dense = CodecConfig::None(gradwire_codec::CastConfig::default());
        let codec_arg = match &self.codec {
            Some(c) => c.clone(),
            None => from_file(name, "codec", file.codec)?
                .unwrap_or(crate::auto_codec::CodecArg::Codec(dense.clone())),
        };
        let auto = codec_arg == crate::auto_codec::CodecArg::Auto;
        let mut codec = match codec_arg {
            crate::auto_codec::CodecArg::Auto => dense,
            crate::auto_codec::CodecArg::Codec(c) => c,
        };
        if !auto && self.auto_codecs.is_some() {
            bail!("--auto-codecs goes with --codec auto");
        }
        let sync = match self.sync {
            Some(s) => s,
            None => from_file(name, "sync", file.sync)?.unwrap_or_default(),
        };
        let (sync, ps_mode) = crate::train_ps::SyncMode::split(sync);
        let rules = if self.rules.is_empty() {
            file.rules
                .unwrap_or_default()
                .into_iter()
                .map(|r| {
                    r.parse::<Rule>()
                        .map_err(|e| anyhow::anyhow!("{name}: rules: {r:?}: {e}"))
                })
                .collect::<Result<Vec<_>>>()?
        } else {
            self.rules.clone()
        };
        // An impossible codec/strategy pair is refused here, before any data loads (rules
        // naming tensors are checked against the model when the engine starts).
        EngineConfig {
            codec: codec.clone(),
            strategy: sync,
            ..EngineConfig::default()
        }
        .plan(&[gradwire_train::sync::probe_tensor()])
        .map_err(|e| anyhow::anyhow!("--codec {codec} with --sync: {e}"))?;
        let epochs = self.epochs.or(file.epochs).unwrap_or(1);
        let batch = self
            .batch
            .or(file.batch)
            .unwrap_or(if model.is_language_model() { 32 } else { 64 });
        if batch == 0 || epochs == 0 {
            bail!("--batch and --epochs must be positive");
        }
        let mut optimizer = match &self.optimizer {
            Some(o) => o.clone(),
            None => from_file(name, "optimizer", file.optimizer)?
                .unwrap_or_else(|| default_optimizer(model)),
        };
        if let Some(lr) = self.lr.or(file.lr) {
            optimizer.lr = lr;
        }
        let mode = self
            .momentum_correction
            .or(file.momentum_correction)
            .unwrap_or_default();
        if auto && mode == MomentumMode::On {
            bail!(
                "--momentum-correction on with --codec auto: the correction is per codec, and \
                 auto mixes codecs per tensor; use --momentum-correction auto"
            );
        }
        let allow_dgc_adaptive = self.allow_dgc_adaptive || file.allow_dgc_adaptive == Some(true);
        let clip_scope = self.clip_scope.or(file.clip_scope).unwrap_or_default();
        let view = gradwire_run::OptimizerView {
            name: optimizer.to_string(),
            is_sgd: matches!(optimizer.kind, OptimizerKind::Sgd { .. }),
            sgd_momentum: optimizer.sgd_momentum(),
            clip_norm: optimizer.clip_norm,
        };
        let resolved = gradwire_run::resolve(
            &codec,
            &view,
            gradwire_run::RuleChoices {
                momentum: mode,
                clip_scope,
                allow_dgc_adaptive,
            },
        )?;
        codec = resolved.codec;
        if let gradwire_run::OptimizerMomentum::Corrected(m) = resolved.optimizer_momentum {
            optimizer = optimizer.momentum_corrected(m);
        }
        optimizer.clip_norm = resolved.optimizer_clip;
        let momentum_correction = resolved.momentum_correction;
        let local_clip = resolved.local_clip;
        optimizer.validate()?;
        let local = host.launched.map_or(workers, |(_, local)| local);
        let threads = self
            .threads
            .or(file.threads)
            .unwrap_or(gradwire_train::threads_per_worker(host.cores, local));
        let train = TrainConfig {
            batch_size: batch,
            epochs,
            seed: self.seed.or(file.seed).unwrap_or(42),
            optimizer,
            max_steps_per_epoch: self.max_steps.or(file.max_steps),
            eval_limit: self.eval_limit.or(file.eval_limit),
            overlap_steps: self.overlap_steps.map_or(0, usize::from),
            local_clip,
            ..TrainConfig::default()
        };
        let out = self
            .out
            .clone()
            .or(file.out)
            .or_else(|| self.resume.clone());
        let out = out.unwrap_or_else(|| {
            PathBuf::from("out").join(format!(
                "{}-{}-{}",
                model.name(),
                dataset.name(),
                codec.name()
            ))
        });
        let mut plan = Plan {
            model,
            dataset,
            workers,
            model_parallel,
            codec,
            sync,
            rules,
            fusion_bytes: self
                .fusion_bytes
                .or(file.fusion_bytes)
                .unwrap_or(EngineConfig::default().fusion_bytes),
            timeline: self.timeline.clone().or(file.timeline),
            link: match &self.link {
                Some(l) => Some(l.clone()),
                None => match from_file(name, "link", file.link)? {
                    Some(l) => Some(l),
                    None => gradwire_transport::link::config_from_env(workers)?,
                },
            },
            momentum_correction,
            train,
            seq_len: self.seq_len.or(file.seq_len).unwrap_or(64),
            threads,
            data: self
                .data
                .clone()
                .or(file.data)
                .unwrap_or_else(default_data_dir),
            json: self.json.clone().or(file.json),
            out,
            ps: None,
            save_params: self.ps.save_params.clone(),
            codec_choice: None,
            checkpoint_every: self.checkpoint_every.or(file.checkpoint_every).unwrap_or(0),
            resume: self.resume.clone(),
            elastic: None,
        };
        if plan.checkpoint_every > 0 || plan.resume.is_some() {
            if ps_mode.is_some() {
                bail!("--checkpoint-every and --resume need the all-reduce engine, not a parameter server");
            }
            if plan.train.overlap_steps != 0 {
                bail!("--checkpoint-every and --resume need synchronous steps (--overlap-steps 0)");
            }
        }
        if let Some(mp) = &plan.model_parallel {
            crate::train_parallel::check_plan(mp, &plan, ps_mode, auto)?;
        }
        if auto {
            if ps_mode.is_some() {
                bail!(
                    "--codec auto chooses codecs for the all-reduce engine, not a parameter server"
                );
            }
            let list = self
                .auto_codecs
                .as_deref()
                .unwrap_or_else(|| crate::auto_codec::default_candidates(&plan.train.optimizer));
            let candidates = crate::auto_codec::candidates(list)?;
            let tensors = model_tensors(plan.model, plan.dataset)?;
            let choice = crate::auto_codec::choose(
                &tensors,
                plan.workers,
                plan.link.as_ref(),
                plan.fusion_bytes,
                &candidates,
            )?;
            tracing::info!(
                "--codec auto over {} at {} workers: {}",
                choice.link,
                plan.workers,
                choice.summary()
            );
            plan.rules.extend(choice.rules()?);
            plan.codec_choice = Some(choice);
        }
        plan.ps = crate::train_ps::plan(
            ps_mode,
            &crate::train_ps::PlanContext {
                args: self,
                codec: &plan.codec,
                optimizer: &plan.train.optimizer,
                launched: host.launched.is_some(),
                link: plan.link.is_some(),
            },
        )?;
        if let (Some(mp), Some(ps)) = (&plan.model_parallel, &plan.ps) {
            crate::train_parallel::check_ps(mp, ps)?;
        }
        plan.elastic = crate::train_elastic::Elastic::from_args(&self.elastic, &plan)?;
        Ok(plan)
    }
}

/// The gradient tensors of `model` on `dataset` (names, shapes, roles), as the engine will
/// see them; image data sets only (a language model's shape needs the text's vocabulary).
fn model_tensors(
    model: ModelKind,
    dataset: DatasetKind,
) -> Result<Vec<gradwire_engine::TensorSpec>> {
    let shape = match dataset {
        DatasetKind::FashionMnist | DatasetKind::Mnist => [1, 28, 28],
        DatasetKind::Cifar10 => [3, 32, 32],
        other => bail!(
            "--codec auto needs an image data set to know the model's tensors; {} is text",
            other.name()
        ),
    };
    let built = model
        .build(
            gradwire_train::data::DataShape::Image { shape, classes: 10 },
            0,
        )
        .with_context(|| format!("building {model} to list its tensors"))?;
    Ok(built
        .tensors()
        .into_iter()
        .map(|t| gradwire_engine::TensorSpec::new(t.name, t.shape).with_role(t.role))
        .collect())
}

/// The optimizer a model trains well with here.
fn default_optimizer(model: ModelKind) -> OptimizerConfig {
    match model {
        ModelKind::CharLstm | ModelKind::CharLstmHidden(_) => {
            let mut o = OptimizerConfig::adam(2e-3);
            o.clip_norm = Some(5.0);
            o
        }
        _ => OptimizerConfig::sgd(0.05, 0.9),
    }
}

/// Runs `gradwire train`.
pub fn run(args: &TrainArgs) -> Result<()> {
    if let Some(dir) = &args.elastic.join {
        return crate::train_elastic::join(dir);
    }
    let launched = gradwire_run::join::detect()?;
    let plan = args.plan(Host::detect(launched.as_ref()))?;
    if let Some(elastic) = &plan.elastic {
        if launched.is_some() {
            bail!("--elastic starts its own workers: run it without a launcher (or under gradwire launch --elastic)");
        }
        let member = gradwire_run::elastic::Member::from_env(std::time::Duration::from_secs(30))
            .context("joining the elastic coordinator")?;
        if let Some(m) = member {
            let threads = args.threads.is_some();
            return crate::train_elastic::run_member(&plan, elastic, m, args.quiet, threads);
        }
        if args.worker {
            bail!("--worker is internal: it needs the environment `gradwire train` sets for its ranks");
        }
        if args.threads_as_workers
            || !matches!(
                args.transport,
                gradwire_run::join::TransportKind::Auto | gradwire_run::join::TransportKind::Tcp
            )
        {
            bail!(
                "--elastic runs its workers as processes over TCP (not --threads-as-workers or --transport {})",
                args.transport.name()
            );
        }
        return crate::train_elastic::run_parent(&plan, elastic);
    }
    if plan.ps.is_some() {
        return crate::train_ps::run(args, &plan, launched.as_ref());
    }
    if let Some(l) = &launched {
        let t = gradwire_run::join::join_with(args.transport, l)?;
        return run_linked(t, &plan, args.quiet);
    }
    if args.worker {
        bail!("--worker is internal: it needs the environment `gradwire train` sets for its ranks");
    }
    gradwire_run::join::check_unlaunched(args.transport)?;
    let local = args.transport == gradwire_run::join::TransportKind::Local;
    if plan.workers == 1 || args.threads_as_workers || local {
        let mut world = Local::world(plan.workers);
        let rest: Vec<_> = world
            .drain(1..)
            .map(|t| {
                let p = plan.clone();
                std::thread::spawn(move || run_linked(t, &p, true))
            })
            .collect();
        let r0 = run_linked(world.pop().expect("rank 0"), &plan, args.quiet);
        for h in rest {
            h.join()
                .map_err(|_| anyhow::anyhow!("a worker thread panicked"))??;
        }
        return r0;
    }
    // One process per worker, this binary again with --worker.
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
    let mut child_args: Vec<String> = std::env::args().skip(1).collect();
    child_args.push("--worker".into());
    let spec = RankSpec {
        np: plan.workers,
        master: None,
        timeout: None,
        program: exe.display().to_string(),
        args: child_args,
    };
    let outcome = spawn_quiet(&spec)?.wait()?;
    if let Some((rank, status)) = outcome.failure {
        bail!(
            "worker {rank} failed ({}); the others were stopped",
            describe(status)
        );
    }
    Ok(())
}

/// Trains on one rank, behind the emulated link when the plan has one. Under model
/// parallelism the world first splits into this rank's replica and partition group (both
/// behind the link), and stays open, unused, until the run ends.
fn run_linked<T: Transport + 'static>(mut t: T, plan: &Plan, quiet: bool) -> Result<()> {
    if let Some(mp) = &plan.model_parallel {
        let crate::train_parallel::RankGroups {
            index,
            replica,
            group,
        } = mp.split_world(&mut t)?;
        let (replica, group): (Box<dyn Transport>, Box<dyn Transport>) = match &plan.link {
            Some(cfg) => (
                Box::new(Throttled::new(replica, cfg)),
                Box::new(Throttled::new(group, cfg)),
            ),
            None => (replica, group),
        };
        let kept = run_rank(group, plan, quiet, Some((index, replica)))?;
        if let Some(path) = &plan.save_params {
            crate::train_parallel::save_whole(&mut t, mp, plan, kept, path)?;
        }
        return Ok(());
    }
    match &plan.link {
        Some(cfg) => run_rank(Throttled::new(t, cfg), plan, quiet, None).map(drop),
        None => run_rank(t, plan, quiet, None).map(drop),
    }
}

/// Trains on one rank over `t`; rank 0 reports. With `partition` (model parallelism: this
/// rank's partition index and its replica's transport), `t` is the partition group and the
/// model is that partition of the whole; partition 0 of replica 0 reports, and replica 0's
/// partitions return their final parameters when the plan saves them.
fn run_rank<T: Transport + 'static>(
    t: T,
    plan: &Plan,
    quiet: bool,
    partition: Option<(usize, Box<dyn Transport>)>,
) -> Result<Option<Vec<f32>>> {
    gradwire_train::init_threads(plan.threads);
    let (rank, world) = (t.rank(), t.world_size());
    let part_index = partition.as_ref().map(|(j, _)| *j);
    let resume = match &plan.resume {
        Some(dir) => Some(crate::train_checkpoint::load(dir, plan, rank, world)?),
        None => None,
    };
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .with_context(|| format!("rank {rank}: loading {}", plan.dataset.name()))?;
    let model = match (partition, &plan.model_parallel) {
        (Some((j, replica)), Some(mp)) => {
            crate::train_parallel::build(mp, plan.model, data.shape(), plan.train.seed, j, replica)?
        }
        _ => plan.model.build(data.shape(), plan.train.seed)?,
    };
    // The engine's schedules (DGC's warm-up in epochs) need at least one step per epoch.
    let steps_guess = gradwire_train::steps_per_epoch(data.train.len(), world, &plan.train).max(1);
    // The host hierarchy is the world's; a partition group's ranks are spread over it.
    let hosts = match part_index {
        None => crate::hier::engine_hosts(rank, world)?,
        Some(_) => None,
    };
    let engine = engine_config(plan, hosts);
    let sync = EngineSync::new(t, engine, &model.tensors(), steps_guess)
        .with_context(|| format!("rank {rank}: starting the engine"))?;
    let mut trainer = Trainer::new(model, sync, plan.train.clone(), data.train.len())?;
    if let Some(ck) = &resume {
        trainer
            .restore(ck)
            .with_context(|| format!("rank {rank}: resuming from step {}", ck.global_step))?;
        crate::train_checkpoint::agree(&mut trainer, ck.global_step)?;
    }
    let steps = trainer.steps_per_epoch(data.train.len());
    let reporting = rank == 0 && part_index.unwrap_or(0) == 0;
    if reporting {
        let workers = match &plan.model_parallel {
            Some(mp) => format!(
                "{world} replica(s) x {} partitions ({})",
                mp.partitions, mp.split
            ),
            None => format!("{world} worker(s)"),
        };
        eprintln!(
            "gradwire train: {} on {} ({} train / {} held out), {workers}, codec {}{}, {} steps/epoch x {} epochs, batch {} per worker",
            plan.model,
            plan.dataset.name(),
            data.train.len(),
            data.test.len(),
            match &plan.codec_choice {
                Some(c) => format!("auto ({})", c.summary()),
                None => plan.codec.to_string(),
            },
            plan.momentum_correction
                .map_or(String::new(), |(b, _)| format!(" (momentum correction {b})")),
            steps,
            plan.train.epochs,
            plan.train.batch_size
        );
        if let Some(w) = plan.momentum_warning() {
            eprintln!("gradwire train: warning: {w}");
        }
    }
    let mut run = plan.run_record(world, steps);
    if reporting {
        record_partition_plan(plan, data.shape(), &mut run)?;
    }
    if reporting {
        // A resumed run's metrics continue the finished epochs' lines (read before
        // metrics.jsonl is started afresh: --out may be the resumed folder).
        let done = match (&resume, &plan.resume) {
            (Some(ck), Some(dir)) => crate::train_checkpoint::finished_epochs(dir, ck.epoch)?,
            _ => Vec::new(),
        };
        std::fs::create_dir_all(&plan.out)
            .with_context(|| format!("creating {}", plan.out.display()))?;
        let _ = std::fs::remove_file(plan.out.join("metrics.jsonl"));
        if !done.is_empty() {
            let lines: String = done.iter().map(|(l, _)| format!("{l}\n")).collect();
            let path = plan.out.join("metrics.jsonl");
            std::fs::write(&path, lines).with_context(|| format!("writing {}", path.display()))?;
        }
        run.epochs = done.into_iter().map(|(_, r)| r).collect();
    }
    if let (Some(ck), Some(dir), true) = (&resume, &plan.resume, reporting) {
        eprintln!(
            "gradwire train: resumed from {} at step {} (epoch {}, step {} of it)",
            dir.display(),
            ck.global_step,
            ck.epoch + 1,
            ck.step_in_epoch
        );
    }
    let (mut ckpt_n, mut ckpt_s) = (0u32, 0.0f64);
    let mut last_acc = String::new();
    let mut total_bytes = 0u64;
    while (trainer.epoch() as usize) < plan.train.epochs {
        let epoch = trainer.epoch() as usize;
        let bar = (reporting && !quiet).then(|| progress_bar(steps, epoch, plan.train.epochs));
        let start = Instant::now();
        let mut epoch_bytes = 0u64;
        let mut on_step = |s: &StepInfo| {
            epoch_bytes += s.sync.bytes_sent;
            if let Some(b) = &bar {
                b.set_position(s.step as u64 + 1);
                let ms = start.elapsed().as_secs_f64() * 1e3 / (s.step + 1) as f64;
                b.set_message(format!(
                    "loss {:.4}{last_acc} | {ms:.0} ms/step | sent {}",
                    s.loss,
                    human_bytes((total_bytes + epoch_bytes) as f64)
                ));
            }
        };
        let every = plan.checkpoint_every;
        let stats = loop {
            let pause = (every > 0).then(|| (trainer.global_step() / every + 1) * every);
            match trainer.run_epoch_until(&data, &mut on_step, pause)? {
                Some(stats) => break stats,
                None => {
                    ckpt_s += crate::train_checkpoint::save(&mut trainer, plan, world)?;
                    ckpt_n += 1;
                }
            }
        };
        total_bytes += stats.bytes_sent;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if reporting {
            let rec = record(&stats);
            last_acc = match (rec.test_accuracy, rec.val_perplexity) {
                (_, Some(p)) => format!(" | val ppl {p:.2}"),
                (Some(a), _) => format!(" | acc {:.2}%", a * 100.0),
                _ => String::new(),
            };
            println!("{}", serde_json::to_string(&rec)?);
            eprintln!(
                "epoch {}/{}: loss {:.4}{last_acc} | {:.1} s (compute {:.1}, comm {:.1}) | sent {} | ratio {:.1}x",
                rec.epoch,
                plan.train.epochs,
                rec.train_loss,
                rec.wall_s,
                rec.compute_s,
                rec.comm_s,
                human_bytes(rec.bytes_sent as f64),
                rec.compression_ratio
            );
            append_jsonl(&plan.out.join("metrics.jsonl"), &rec)?;
            if let Some(j) = &plan.json {
                append_jsonl(j, &rec)?;
            }
            run.epochs.push(rec);
        }
    }
    if reporting && ckpt_n > 0 {
        eprintln!(
            "gradwire train: {ckpt_n} checkpoint(s) in {}, {:.1} ms each on rank 0",
            crate::train_checkpoint::dir(&plan.out).display(),
            ckpt_s * 1e3 / f64::from(ckpt_n)
        );
    }
    let mut kept = None;
    match (&plan.save_params, rank, part_index) {
        (Some(p), 0, None) => crate::train_ps::save_params(p, trainer.params())?,
        (Some(_), 0, Some(_)) => kept = Some(trainer.params().to_vec()),
        _ => {}
    }
    let (_, mut sync) = trainer.into_parts();
    let stats = sync.stats();
    if let Some(path) = &plan.timeline {
        let mine = rank_path(path, rank);
        sync.write_timeline(&mine)
            .with_context(|| format!("writing {}", mine.display()))?;
        // Every rank's file is written before rank 0 merges them.
        sync.average_metrics(&mut [0.0])?;
        if rank == 0 {
            let files: Vec<PathBuf> = (0..world).map(|r| rank_path(path, r)).collect();
            let refs: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
            gradwire_engine::merge_traces(&refs, path)
                .with_context(|| format!("merging the timeline into {}", path.display()))?;
            let png = path.with_extension("png");
            match crate::plot_timeline::plot_step(path, &png) {
                Ok(()) => eprintln!(
                    "gradwire train: timeline in {} (open in Perfetto), one step drawn in {}",
                    path.display(),
                    png.display()
                ),
                Err(e) => eprintln!(
                    "gradwire train: timeline in {} (open in Perfetto); step chart not drawn ({e:#})",
                    path.display()
                ),
            }
        }
    }
    if reporting {
        run.engine = Some(serde_json::json!({
            "bytes": stats.bytes,
            "compression_ratio": stats.bytes.compression_ratio(),
            "stragglers": {
                "collectives": stats.stragglers.collectives,
                "last_count": stats.stragglers.last_count,
                "mean_lag_us": stats.stragglers.mean_lag_us,
                "max_lag_us": stats.stragglers.max_lag_us,
            },
            "stalls": stats.stalls.len(),
            "negotiation_rounds": stats.cycles,
            "policies": sync
                .engine()
                .policies()
                .iter()
                .map(|p| format!("{}: {} @ {:?}", p.tensor.name, p.codec, p.strategy))
                .collect::<Vec<_>>(),
        }));
        write_run(&run, &plan.out)?;
        eprintln!("gradwire train: wrote {}", plan.out.display());
    }
    sync.shutdown()?;
    Ok(kept)
}

/// The engine's settings for `plan`, with the host hierarchy `hosts` (if any).
pub(crate) fn engine_config(
    plan: &Plan,
    hosts: Option<gradwire_engine::HostConfig>,
) -> EngineConfig {
    EngineConfig {
        codec: plan.codec.clone(),
        strategy: plan.sync,
        rules: plan.rules.clone(),
        momentum: plan
            .momentum_correction
            .map(|(beta, nesterov)| MomentumConfig {
                beta: beta as f32,
                nesterov,
                masking: true,
            }),
        fusion_bytes: plan.fusion_bytes,
        seed: plan.train.seed,
        timeline: plan.timeline.is_some(),
        hosts,
        ..EngineConfig::default()
    }
}

/// Under model parallelism: prints the partition plan and keeps it in `run` (with every
/// rank counted in `workers`); nothing otherwise. The reporting rank's, before training.
pub(crate) fn record_partition_plan(
    plan: &Plan,
    shape: gradwire_train::data::DataShape,
    run: &mut RunRecord,
) -> Result<()> {
    if let Some(mp) = &plan.model_parallel {
        let split = mp
            .spec(plan.model, shape, plan.train.seed)
            .plan(plan.train.batch_size)?;
        eprintln!("gradwire train: partition plan\n{split}");
        run.workers = plan.workers;
        run.model_parallel = Some(serde_json::to_value(&split)?);
    }
    Ok(())
}

/// `FILE` with `.rankN` before its extension (`trace.json` -> `trace.rank2.json`).
fn rank_path(path: &Path, rank: usize) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or("timeline".into(), |s| s.to_string_lossy());
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

/// A link config as run.json records it: the default interface, then each rank's own
/// (`1gbit,50000ns;rank3=100mbit,50000ns`).
fn link_label(cfg: &LinkConfig) -> String {
    let mut s = cfg.default.to_string();
    for (rank, spec) in &cfg.ranks {
        s.push_str(&format!(";rank{rank}={spec}"));
    }
    s
}

pub(crate) fn record(s: &EpochStats) -> EpochRecord {
    EpochRecord {
        epoch: s.epoch as usize + 1,
        train_loss: s.train_loss,
        test_accuracy: s.test_accuracy,
        val_perplexity: s.val_perplexity,
        wall_s: s.wall_s,
        eval_s: s.eval_s,
        compute_s: s.compute_s,
        comm_s: s.comm_s,
        bytes_sent: s.bytes_sent,
        compression_ratio: s.compression_ratio,
    }
}

/// Writes `run.json` and the plots of a finished run.
pub fn write_run(run: &RunRecord, out: &Path) -> Result<()> {
    std::fs::write(
        out.join("run.json"),
        serde_json::to_string_pretty(run)? + "\n",
    )
    .with_context(|| format!("writing {}", out.join("run.json").display()))?;
    // Plots are best-effort: a missing font or an unwritable image warns, the run stands.
    if let Err(e) = crate::plot::plot_run(run, out) {
        tracing::warn!("plots of {} not drawn: {e:#}", out.display());
        eprintln!("gradwire train: warning: plots not drawn ({e:#}); run.json is written");
    }
    Ok(())
}

pub(crate) fn progress_bar(steps: usize, epoch: usize, epochs: usize) -> ProgressBar {
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{}/{}", epoch + 1, epochs));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use gradwire_codec::CodecId;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TrainArgs,
    }

    fn args(flags: &[&str]) -> std::result::Result<TrainArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("train").chain(flags.iter().copied())).map(|c| c.args)
    }

    const ALONE: Host = Host {
        cores: 8,
        launched: None,
    };

    fn file(toml_text: &str) -> TrainFile {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn bad_values_are_refused_at_the_edge_with_the_allowed_ones() {
        let e = args(&["--model", "vgg"]).unwrap_err().to_string();
        assert!(e.contains("mlp|lenet|resnet|lstm"), "{e}");
        let e = args(&["--codec", "zip"]).unwrap_err().to_string();
        assert!(e.contains("topk") && e.contains("qsgd"), "{e}");
        let e = args(&["--sync", "fast"]).unwrap_err().to_string();
        assert!(e.contains("gather") && e.contains("sparse"), "{e}");
        let e = args(&["--momentum-correction", "maybe"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("auto") && e.contains("off"), "{e}");
        let e = args(&["--dataset", "imagenet"]).unwrap_err().to_string();
        assert!(e.contains("fashion-mnist"), "{e}");
        assert!(args(&["--optimizer", "rmsprop"]).is_err());
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_defaults() {
        let a = args(&["--codec", "topk:ratio=0.01", "--epochs", "3"]).unwrap();
        let f = file("codec = \"qsgd:bits=4\"\nepochs = 7\nbatch = 16\nmodel = \"mlp\"\n");
        let p = a.merge(f, "run.toml", ALONE).unwrap();
        assert_eq!(
            p.codec.to_string(),
            "topk:ratio=0.01"
                .parse::<CodecConfig>()
                .unwrap()
                .to_string()
        );
        assert_eq!(p.train.epochs, 3);
        assert_eq!(p.train.batch_size, 16);
        assert_eq!(p.model, ModelKind::Mlp);
        assert_eq!(p.dataset, DatasetKind::FashionMnist);
        // Defaults.
        let p = args(&[])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert_eq!(
            (p.model, p.workers, p.train.epochs, p.train.batch_size),
            (ModelKind::LeNet, 1, 1, 64)
        );
        assert_eq!(p.codec.id(), CodecId::None);
        assert_eq!(p.data, default_data_dir());
        let p = args(&["--model", "lstm"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert_eq!(
            (p.dataset, p.train.batch_size),
            (DatasetKind::Shakespeare, 32)
        );
    }

    #[test]
    fn a_bad_file_value_names_the_file_and_key() {
        let e = args(&[])
            .unwrap()
            .merge(file("model = \"vgg\"\n"), "run.toml", ALONE)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("run.toml") && e.contains("model") && e.contains("lenet"),
            "{e}"
        );
        assert!(toml::from_str::<TrainFile>("modle = \"mlp\"\n").is_err());
    }

    #[test]
    fn stripe_quantizers_under_momentum_after_aggregation_are_warned() {
        let warn = |a: &[&str]| {
            args(a)
                .unwrap()
                .merge(TrainFile::default(), "", ALONE)
                .unwrap()
                .momentum_warning()
        };
        for codec in ["onebit", "adaptive", "onebit:column=tensor"] {
            let w = warn(&["--codec", codec]).expect(codec);
            assert!(w.contains("momentum 0.9") && w.contains("adagrad"), "{w}");
            // The papers' optimizer, the correction, or no momentum: no warning.
            assert_eq!(warn(&["--codec", codec, "--optimizer", "adagrad"]), None);
            assert_eq!(
                warn(&["--codec", codec, "--optimizer", "sgd:lr=0.05"]),
                None
            );
            assert_eq!(
                warn(&["--codec", codec, "--momentum-correction", "on"]),
                None
            );
        }
        for codec in ["none", "qsgd", "terngrad", "topk", "dgc"] {
            assert_eq!(warn(&["--codec", codec]), None, "{codec}");
        }
        // A rule sends some tensors through 1-bit SGD: those tensors are warned for.
        let w = warn(&["--rule", "name=fc*=>onebit"]).expect("rule");
        assert!(w.contains("1-bit SGD"), "{w}");
        let w = warn(&["--codec", "qsgd", "--rule", "dims=2=>adaptive"]).expect("rule");
        assert!(w.contains("adaptive"), "{w}");
        assert_eq!(
            warn(&["--rule", "name=fc*=>onebit", "--optimizer", "adagrad"]),
            None
        );
        assert_eq!(warn(&["--rule", "name=fc*=>qsgd"]), None);
    }

    #[test]
    fn auto_weighs_one_bit_sgd_only_where_no_momentum_follows_aggregation() {
        let plan = |a: &[&str]| {
            let mut all = vec!["--model", "mlp:hidden=1024x2", "--workers", "4"];
            all.extend_from_slice(&["--codec", "auto", "--link", "1gbit"]);
            all.extend_from_slice(a);
            args(&all)
                .unwrap()
                .merge(TrainFile::default(), "", ALONE)
                .unwrap()
        };
        let choice = |a: &[&str]| plan(a).codec_choice.unwrap();
        let weighed = |c: &crate::auto_codec::Choice| c.candidates.join(",");
        // The default optimizer, SGD with momentum 0.9 after aggregation: no 1-bit SGD.
        let c = choice(&[]);
        assert_eq!(weighed(&c), "none,fp16,qsgd:bits=4");
        assert!(c.tensors.iter().all(|t| t.codec != "onebit"), "{c:?}");
        // AdaGrad and plain SGD: 1-bit SGD is weighed, and over 1 Gbit/s it sends the two
        // big weight matrices (about a quarter of QSGD's bytes at about its codec cost).
        for opt in ["adagrad:lr=0.01", "sgd:lr=0.05"] {
            let p = plan(&["--optimizer", opt]);
            let c = p.codec_choice.as_ref().unwrap();
            assert_eq!(weighed(c), "none,fp16,qsgd:bits=4,onebit", "{opt}");
            for big in ["hidden.0.weight", "hidden.1.weight"] {
                let t = c.tensors.iter().find(|t| t.tensor == big).unwrap();
                assert_eq!(t.codec, "onebit", "{opt}: {t:?}");
            }
            // The job's own rules send those tensors through it, so no momentum warning.
            assert_eq!(p.momentum_warning(), None, "{opt}");
        }
        // A list given by hand is taken as it is.
        let c = choice(&[
            "--optimizer",
            "adagrad",
            "--auto-codecs",
            "none,qsgd:bits=4",
        ]);
        assert_eq!(weighed(&c), "none,qsgd:bits=4");
    }

    #[test]
    fn momentum_correction_moves_momentum_out_of_the_optimizer() {
        // The papers' default: the optimizer keeps momentum for every codec but DGC.
        for codec in [
            "qsgd",
            "onebit",
            "threshold:tau=0.01",
            "adaptive",
            "topk",
            "terngrad",
        ] {
            let p = args(&["--codec", codec])
                .unwrap()
                .merge(TrainFile::default(), "", ALONE)
                .unwrap();
            assert_eq!(p.momentum_correction, None, "{codec}");
            assert_eq!(
                p.train.optimizer.sgd_momentum(),
                Some((0.9, false)),
                "{codec}"
            );
        }
        let p = args(&["--codec", "dgc:momentum=0.8"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert_eq!(p.momentum_correction, None, "DGC's codec owns its momentum");
        assert_eq!(p.train.optimizer.sgd_momentum(), None);
        assert!(
            p.train.optimizer.to_string().contains("momentum=0.8")
                && p.train.optimizer.to_string().contains("corrected"),
            "weight decay takes DGC's momentum: {}",
            p.train.optimizer
        );
        let p = args(&["--codec", "qsgd", "--momentum-correction", "on"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert_eq!(p.momentum_correction, Some((0.9, false)));
        assert_eq!(p.train.optimizer.sgd_momentum(), None);
        let p = args(&["--codec", "qsgd", "--momentum-correction", "off"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert_eq!(p.momentum_correction, None);
        assert_eq!(p.train.optimizer.sgd_momentum(), Some((0.9, false)));
        let p = args(&["--momentum-correction", "on"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert_eq!(
            p.momentum_correction, None,
            "dense keeps the optimizer's momentum"
        );
        let e = args(&[
            "--codec",
            "qsgd",
            "--momentum-correction",
            "on",
            "--optimizer",
            "adam",
        ])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap_err()
        .to_string();
        assert!(e.contains("momentum"), "{e}");
        let e = args(&[
            "--codec",
            "adaptive:ternary=true",
            "--momentum-correction",
            "on",
        ])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap_err()
        .to_string();
        assert!(e.contains("ternary"), "{e}");
    }

    #[test]
    fn dgc_clips_locally_where_the_optimizer_would_clip_the_sum() {
        let p = args(&[
            "--codec",
            "dgc",
            "--optimizer",
            "sgd:lr=0.1,momentum=0.9,clip=5",
        ])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
        assert_eq!(p.train.optimizer.clip_norm, None);
        assert!(p.codec.to_string().contains("clip=5"), "{}", p.codec);
        let p = args(&["--codec", "dgc:clip=2", "--optimizer", "sgd:lr=0.1,clip=5"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert_eq!(
            p.train.optimizer.clip_norm,
            Some(5.0),
            "an explicit clip wins"
        );
        assert!(p.codec.to_string().contains("clip=2"), "{}", p.codec);
        let p = args(&["--codec", "dgc"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert!(
            p.codec.to_string().contains("clip=0"),
            "no clip without one to scale"
        );
    }

    #[test]
    fn clip_scope_local_moves_the_optimizer_clip_to_each_worker() {
        let sgd = "sgd:lr=1,momentum=0.9,clip=5";
        for codec in ["topk", "none", "qsgd"] {
            let p = args(&["--codec", codec, "--optimizer", sgd])
                .unwrap()
                .merge(TrainFile::default(), "", ALONE)
                .unwrap();
            assert_eq!(p.train.optimizer.clip_norm, Some(5.0), "{codec}: global");
            assert_eq!(p.train.local_clip, None, "{codec}: global");
            let p = args(&[
                "--codec",
                codec,
                "--optimizer",
                sgd,
                "--clip-scope",
                "local",
            ])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
            assert_eq!(p.train.optimizer.clip_norm, None, "{codec}: local");
            assert_eq!(p.train.local_clip, Some(5.0), "{codec}: local");
        }
        // DGC clips in its codec either way; nothing is clipped twice.
        let p = args(&[
            "--codec",
            "dgc",
            "--optimizer",
            sgd,
            "--clip-scope",
            "local",
        ])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
        assert_eq!(
            (p.train.optimizer.clip_norm, p.train.local_clip),
            (None, None)
        );
        assert!(p.codec.to_string().contains("clip=5"), "{}", p.codec);
        // Nothing to move: refused, naming the fix.
        let e = args(&[
            "--codec",
            "topk",
            "--optimizer",
            "sgd:lr=1",
            "--clip-scope",
            "local",
        ])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap_err()
        .to_string();
        assert!(e.contains("clip=C"), "{e}");
    }

    #[test]
    fn dgc_under_an_adaptive_optimizer_is_refused_unless_allowed() {
        let e = args(&["--codec", "dgc", "--optimizer", "adam:lr=0.001"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("DGC needs SGD") && e.contains("--allow-dgc-adaptive"),
            "{e}"
        );
        assert!(args(&[
            "--codec",
            "dgc",
            "--optimizer",
            "adam",
            "--allow-dgc-adaptive"
        ])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .is_ok());
        assert!(args(&["--codec", "dgc"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .is_ok());
    }

    #[test]
    fn a_launcher_sets_the_world_and_threads_follow_the_ranks_on_the_host() {
        let launched = Host {
            cores: 8,
            launched: Some((16, 4)),
        };
        let p = args(&["--workers", "2"])
            .unwrap()
            .merge(TrainFile::default(), "", launched)
            .unwrap();
        assert_eq!((p.workers, p.threads), (16, 2));
        let p = args(&["--workers", "4"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert_eq!((p.workers, p.threads), (4, 2));
        let p = args(&["--threads", "3"])
            .unwrap()
            .merge(TrainFile::default(), "", launched)
            .unwrap();
        assert_eq!(p.threads, 3);
        assert!(args(&["--workers", "0"])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .is_err());
    }
}
