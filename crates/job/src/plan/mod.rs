//! The validated plan of a job ([`Plan`]): the settings given as flags ([`Request`]) merged
//! over the settings file over the defaults, with every rule between codec, optimizer,
//! sync mode, parameter server, model parallelism and elastic membership applied and
//! checked before any thread or process starts; and where the job runs ([`Host`]).

use std::path::PathBuf;

use gradwire_codec::CodecConfig;
use gradwire_run::report::records::{Provenance, RunRecord};
use gradwire_train::data::DatasetKind;
use gradwire_train::{ModelKind, Rule, SyncStrategy, TrainConfig};
use gradwire_transport::link::LinkConfig;

use crate::auto::Choice;
use crate::elastic::{Elastic, ElasticSettings};
use crate::model_parallel::{ModelParallel, MpSettings};
use crate::ps::{PsPlan, PsSettings};
use crate::settings::Settings;

mod checks;
mod error;
mod merge;
#[cfg(test)]
mod tests;

pub use error::PlanError;

/// The settings given on the command line (or by any front end), each group as its flags.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// What to train and how.
    pub settings: &'a Settings,
    /// The parameter-server flags.
    pub ps: &'a PsSettings,
    /// The model-parallel flags.
    pub mp: &'a MpSettings,
    /// The elastic flags.
    pub elastic: &'a ElasticSettings,
}

/// Where and how this process runs, as far as the plan depends on it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Host {
    /// Cores of this host.
    pub cores: usize,
    /// Under a launcher: its world size and the ranks on this host.
    pub launched: Option<(usize, usize)>,
    /// `gradwire launch --elastic` started this process (its environment names the
    /// coordinator): elastic without the flag, the launcher holding the range.
    pub elastic_launched: bool,
    /// This process is one rank started by the parent.
    pub worker: bool,
    /// The ranks run as threads of this process.
    pub threads_as_workers: bool,
}

impl Host {
    /// This process's host, with the launcher detected from the environment.
    pub fn detect(launched: Option<&gradwire_run::join::Launched>) -> Host {
        Host {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            launched: launched.map(|l| (l.config.world_size, l.local_size)),
            elastic_launched: std::env::var_os(gradwire_run::elastic::ENV_ELASTIC).is_some(),
            worker: false,
            threads_as_workers: false,
        }
    }
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
    pub model_parallel: Option<ModelParallel>,
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
    pub ps: Option<PsPlan>,
    /// Where rank 0 writes its final parameters.
    pub save_params: Option<PathBuf>,
    /// What `--codec auto` chose (its rules are in `rules`, after the user's).
    pub codec_choice: Option<Choice>,
    /// Steps between checkpoints (0: none).
    pub checkpoint_every: u64,
    /// The `--out` folder of the run to continue.
    pub resume: Option<PathBuf>,
    /// Elastic training, if asked for.
    pub elastic: Option<Elastic>,
}

impl Plan {
    /// A warning for a combination the reports found to train badly, if this is one: 1-bit
    /// SGD or adaptive quantization (error feedback on both legs of the stripes) under SGD
    /// whose momentum is applied after aggregation. The wide MLP fell to 17% with 1-bit SGD at
    /// momentum 0.9, and LeNet ended 2.9 (1-bit) and 54 (adaptive) points under dense, while
    /// under AdaGrad, the optimizer of Seide et al., both tracked dense (docs/fidelity.md).
    /// `--codec` and every `--rule` count (a rule sending some tensors through 1-bit SGD
    /// trains those tensors the same way).
    pub fn momentum_warning(&self) -> Option<String> {
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
    pub fn run_record(&self, world: usize, steps_per_epoch: usize) -> RunRecord {
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
            provenance: Some(Provenance::current()),
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

/// An emulated link as run records name it: the default interface, then each rank's own
/// (`1gbit,50000ns;rank3=100mbit,50000ns`).
pub fn link_label(cfg: &LinkConfig) -> String {
    let mut s = cfg.default.to_string();
    for (rank, spec) in &cfg.ranks {
        s.push_str(&format!(";rank{rank}={spec}"));
    }
    s
}
