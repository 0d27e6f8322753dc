//! Why a rank's training stopped ([`RankError`]), naming the rank and what it was doing.

use std::path::PathBuf;

use crate::checkpoint::CheckpointError;
use crate::model_parallel::MpError;

/// Why a rank's training stopped.
#[derive(Debug, thiserror::Error)]
pub enum RankError {
    /// The data set does not load.
    #[error("rank {rank}: loading {dataset}: {source}")]
    Load {
        /// This rank.
        rank: usize,
        /// The data set.
        dataset: &'static str,
        /// Why.
        source: gradwire_train::Error,
    },
    /// The engine does not start.
    #[error("rank {rank}: starting the engine: {source}")]
    Engine {
        /// This rank.
        rank: usize,
        /// Why.
        source: gradwire_train::Error,
    },
    /// The checkpoint does not restore.
    #[error("rank {rank}: resuming from step {step}: {source}")]
    Restore {
        /// This rank.
        rank: usize,
        /// The checkpoint's step.
        step: u64,
        /// Why.
        source: gradwire_train::Error,
    },
    /// A partition of the model does not build.
    #[error("building partition {index} of {model}: {source}")]
    Partition {
        /// The partition.
        index: usize,
        /// The model.
        model: gradwire_train::ModelKind,
        /// Why.
        source: gradwire_train::Error,
    },
    /// Training failed (the model, the optimizer, the sync).
    #[error(transparent)]
    Train(#[from] gradwire_train::Error),
    /// A checkpoint could not be written or resumed from.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Model parallelism could not split the world.
    #[error(transparent)]
    ModelParallel(#[from] MpError),
    /// The hosts' layout could not be read.
    #[error(transparent)]
    Hosts(#[from] gradwire_engine::HostError),
    /// A record could not be written.
    #[error(transparent)]
    Record(#[from] gradwire_run::report::records::RecordError),
    /// A file could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// This rank's timeline could not be written.
    #[error("writing {path}: {source}")]
    RankTimeline {
        /// The file.
        path: PathBuf,
        /// Why.
        source: gradwire_train::Error,
    },
    /// The timeline could not be merged.
    #[error("merging the timeline into {path}: {source}")]
    Timeline {
        /// The file.
        path: PathBuf,
        /// Why.
        source: gradwire_engine::Error,
    },
    /// A partition's parameters could not be gathered to rank 0.
    #[error("partition {index}: {what} its parameters: {source}")]
    Gather {
        /// The partition.
        index: usize,
        /// `sending` or `receiving`.
        what: &'static str,
        /// Why.
        source: gradwire_transport::Error,
    },
    /// A partition sent the wrong number of parameter bytes.
    #[error("partition {index} sent {got} bytes of parameters; its plan holds {want}")]
    GatherSize {
        /// The partition.
        index: usize,
        /// Bytes received.
        got: usize,
        /// Bytes its plan holds.
        want: usize,
    },
    /// A partition of replica 0 kept no parameters to save.
    #[error("a partition of replica 0 kept no parameters")]
    NothingKept,
    /// A parameter-server worker failed (connecting, the table, an epoch, leaving).
    #[error("{who}: {what}: {source}")]
    PsWorker {
        /// The worker (`ps worker R/N`, with its partition).
        who: String,
        /// What it was doing.
        what: String,
        /// Why.
        source: gradwire_train::Error,
    },
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not the JSON expected.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A record could not be turned into JSON.
    #[error("encoding {what} as JSON: {source}")]
    Json {
        /// What.
        what: &'static str,
        /// Why.
        source: serde_json::Error,
    },
}
