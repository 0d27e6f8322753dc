//! The flags of `gradwire simulate` ([`SimulateArgs`], also its `--help` text) and the
//! parameter counts `--params` takes ([`param_count`]).

use std::path::PathBuf;

use gradwire_engine::EngineConfig;
use gradwire_sim::Split;
use gradwire_train::data::DatasetKind;
use gradwire_train::ModelKind;

/// Arguments of `gradwire simulate`.
#[derive(clap::Args, Debug, Clone)]
pub struct SimulateArgs {
    /// Model spec: mlp, lenet, resnet, or a wide MLP such as mlp:hidden=2048x3.
    #[arg(long, default_value = "mlp:hidden=2048x3")]
    pub model: ModelKind,
    /// Data set whose image shape the model takes: fashion-mnist, mnist, cifar10.
    #[arg(long, default_value = "fashion-mnist")]
    pub dataset: DatasetKind,
    /// Worker counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8,64,1024")]
    pub workers: Vec<usize>,
    /// Link spec (`10gbit`, `1gbit,50us`, see `gradwire train --help`); repeat for several.
    #[arg(long, value_parser = crate::bench::allreduce::link_arg, default_value = "10gbit")]
    pub link: Vec<String>,
    /// Codec specs, separated by `;` or `,` (as `bench codecs --codecs`); `none` is dense.
    #[arg(long, default_value = "dgc:ratio=0.001")]
    pub codec: String,
    /// Batch size per worker (one replica), for the compute measurement and the
    /// model-parallel projection.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Compute per step in milliseconds, instead of measuring it.
    #[arg(long)]
    pub compute_ms: Option<f64>,
    /// Fraction of the communication hidden behind compute, 0 to 1 (this engine receives
    /// the gradient after the whole backward pass: 0).
    #[arg(long, default_value_t = 0.0)]
    pub overlap: f64,
    /// The engine's fusion buffer in bytes.
    #[arg(long, default_value_t = EngineConfig::default().fusion_bytes)]
    pub fusion_bytes: usize,
    /// Measure the stack's per-message cost, the reduction cost and the emulated links'
    /// bandwidth on this machine.
    #[arg(long)]
    pub calibrate: bool,
    /// The workers share this many cores of one host (validation on one machine; default: a
    /// host each): per worker count and codec, a whole training step of that many ranks
    /// (at most 64) is measured here without a link (each rank its own model copy and
    /// cores/workers threads, the engine with the codec, TCP on 127.0.0.1), and the link's
    /// communication is added to it, less what hides behind the other ranks' share of the
    /// measured sync work (`gradwire_sim::predict`'s module doc). With --compute-ms
    /// instead, that compute is taken as given and the codec costs are multiplied by
    /// max(1, workers / cores).
    #[arg(long)]
    pub host_cores: Option<usize>,
    /// Internal: run as one rank of a --host-cores step measurement (started by simulate).
    #[arg(long, hide = true)]
    pub host_worker: bool,
    /// Also project model parallelism (DistBelief): one replica split over each of these
    /// partition counts, comma-separated (default: off). Each row is the step of a fully
    /// connected model of --params parameters in --layers layers on K partitions: compute / K
    /// plus the traffic across the partitions' boundaries (`gradwire_sim::model_parallel`).
    #[arg(long, value_delimiter = ',')]
    pub model_parallel: Vec<usize>,
    /// How --model-parallel splits the model, comma-separated for several: tensor (every
    /// layer's matrix in K slices, Megatron-style: an all-reduce of the batch's activations
    /// per layer pair forward and one backward) or pipeline (consecutive layers per
    /// partition, GPipe: activations and their gradients across each boundary, the bubble of
    /// --micro-batches).
    #[arg(long, value_delimiter = ',', default_value = "tensor")]
    pub mp_split: Vec<Split>,
    /// GPipe micro-batches per step for --mp-split pipeline (1 to --batch).
    #[arg(long, default_value_t = 8)]
    pub micro_batches: usize,
    /// Parameter counts of the fully connected models --model-parallel splits,
    /// comma-separated (100M, 1.7B, 2e9).
    #[arg(long, value_delimiter = ',', value_parser = param_count, default_value = "100M,1.7B")]
    pub params: Vec<f64>,
    /// Layers of the --params models, each of width sqrt(params / layers) (a pipeline
    /// split uses at most this many partitions).
    #[arg(long, default_value_t = 32)]
    pub layers: usize,
    /// Sustained GFLOP/s of one partition for --model-parallel (default: the rate of
    /// --model's step on this machine, 6 x parameters x batch / compute per step).
    #[arg(long)]
    pub mp_gflops: Option<f64>,
    /// For --model-parallel, the split dimension at which a partition's matrix products run
    /// at half the machine's rate (a product split to d columns, or micro-batch rows, runs at
    /// d / (d + this)); 0 models every product at full rate.
    #[arg(long, default_value_t = 0.0)]
    pub mp_half_dim: f64,
    /// Seed of the model, the batch and the stochastic codecs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// A parameter count: a number with an optional decimal suffix, `K` (10³), `M` (10⁶) or `B`
/// / `G` (10⁹): `100M`, `1.7B`, `2e9`.
pub fn param_count(s: &str) -> std::result::Result<f64, String> {
    let t = s.trim();
    let (num, scale) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() && !t.ends_with(['e', 'E']) => {
            let scale = match c.to_ascii_uppercase() {
                'K' => 1e3,
                'M' => 1e6,
                'B' | 'G' => 1e9,
                _ => return Err(format!("unknown suffix '{c}' in '{s}' (use K, M, B)")),
            };
            (&t[..i], scale)
        }
        _ => (t, 1.0),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a parameter count (e.g. 100M, 1.7B)"))?;
    let n = n * scale;
    if n.is_finite() && n >= 1.0 {
        Ok(n)
    } else {
        Err(format!("'{s}' is not a parameter count of at least 1"))
    }
}
