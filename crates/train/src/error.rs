//! The crate's error type.

use std::path::PathBuf;

mod config;

pub use config::{
    ConfigError, HiddenError, HiddenSizesError, LstmOptionError, ModelError, OptimizerError,
    PartitionError,
};

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong while loading data, building models or training.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A data file is absent: the data sets have not been fetched yet.
    #[error("data file {path} not found: run `scripts/fetch-data.sh` to fetch the data sets")]
    MissingData {
        /// The file that was looked for.
        path: PathBuf,
    },
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A CIFAR-10 file is absent (no registry carries CIFAR-10, so the script cannot fetch it).
    #[error("CIFAR-10 file {path} not found: CIFAR-10 is not in any package registry; download the binary version (cifar-10-binary.tar.gz) yourself and point --data at its cifar-10-batches-bin folder")]
    MissingCifar {
        /// The file that was looked for.
        path: PathBuf,
    },
    /// A data file's content does not match its format.
    #[error("malformed {format} file {path}: {what}")]
    Malformed {
        /// The format expected ("IDX", "CIFAR-10", "MNIST JSON", ...).
        format: &'static str,
        /// The offending file (or `<memory>`).
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// A batch of the wrong kind was given to a model (e.g. text to an image model).
    #[error("model {model} cannot take a {batch} batch")]
    BatchMismatch {
        /// The model's name.
        model: &'static str,
        /// The batch kind given.
        batch: &'static str,
    },
    /// A buffer's length does not match what it must hold.
    #[error("{what}: expected {expected} elements, got {got}")]
    LengthMismatch {
        /// What the buffer is.
        what: &'static str,
        /// The length required.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A configuration value is invalid, or a call came out of turn (see [`ConfigError`]).
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// The run needs a capability the gradient sync does not have (see the `sync` module's
    /// doc: overlapping steps, checkpoints, a server-side update); choose a sync that has it.
    #[error("this gradient sync cannot {what}")]
    Unsupported {
        /// What the run asked of it, with the sync that can do it.
        what: &'static str,
    },
    /// A checkpoint file is truncated, corrupted or not a checkpoint.
    #[error("checkpoint {path}: {source}")]
    Checkpoint {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: crate::checkpoint::CheckpointFormatError,
    },
    /// A checkpoint does not fit this run (another world size, rank or model size).
    #[error("cannot resume: {0}")]
    Resume(String),
    /// Saved optimizer state could not be restored.
    #[error("cannot restore optimizer state: {0}")]
    State(String),
    /// The loss became NaN or infinite: training diverged (lower the learning rate).
    #[error(
        "training diverged at epoch {epoch} step {step}: loss {loss}; lower the learning rate"
    )]
    Diverged {
        /// 0-based epoch.
        epoch: u64,
        /// 0-based step within the epoch.
        step: usize,
        /// The non-finite loss.
        loss: f32,
    },
    /// The engine refused a setting, or a synchronization failed (naming the rank).
    #[error("engine: {0}")]
    Engine(#[from] gradwire_engine::Error),
    /// A partition of a model split over ranks (`model::partition`) died, stalled past the
    /// transport's deadline or sent a malformed message: `partition` names it (this
    /// partition's own index when the transport names no peer). When another partition saw
    /// the failure first, `source` is [`gradwire_transport::Error::PeerFailed`] naming the
    /// partition that reported it. The replica cannot go on; restart it.
    #[error("model partition {partition} failed: {source}")]
    PartitionLost {
        /// The partition that failed.
        partition: usize,
        /// The transport's error, or the report of the partition that saw it.
        source: gradwire_transport::Error,
    },
    /// A parameter-server operation failed (naming the shard or the lost worker).
    #[error("parameter server: {0}")]
    Ps(#[from] gradwire_ps::Error),
}

impl Error {
    /// Reading the data file `path` failed: [`Error::MissingData`] when it does not exist,
    /// else [`Error::Io`].
    pub fn reading_data(path: &std::path::Path, e: std::io::Error) -> Error {
        match e.kind() {
            std::io::ErrorKind::NotFound => Error::MissingData {
                path: path.to_path_buf(),
            },
            _ => Error::Io {
                path: path.to_path_buf(),
                source: e,
            },
        }
    }

    /// The mapping of an I/O error on `path` to [`Error::Io`] (for `map_err`).
    pub fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |source| Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// `Ok` when `got == expected`, else [`Error::LengthMismatch`] naming `what`.
    pub fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
        if got == expected {
            Ok(())
        } else {
            Err(Error::LengthMismatch {
                what,
                expected,
                got,
            })
        }
    }
}

impl From<OptimizerError> for Error {
    fn from(e: OptimizerError) -> Error {
        Error::Config(e.into())
    }
}

impl From<ModelError> for Error {
    fn from(e: ModelError) -> Error {
        Error::Config(e.into())
    }
}

impl From<PartitionError> for Error {
    fn from(e: PartitionError) -> Error {
        Error::Config(e.into())
    }
}
