//! Why a job's settings do not make a plan ([`PlanError`]): each refusal names the flags
//! involved and, where there is one, what to give instead.

use std::path::PathBuf;

use gradwire_codec::CodecConfig;
use gradwire_train::model::partition::Split;
use gradwire_train::ModelKind;

use crate::auto::TensorsError;
use crate::model_parallel::MpError;
use crate::ps::PsError;
use crate::settings::FileError;

/// Why the settings make no plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The settings file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The settings file is not TOML of known keys.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<toml::de::Error>,
    },
    /// A value of the settings file does not parse.
    #[error(transparent)]
    File(#[from] FileError),
    /// A rule of the settings file does not parse.
    #[error("{file}: rules: {rule:?}: {source}")]
    FileRule {
        /// The file.
        file: String,
        /// The rule.
        rule: String,
        /// Why.
        source: gradwire_engine::Error,
    },
    /// No workers, or too many.
    #[error("--workers must be between 1 and 64 (ranks in all under --model-parallel)")]
    Workers,
    /// `--auto-codecs` without `--codec auto`.
    #[error("--auto-codecs goes with --codec auto")]
    AutoCodecsWithoutAuto,
    /// A codec and strategy that cannot go together.
    #[error("--codec {codec} with --sync: {source}")]
    CodecWithSync {
        /// The codec.
        codec: CodecConfig,
        /// What the engine said.
        source: gradwire_engine::Error,
    },
    /// A zero batch or epoch count.
    #[error("--batch and --epochs must be positive")]
    BatchEpochs,
    /// Momentum correction for every codec with a per-tensor choice.
    #[error(
        "--momentum-correction on with --codec auto: the correction is per codec, and auto \
         mixes codecs per tensor; use --momentum-correction auto"
    )]
    MomentumWithAuto,
    /// A rule between codec and optimizer refuses the combination.
    #[error(transparent)]
    Rules(#[from] gradwire_run::RulesError),
    /// The optimizer is invalid.
    #[error(transparent)]
    Optimizer(gradwire_train::Error),
    /// The link in the environment is invalid.
    #[error(transparent)]
    Link(gradwire_transport::Error),
    /// On-disk checkpoints under a parameter server.
    #[error("--checkpoint-every and --resume need the all-reduce engine, not a parameter server")]
    CheckpointWithPs,
    /// On-disk checkpoints with one-step-stale steps.
    #[error("--checkpoint-every and --resume need synchronous steps (--overlap-steps 0)")]
    CheckpointWithOverlap,
    /// `--codec auto` under a parameter server.
    #[error("--codec auto chooses codecs for the all-reduce engine, not a parameter server")]
    AutoWithPs,
    /// The candidates of `--codec auto` do not parse or have no costs.
    #[error("--auto-codecs: {0}")]
    Candidates(gradwire_sim::auto::AutoError),
    /// The model's tensors cannot be listed.
    #[error(transparent)]
    Tensors(#[from] TensorsError),
    /// The per-tensor choice failed.
    #[error("--codec auto: {0}")]
    Auto(gradwire_sim::auto::AutoError),
    /// This machine's calibration cannot be read or made.
    #[error("--codec auto: {0} (`gradwire calibrate` makes this machine's calibration again)")]
    Calibration(gradwire_train::measure::CalibrateError),
    /// A model-parallel setting that cannot run.
    #[error(transparent)]
    ModelParallel(#[from] MpError),
    /// Model parallelism with Sandblaster.
    #[error(
        "--model-parallel {0} with --sync sandblaster: its L-BFGS workers are threads over \
         whole models; use ps-sync, ps-async or ps-ssp:S"
    )]
    MpSandblaster(usize),
    /// Model parallelism with `--codec auto`.
    #[error(
        "--codec auto chooses per tensor of the whole model; give --codec with --model-parallel"
    )]
    MpAuto,
    /// Model parallelism with checkpoints.
    #[error("--checkpoint-every and --resume keep whole models' state; not with --model-parallel")]
    MpCheckpoint,
    /// Model parallelism with a timeline.
    #[error("--timeline merges one file per data-parallel rank; not with --model-parallel")]
    MpTimeline,
    /// The model does not split.
    #[error("splitting {model} over {k} partitions ({split}): {source}")]
    MpSplit {
        /// The model.
        model: ModelKind,
        /// Partitions.
        k: usize,
        /// The split.
        split: Split,
        /// Why.
        source: gradwire_train::Error,
    },
    /// A partition would hold no parameters.
    #[error("{model} split {k} ways ({split}) leaves a partition without parameters; use fewer partitions")]
    MpEmptyPartition {
        /// The model.
        model: ModelKind,
        /// Partitions.
        k: usize,
        /// The split.
        split: Split,
    },
    /// Running shards that are not `K` sets of equal size.
    #[error(
        "--model-parallel {k} with --ps-servers: give {k} sets of equal size (set j, each \
         shard started with --workers R, holds partition j's table); {given} address(es) given"
    )]
    MpPsServers {
        /// Partitions.
        k: usize,
        /// Addresses given.
        given: usize,
    },
    /// A parameter-server setting that cannot run.
    #[error(transparent)]
    Ps(#[from] PsError),
    /// `--commit-every` without `--elastic`.
    #[error("--commit-every goes with --elastic (on-disk checkpoints: --checkpoint-every)")]
    CommitEveryWithoutElastic,
    /// Elastic training with a setting it does not support.
    #[error("--elastic does not go with {0}")]
    ElasticWith(&'static str),
    /// A world outside the elastic range.
    #[error("--workers {workers} is outside --elastic {min}:{max}")]
    ElasticWorkers {
        /// `--workers`.
        workers: usize,
        /// The range's minimum.
        min: usize,
        /// The range's maximum.
        max: usize,
    },
    /// A zero commit period.
    #[error("--commit-every must be at least 1")]
    CommitEveryZero,
}
