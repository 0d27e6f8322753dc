//! A job's settings: [`Settings`], every setting of `gradwire train` that says what to
//! train and how (also its command-line flags and their `--help` text, through
//! `clap::Args`), and [`FileSettings`], the same settings as a TOML file holds them (same
//! keys, parsed with the same rules; flags given on the command line win).
//! [`crate::Plan::new`] merges them over the defaults.

use std::path::PathBuf;

use clap::Args;
use gradwire_train::data::DatasetKind;
use gradwire_train::{ModelKind, OptimizerConfig, Rule};
use gradwire_transport::link::LinkConfig;
use serde::Deserialize;

pub use gradwire_run::rules::{ClipScope, MomentumMode};

use crate::auto::CodecArg;
use crate::sync_mode::SyncMode;

/// What to train and how: each setting is a flag of `gradwire train` and a key of its
/// `--config FILE.toml`. Values are parsed at the edge: a bad one is refused with the
/// allowed values.
#[derive(Args, Debug, Clone, Default)]
pub struct Settings {
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
    pub codec: Option<CodecArg>,
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
    pub sync: Option<SyncMode>,
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
    /// Directory for metrics.jsonl, run.json and the plots (default
    /// `out/<model>-<dataset>-<codec>`).
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
}

/// The same settings as read from a TOML file (parsed with the same rules as the flags).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSettings {
    /// The `model` key.
    pub model: Option<String>,
    /// The `dataset` key.
    pub dataset: Option<String>,
    /// The `workers` key.
    pub workers: Option<usize>,
    /// The `codec` key.
    pub codec: Option<String>,
    /// The `sync` key.
    pub sync: Option<String>,
    /// The `rules` key.
    pub rules: Option<Vec<String>>,
    /// The `fusion_bytes` key.
    pub fusion_bytes: Option<usize>,
    /// The `timeline` key.
    pub timeline: Option<PathBuf>,
    /// The `link` key.
    pub link: Option<String>,
    /// The `momentum_correction` key.
    pub momentum_correction: Option<MomentumMode>,
    /// The `allow_dgc_adaptive` key.
    pub allow_dgc_adaptive: Option<bool>,
    /// The `clip_scope` key.
    pub clip_scope: Option<ClipScope>,
    /// The `epochs` key.
    pub epochs: Option<usize>,
    /// The `lr` key.
    pub lr: Option<f64>,
    /// The `optimizer` key.
    pub optimizer: Option<String>,
    /// The `batch` key.
    pub batch: Option<usize>,
    /// The `seed` key.
    pub seed: Option<u64>,
    /// The `max_steps` key.
    pub max_steps: Option<usize>,
    /// The `eval_limit` key.
    pub eval_limit: Option<usize>,
    /// The `seq_len` key.
    pub seq_len: Option<usize>,
    /// The `threads` key.
    pub threads: Option<usize>,
    /// The `data` key.
    pub data: Option<PathBuf>,
    /// The `json` key.
    pub json: Option<PathBuf>,
    /// The `out` key.
    pub out: Option<PathBuf>,
    /// The `checkpoint_every` key.
    pub checkpoint_every: Option<u64>,
}

/// A value of the settings file that does not parse, naming the file and the key.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {key} = {value:?}: {reason}")]
pub struct FileError {
    /// The file.
    pub file: String,
    /// The key.
    pub key: &'static str,
    /// The value.
    pub value: String,
    /// What the parser said.
    #[source]
    pub reason: Box<dyn std::error::Error + Send + Sync>,
}

/// Parses one string setting of the settings file, naming the file and key on error.
pub(crate) fn from_file<T>(
    file: &str,
    key: &'static str,
    v: Option<String>,
) -> Result<Option<T>, FileError>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    v.map(|s| {
        s.parse::<T>().map_err(|e| FileError {
            file: file.to_string(),
            key,
            reason: Box::new(e),
            value: s,
        })
    })
    .transpose()
}
