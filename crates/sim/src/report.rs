//! The data of a `gradwire simulate` report (`--json FILE`): one [`SimResult`] per
//! prediction, the [`Inputs`] every prediction used, and the model-parallel projections
//! ([`MpRow`], [`MpInputs`]). Field names are the JSON's.

use serde::Serialize;

use crate::lockstep::HostStep;
use crate::{CodecProfile, ModelProfile, Network, Split};

/// One prediction, as the JSON's `results` entries.
#[derive(Debug, Clone, Serialize)]
pub struct SimResult {
    /// Number of workers.
    pub workers: usize,
    /// The link spec as given.
    pub link: String,
    /// The codec spec as given.
    pub codec: String,
    /// Predicted seconds per step.
    pub step_s: f64,
    /// Dense step time over this codec's.
    pub speedup: f64,
    /// One worker's compute-only step over this step (weak scaling).
    pub efficiency: f64,
}

/// Every number the predictions used.
#[derive(Debug, Clone, Serialize)]
pub struct Inputs {
    /// The model, its tensors and its compute per step.
    pub model: ModelProfile,
    /// Whether the compute was measured here (false: `--compute-ms`).
    pub compute_measured: bool,
    /// Per codec: strategy, costs and wire bytes per element.
    pub codecs: Vec<CodecProfile>,
    /// Per link: the spec and its alpha, beta, gamma.
    pub networks: Vec<(String, Network)>,
    /// Whether the stack was calibrated (`--calibrate`).
    pub calibrated: bool,
    /// Overlap fraction.
    pub overlap: f64,
    /// Fusion buffer bytes.
    pub fusion_bytes: usize,
    /// Cores the workers share (`--host-cores`), if any.
    pub host_cores: Option<usize>,
    /// Per codec, the factor the engine measurement applied to its codec costs (already in
    /// `codecs`).
    pub engine_factors: Vec<(String, f64)>,
    /// With `--host-cores`: per worker count and codec (and dense, the speedup's baseline),
    /// a whole step of that many ranks measured together on this host without a link (the
    /// prediction adds the link's communication to `step_s`, and reads `compute.slowest_s`
    /// as its compute).
    pub host_steps: Vec<HostStep>,
}

/// One model-parallel projection, as the JSON's `model_parallel` entries.
#[derive(Debug, Clone, Serialize)]
pub struct MpRow {
    /// The model's parameters, `layers x width²`.
    pub params: u64,
    /// Its layers.
    pub layers: usize,
    /// Its width.
    pub width: usize,
    /// Partitions the replica is split over.
    pub k: usize,
    /// `tensor` or `pipeline`.
    pub split: Split,
    /// The link spec as given.
    pub link: String,
    /// Predicted seconds per step of the replica.
    pub step_s: f64,
    /// The slowest partition's compute (with the pipeline's bubble).
    pub compute_s: f64,
    /// Bytes the partitions send one another per step, all together.
    pub boundary_bytes: f64,
    /// Boundary communication per step.
    pub comm_s: f64,
    /// One partition's step over this one.
    pub speedup: f64,
}

/// What the model-parallel projection used besides the networks (in `inputs`).
#[derive(Debug, Clone, Serialize)]
pub struct MpInputs {
    /// Examples per step of the replica.
    pub batch: usize,
    /// Sustained GFLOP/s of one partition.
    pub gflops: f64,
    /// Whether that rate is `--model`'s step measured here (false: `--mp-gflops`; with
    /// `--compute-ms`, the rate that compute gives).
    pub gflops_measured: bool,
    /// GPipe micro-batches (pipeline rows).
    pub micro_batches: usize,
    /// The small-product half-rate dimension (0: off).
    pub half_rate_dim: f64,
}
