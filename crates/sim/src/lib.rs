//! gradwire's cost model: predicts the step time of data-parallel training from an
//! alpha-beta(-gamma) model of each collective, each codec's measured encode/decode cost and
//! wire bytes, the model's measured compute per step and the overlap the engine achieves.
//!
//! * [`Network`]: `alpha` seconds per message, `beta` seconds per byte on the wire, `gamma`
//!   seconds per byte reduced (the classic Hockney / Thakur-Rabenseifner-Gropp model), from a
//!   link spec ([`Network::from_link`]) or measured.
//! * [`collective`]: the standard formulas per all-reduce algorithm (ring, recursive
//!   doubling, Rabenseifner, the engine's canonical pairwise exchange) and all-gather.
//! * [`predict`](mod@predict): per strategy the engine uses (dense, gather, sparse, stripe, powersgd) the
//!   communication and codec time of one step for a [`ModelProfile`] and a [`CodecProfile`],
//!   hence the step time, the speedup over dense and the scaling efficiency.
//!
//! * [`model_parallel`]: DistBelief's model parallelism, one replica split over `K`
//!   partitions (tensor or pipeline split of a fully connected network): compute split `K`
//!   ways plus the traffic across the partitions' boundaries, hence the speedup over one
//!   partition.
//!
//! * [`sweep`] and [`projection`]: `gradwire simulate`'s grids of predictions (every link,
//!   worker count and codec; every model, split, link and partition count), and [`report`]:
//!   the data of its JSON report.
//!
//! * [`auto`]: `--codec auto`'s policy, a codec per tensor from these predictions, priced by
//!   a [`Calibration`] of the user's machine (its JSON cache).
//!
//! * [`host`]: the timings the ranks of a shared-host measurement send rank 0 (a wire format,
//!   decoded as untrusted), and [`lockstep`]: their summary as one shared-host step.
//!
//! Everything here is arithmetic on numbers the caller measured (`gradwire_train::measure`
//! measures them for `gradwire simulate` and `gradwire calibrate`); nothing is timed in this
//! crate. Units are
//! seconds and bytes throughout.

pub mod auto;
pub mod collective;
pub mod host;
pub mod lockstep;
pub mod model_parallel;
pub mod network;
pub mod predict;
pub mod projection;
pub mod report;
pub mod sweep;

pub use auto::Calibration;
pub use gradwire_engine::Strategy;
pub use model_parallel::{mp_step, FcNet, MpConfig, MpStep, Split};
pub use network::{Network, DEFAULT_GAMMA};
pub use predict::{
    predict, step, CodecProfile, MeasuredStep, ModelProfile, Prediction, Scenario, StepBreakdown,
};

/// Why a prediction cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A world of zero workers.
    #[error("a world needs at least one worker")]
    NoWorkers,
    /// A shared host with zero cores.
    #[error("a shared host needs at least one core")]
    NoCores,
    /// A negative or non-finite cost (`what` names it).
    #[error("{what} must be finite and non-negative, got {value}")]
    BadCost {
        /// Which number.
        what: &'static str,
        /// Its value.
        value: f64,
    },
    /// A strategy the model does not cover (`quantized`, or an unresolved `auto`).
    #[error("strategy {0} is not modelled (resolve auto first; quantized is deprecated)")]
    Strategy(Strategy),
    /// A network, or a batch, with nothing in it (`what`: `layers`, `width` or `batch`).
    #[error("a model-parallel projection needs at least one {what}")]
    EmptyNetwork {
        /// Which dimension is zero.
        what: &'static str,
    },
    /// More partitions than the split has pieces to give (tensor: the width's columns;
    /// pipeline: the layers).
    #[error("{split} split over {k} partitions: the model has only {max} pieces to split")]
    TooManyPartitions {
        /// The partitions asked for.
        k: usize,
        /// The split.
        split: model_parallel::Split,
        /// The most partitions it can use.
        max: usize,
    },
    /// Micro-batches outside `1..=batch`.
    #[error("{micro_batches} micro-batches of a batch of {batch}: use 1 to {batch}")]
    MicroBatches {
        /// The micro-batches asked for.
        micro_batches: usize,
        /// The batch.
        batch: usize,
    },
    /// A split that is not `tensor` or `pipeline`.
    #[error("unknown split {0:?} (tensor, pipeline)")]
    UnknownSplit(String),
}

/// Checks that a cost is finite and non-negative.
pub(crate) fn check(what: &'static str, value: f64) -> Result<f64, Error> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(Error::BadCost { what, value })
    }
}
