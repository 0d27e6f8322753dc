//! `--codec auto`: a codec per tensor, or none, chosen before training to minimise the
//! predicted time of that tensor's synchronization, by this crate's cost model.
//!
//! For every gradient tensor and every candidate codec the engine's own plan gives the
//! strategy it would use (stripe, gather, sparse, dense); the cost model then predicts the
//! tensor's encode, wire and decode time over the job's link (`--link`, or the machine's
//! loopback) at the job's world size ([`choose()`]). The cheapest candidate wins, dense on
//! ties. The choice becomes one exact-name engine rule per tensor ([`Choice::rules`]).
//!
//! # Calibration
//!
//! The costs come from a [`Calibration`] made on the user's own machine
//! (`gradwire calibrate`, measured by `gradwire_train::measure::calibration`; this module
//! times nothing): each codec's encode and decode seconds per element, timed in one process on
//! a synthetic gradient with the machine to itself, and the stack's per-message (`alpha`) and
//! per-byte (`beta`) costs over TCP loopback and the reduction cost (`gamma`). Over a link
//! `alpha` adds to the link's latency and `beta` to its wire time; without one they are the
//! whole network. The wire bytes per element are the codecs' own ([`KNOWN`]). It is cached
//! as JSON (`$GRADWIRE_CALIBRATION`, else `$XDG_CACHE_HOME/gradwire/calibration.json`, else
//! `~/.cache/gradwire/calibration.json`: [`default_path`]) and read as untrusted input
//! ([`Calibration::load`]).
//!
//! Every rank must choose the same, so every rank must read the same calibration: the ranks
//! of one host share its cache; ranks on several hosts need the same file on each
//! (`GRADWIRE_CALIBRATION` pointing at one copy). A calibration made with the machine to
//! itself prices the codecs lower than ranks sharing its cores pay: on a host whose cores the
//! ranks share, `auto` leans towards compressing.
//!
//! # Candidates
//!
//! The candidates are the codecs whose accuracy the reports show within the time-to-accuracy
//! margin of dense (0.5 points, the reports' default target) in paper mode, under the job's
//! optimizer ([`default_candidates`]): `none`, `fp16` and `qsgd:bits=4` always, and `onebit`
//! (1-bit SGD on the stripes) where no momentum is applied after aggregation. That is under
//! AdaGrad, Seide et al.'s optimizer (-0.13 points on LeNet, the wide MLP's target reached in
//! 3 seeds of 3), and under plain SGD (+0.11 points on LeNet, the wide MLP's target reached in
//! 3 of 3): `docs/results/fidelity/lenet-fashion-mnist/{adagrad,plain-sgd}`,
//! `docs/results/time-to-accuracy`.
//! Under SGD with momentum after aggregation 1-bit SGD diverged on the wide MLP (17%), so it
//! is not a candidate there. TernGrad (-0.80 on LeNet) is not one either: on the wide MLP it
//! ended under that target (82.9% against 83.47%) while QSGD reached it, so `auto` picking it
//! missed the target outright (`docs/results/time-to-accuracy`). A candidate list given by
//! hand may name it and the others in [`KNOWN`]. DGC is not a candidate: it owns the momentum
//! (DGC's momentum correction), so mixed with codecs whose momentum the optimizer applies after
//! aggregation, some tensors would get momentum twice.
//!
//! One concept per file: [`calibration`] (the costs, their file and cache path),
//! [`candidates`](mod@candidates) (the lists and their pricing), [`choose`](mod@choose) (the
//! choice).

pub mod calibration;
pub mod candidates;
pub mod choose;
#[cfg(test)]
mod tests;

pub use calibration::{default_path, Calibration, CalibrationError, CodecTiming, Invalid, FORMAT};
pub use candidates::{
    candidates, default_candidates, split_specs, DEFAULT_CANDIDATES,
    DEFAULT_CANDIDATES_NO_MOMENTUM, KNOWN,
};
pub use choose::{choose, network, Choice, TensorChoice};

/// Why `--codec auto` cannot choose.
#[derive(Debug, thiserror::Error)]
pub enum AutoError {
    /// A candidate spec that does not parse.
    #[error("`{spec}`: {source}")]
    Spec {
        /// The spec.
        spec: String,
        /// Why it does not parse.
        #[source]
        source: gradwire_engine::codec::ConfigError,
    },
    /// DGC among the candidates.
    #[error(
        "dgc cannot be mixed per tensor: it owns the momentum, so tensors under other codecs \
         would get momentum twice"
    )]
    Dgc,
    /// A codec `auto` does not know the wire bytes of.
    #[error("`{spec}` is not a codec auto weighs; known: {}", KNOWN.map(|k| k.0).join(", "))]
    Unknown {
        /// The spec.
        spec: String,
    },
    /// A known codec the calibration has no costs for.
    #[error("the calibration has no costs for `{spec}`: run `gradwire calibrate`")]
    Uncalibrated {
        /// The spec.
        spec: String,
    },
    /// An empty candidate list.
    #[error("no candidates")]
    Empty,
    /// The engine refused to plan a candidate on a tensor.
    #[error("planning {codec} for {tensor}: {source}")]
    Plan {
        /// The candidate.
        codec: String,
        /// The tensor.
        tensor: String,
        /// The engine's reason.
        #[source]
        source: Box<gradwire_engine::Error>,
    },
    /// The cost model refused a prediction (a cost out of range, no workers).
    #[error("cost model: {0}")]
    Model(#[from] crate::Error),
}
