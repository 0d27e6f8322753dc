//! The validated settings of a run ([`Plan`]): the flags merged over the TOML file over the
//! defaults, and checked before any thread or process starts; where the run happens
//! ([`Host`]).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use gradwire_codec::CodecConfig;
use gradwire_train::data::{default_data_dir, DatasetKind};
use gradwire_train::{
    EngineConfig, ModelKind, OptimizerConfig, OptimizerKind, Rule, SyncStrategy, TrainConfig,
};
use gradwire_transport::link::LinkConfig;

use super::args::{from_file, MomentumMode, TrainArgs, TrainFile};
use super::output::link_label;
use crate::records::RunRecord;

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
    pub(super) fn merge(&self, file: TrainFile, name: &str, host: Host) -> Result<Plan> {
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
