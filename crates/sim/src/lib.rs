//! gradwire's cost model: predicts the step time of data-parallel training from an
//! alpha-beta(-gamma) model of each collective, each codec's measured encode/decode cost and
//! wire bytes, the model's measured compute per step and the overlap the engine achieves.
//!
//! * [`Network`]: `alpha` seconds per message, `beta` seconds per byte on the wire, `gamma`
//!   seconds per byte reduced (the classic Hockney / Thakur-Rabenseifner-Gropp model), from a
//!   link spec ([`Network::from_link`]) or measured.
//! * [`collective`]: the standard formulas per all-reduce algorithm (ring, recursive
//!   doubling, Rabenseifner, the engine's canonical pairwise exchange) and all-gather.
//! * [`predict`]: per strategy the engine uses (dense, gather, sparse, stripe, powersgd) the
//!   communication and codec time of one step for a [`ModelProfile`] and a [`CodecProfile`],
//!   hence the step time, the speedup over dense and the scaling efficiency.
//!
//! * [`host`]: the timings the ranks of a shared-host measurement send rank 0 (a wire format,
//!   decoded as untrusted).
//!
//! Everything here is arithmetic on numbers the caller measured (`gradwire simulate
//! --calibrate` measures them on this machine); nothing is timed in this crate. Units are
//! seconds and bytes throughout.

pub mod collective;
pub mod host;
pub mod network;
pub mod predict;

pub use gradwire_engine::Strategy;
pub use network::Network;
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
}

/// Checks that a cost is finite and non-negative.
pub(crate) fn check(what: &'static str, value: f64) -> Result<f64, Error> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(Error::BadCost { what, value })
    }
}
