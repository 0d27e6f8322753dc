//! Why a Sandblaster run stopped ([`SbError`]).

use std::path::PathBuf;

use crate::rank::RankError;
use crate::shards::ShardsError;

/// Why a Sandblaster run stopped. A variant that says what the coordinator was doing keeps
/// the cause as its [`std::error::Error::source`], so a front end printing the chain shows
/// both (`loading mnist: ...`).
#[derive(Debug, thiserror::Error)]
pub enum SbError {
    /// The data set does not load.
    #[error("loading {dataset}")]
    Load {
        /// The data set.
        dataset: &'static str,
        /// Why.
        source: gradwire_train::Error,
    },
    /// The objective (the model over the full batch) does not build.
    #[error("building the Sandblaster objective")]
    Objective(#[source] gradwire_train::Error),
    /// The shards did not start.
    #[error(transparent)]
    Shards(#[from] ShardsError),
    /// The evaluation model does not build or evaluate.
    #[error(transparent)]
    Train(#[from] gradwire_train::Error),
    /// A work unit failed on a worker.
    #[error("a work unit failed")]
    Unit(#[source] gradwire_train::Error),
    /// The full-batch loss is not finite.
    #[error("the full-batch loss is {loss} after L-BFGS step {iteration}")]
    Diverged {
        /// The loss.
        loss: f64,
        /// The accepted L-BFGS step.
        iteration: usize,
    },
    /// L-BFGS on the shards failed.
    #[error("Sandblaster L-BFGS")]
    Lbfgs(#[source] gradwire_ps::Error),
    /// The parameters could not be fetched from the shards for an evaluation.
    #[error("fetching the parameters")]
    Params(#[source] gradwire_ps::Error),
    /// A folder could not be made.
    #[error("creating {}", path.display())]
    Create {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be opened to append to.
    #[error("opening {}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The final parameters or `run.json` could not be written.
    #[error(transparent)]
    Rank(#[from] RankError),
    /// A record is not the JSON expected, or could not be turned into JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}
