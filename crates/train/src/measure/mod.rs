//! Measuring on this machine what the cost model of `gradwire-sim` takes as inputs.
//!
//! This module owns timing: it runs the real model, codecs, transport and engine and reports
//! seconds and bytes, and never predicts anything (`gradwire-sim` does that arithmetic) nor
//! prints. `gradwire simulate` and `gradwire calibrate` (the CLI) are its users. One concept per file:
//!
//! * [`passes`]: the timing discipline every measurement shares: [`WARMUP_PASSES`] untimed
//!   passes, then the median of at least [`MIN_PASSES`] timed ones over at least
//!   [`MIN_SECONDS`] ([`median_of_passes`], [`median`]);
//! * [`compute`]: a model's compute per step as the trainer counts it
//!   ([`measure_compute`]), on a deterministic synthetic batch ([`synthetic_batch`]);
//! * [`codec`]: a codec's wire bytes, encode and decode cost on a real gradient, one codec
//!   per tensor as the engine builds them ([`measure_codec`]);
//! * [`stack`]: the software's per-message and per-byte cost over a TCP loopback pair and the
//!   reduction cost ([`calibrate_stack`], [`one_way`]);
//! * [`engine`]: one step of the engine averaging a gradient on two in-process ranks
//!   ([`engine_step_time`]), and its cost over the bare codec's predicted one
//!   ([`engine_factor`]);
//! * [`calibration`]: the costs `--codec auto` prices its candidates with (the stack's and
//!   each codec's on a synthetic gradient, in about a second), and their cache
//!   ([`calibrate`], [`cached`]);
//! * [`host`]: a whole training step of ranks sharing one host's cores, in lockstep through
//!   the engine ([`rank_steps`], [`summarize`], [`HostStep`]).
//!
//! Timings vary with the machine and its load, so only what is deterministic (medians,
//! summaries, wire bytes, batches) is unit-tested here.

pub mod calibration;
pub mod codec;
pub mod compute;
pub mod engine;
pub mod host;
pub mod passes;
pub mod stack;

pub use calibration::{cached, calibrate, CalibrateError, Source};
pub use codec::{codec_profile, measure_codec, measure_codec_within, payloads_len, CodecCost};
pub use compute::{measure_compute, synthetic_batch};
pub use engine::{engine_factor, engine_step_time, EngineFactor, ENGINE_STEPS};
pub use host::{rank_steps, summarize, HostStep, Lockstep, LOCKSTEP_PASSES, MAX_SHARED_WORKERS};
pub use passes::{
    median, median_of_passes, median_within, Passes, MAX_PASSES, MIN_PASSES, MIN_SECONDS,
    WARMUP_PASSES,
};
pub use stack::{calibrate_stack, one_way, tcp_pair, Stack};

/// Result alias of the measurements.
pub type Result<T> = std::result::Result<T, MeasureError>;

/// What can stop a measurement.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The model's forward-backward pass failed (a batch it cannot take, for one).
    #[error("the model's training pass: {0}")]
    Model(#[source] crate::Error),
    /// The engine refused the configuration or a synchronization failed.
    #[error("engine: {0}")]
    Engine(#[from] gradwire_engine::Error),
    /// Opening the ranks or moving a message between them failed.
    #[error("transport: {0}")]
    Transport(#[from] gradwire_transport::Error),
    /// A measurement that needs two ranks was given another number of them.
    #[error("the measurement needs 2 ranks, got {0}")]
    Ranks(usize),
    /// The cost model refused a prediction the measurement compares against.
    #[error("cost model: {0}")]
    Predict(#[from] gradwire_sim::Error),
    /// A thread of the measurement (one rank of it) panicked.
    #[error("{0} panicked")]
    Panicked(&'static str),
}
