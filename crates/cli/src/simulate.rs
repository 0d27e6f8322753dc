//! `gradwire simulate`: predicted step time, speedup over dense and scaling efficiency of a
//! model with a codec on P workers over a link, from the cost model of `gradwire-sim`.
//!
//! This module is the command: its arguments, the flow from measurements to predictions, the
//! tables and the JSON. The measurements themselves are [`gradwire_train::measure`]'s
//! (its constants and functions are linked below).
//!
//! What is measured on this machine, every run (a few seconds):
//! * the model's compute per step as the trainer counts it: the median of at least
//!   [`MIN_PASSES`](gradwire_train::measure::MIN_PASSES) forward-backward passes on a
//!   synthetic batch of `--batch` images, each with an SGD-with-momentum update over all
//!   parameters and the parameters handed back to the model, for at least
//!   [`MIN_SECONDS`](gradwire_train::measure::MIN_SECONDS) after
//!   [`WARMUP_PASSES`](gradwire_train::measure::WARMUP_PASSES) untimed ones (skipped with
//!   `--compute-ms`);
//! * each codec's wire bytes, encode and decode cost on that model's real gradient, one codec
//!   per tensor as the engine builds them (sparse codecs: the pairs the sparse all-reduce
//!   sends, 8 bytes each). DGC is measured past its warm-up.
//!
//! With `--calibrate` also the stack (about a second): over a TCP loopback pair (the transport
//! `gradwire train` uses between processes), the per-message software cost (one-way time of 8
//! bytes, added to each link's latency in `alpha`) and the per-byte software cost (one-way
//! time of 4 MiB minus that, added to each link's wire time in `beta`: the copies and the wire
//! do not overlap), and the reduction cost `gamma` (f32 adds). Without it `alpha` is the
//! link's latency, `beta` its wire time and `gamma` [`DEFAULT_GAMMA`].
//!
//! `--calibrate` also runs each codec through the engine itself (two in-process ranks, no
//! link emulation, the median of [`ENGINE_STEPS`](gradwire_train::measure::ENGINE_STEPS)
//! steps of the model's gradient): the engine spends more than the bare encode and decode
//! (error feedback, stripe and factor planning, PowerSGD's orthogonalization and
//! decompression, the progress thread), so the codec costs are scaled by the measured sync
//! time over the predicted one at two ranks (never below 1).
//!
//! `--host-cores N` models the P workers sharing N cores of one host (validation on this
//! machine): per worker count and codec, a whole training step of P ranks is measured here
//! without a link ([`crate::simulate_host::lockstep_step`], each rank
//! [`rank_steps`](gradwire_train::measure::rank_steps): every rank its own model copy and
//! threads, the engine with the codec, TCP on 127.0.0.1), and the prediction adds the link's
//! communication to it (`gradwire_sim::predict`'s module doc). With a `--compute-ms` that
//! compute is taken as given instead, and the codec costs, measured with the whole machine,
//! are multiplied by `max(1, P / N)`. Efficiency stays relative to one worker with the
//! machine to itself.
//!
//! `--model-parallel K,...` also projects DistBelief's model parallelism: one replica of a
//! fully connected model of `--params` parameters in `--layers` layers, split over `K`
//! partitions by `--mp-split` (tensor or pipeline, GPipe's `--micro-batches`), on each
//! `--link` (`gradwire_sim::model_parallel`'s module doc has the model). Each partition runs at
//! `--mp-gflops`, or by default at the rate of `--model`'s step measured here
//! (`6 x parameters x batch / compute`).
//!
//! JSON (`--json FILE`): `{"results":[{"workers":64,"link":"10gbit","codec":"dgc:ratio=0.001",
//! "step_s":0.21,"speedup":2.4,"efficiency":0.83}],"inputs":{...},"provenance":{...}}`;
//! `inputs` holds every number the prediction used (model, codecs, networks). With
//! `--model-parallel` also `"model_parallel":[{"params":1700000000,"layers":8,"width":14577,
//! "k":8,"split":"tensor","link":"1gbit","step_s":2.1,"compute_s":1.6,"boundary_bytes":4.2e8,
//! "comm_s":0.5,"speedup":6.2}]` and `"model_parallel_inputs":{"batch":64,"gflops":50.0,...}`
//! (both absent without it).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use gradwire_codec::{CodecConfig, TensorInfo};
use gradwire_engine::{EngineConfig, Strategy, TensorSpec};
use gradwire_sim::{
    mp_step, predict, step, CodecProfile, FcNet, MeasuredStep, ModelProfile, MpConfig, Network,
    Scenario, Split,
};
use gradwire_train::data::{DataShape, DatasetKind};
use gradwire_train::measure::{
    calibrate_stack, engine_step_time, measure_codec, measure_compute, synthetic_batch, Stack,
};
use gradwire_train::ModelKind;
use gradwire_transport::link::LinkConfig;
use serde::Serialize;

/// The codec spec of dense fp32 (no codec).
const DENSE: &str = "none";
/// Seconds per byte reduced when not calibrated (10 GB/s of f32 adds).
pub const DEFAULT_GAMMA: f64 = 0.1e-9;

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
    #[arg(long, value_parser = crate::bench_allreduce::link_arg, default_value = "10gbit")]
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
    /// a whole step of that many ranks measured together on this host without a link (the prediction adds the link's
    /// communication to `step_s`, and reads `compute.slowest_s` as its compute).
    pub host_steps: Vec<gradwire_train::measure::HostStep>,
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

/// The JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// One entry per (link, workers, codec).
    pub results: Vec<SimResult>,
    /// What the predictions used.
    pub inputs: Inputs,
    /// The version, revision and command that made the report.
    pub provenance: crate::records::Provenance,
    /// With `--model-parallel`: one entry per (params, split, link, K).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_parallel: Option<Vec<MpRow>>,
    /// With `--model-parallel`: the batch, rate and split options it used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_parallel_inputs: Option<MpInputs>,
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

/// The models, splits and partition counts of `--model-parallel`, checked against the
/// model before anything is measured (at a placeholder rate and link).
fn model_parallel_plan(args: &SimulateArgs) -> Result<Vec<FcNet>> {
    if args.model_parallel.is_empty() {
        return Ok(Vec::new());
    }
    if args.params.is_empty() || args.mp_split.is_empty() {
        bail!("--model-parallel needs --params and --mp-split");
    }
    if let Some(g) = args.mp_gflops {
        if !(g.is_finite() && g > 0.0) {
            bail!("--mp-gflops must be a positive number, got {g}");
        }
    }
    let config = MpConfig {
        micro_batches: args.micro_batches,
        half_rate_dim: args.mp_half_dim,
        ..MpConfig::new(args.batch, 1e9)
    };
    let net = Network::new(0.0, 0.0, 0.0)?;
    let mut nets = Vec::new();
    for &p in &args.params {
        let fc = FcNet::from_params(p, args.layers)
            .with_context(|| format!("--params {p} in --layers {}", args.layers))?;
        for &split in &args.mp_split {
            for &k in &args.model_parallel {
                mp_step(&fc, split, k, &config, &net).with_context(|| {
                    format!(
                        "--model-parallel {k} of {} parameters ({} layers of {})",
                        fc.params(),
                        fc.layers,
                        fc.width
                    )
                })?;
            }
        }
        nets.push(fc);
    }
    Ok(nets)
}

/// Runs `gradwire simulate`.
pub fn run(args: &SimulateArgs) -> Result<()> {
    if args.workers.is_empty() || args.workers.contains(&0) {
        bail!("--workers needs worker counts of at least 1");
    }
    if !(0.0..=1.0).contains(&args.overlap) {
        bail!("--overlap must be between 0 and 1, got {}", args.overlap);
    }
    if args.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let codecs: Vec<(String, CodecConfig)> = crate::bench_codecs::split_specs(&args.codec)
        .into_iter()
        .map(|s| {
            let c = s.parse().with_context(|| format!("codec {s:?}"))?;
            Ok((s, c))
        })
        .collect::<Result<_>>()?;
    if codecs.is_empty() {
        bail!("--codec needs at least one codec spec");
    }
    let shape = match args.dataset {
        DatasetKind::FashionMnist | DatasetKind::Mnist => [1, 28, 28],
        DatasetKind::Cifar10 => [3, 32, 32],
        other => bail!(
            "simulate takes image models; {} is a text data set",
            other.name()
        ),
    };
    let data = DataShape::Image { shape, classes: 10 };
    let mp_nets = model_parallel_plan(args)?;
    if args.host_worker {
        let [(_, codec)]: [(String, CodecConfig); 1] = codecs
            .try_into()
            .map_err(|_| anyhow::anyhow!("--host-worker takes one codec"))?;
        let batch = synthetic_batch(args.batch, shape, args.seed);
        return crate::simulate_host::host_worker(args, codec, data, &batch);
    }
    let mut model = args
        .model
        .build(data, args.seed)
        .with_context(|| format!("building {}", args.model))?;
    eprintln!(
        "gradwire simulate: {} ({} parameters), measuring on this machine...",
        args.model,
        model.num_params()
    );
    let batch = synthetic_batch(args.batch, shape, args.seed);
    let (grad, measured_compute) = measure_compute(model.as_mut(), &batch)?;
    let compute_s = match args.compute_ms {
        Some(ms) if ms.is_finite() && ms >= 0.0 => ms / 1e3,
        Some(ms) => bail!("--compute-ms must be a non-negative number, got {ms}"),
        None => measured_compute,
    };
    let tensors = model.tensors();
    let profile = ModelProfile {
        name: args.model.to_string(),
        tensors: tensors.iter().map(|t| t.len()).collect(),
        compute_s,
    };
    let infos: Vec<TensorInfo> = tensors
        .iter()
        .map(|t| TensorInfo::new(t.shape.clone(), t.role))
        .collect();
    let codec_profiles: Vec<CodecProfile> = codecs
        .iter()
        .map(|(spec, c)| {
            let cost = measure_codec(c, &infos, &grad, args.seed);
            CodecProfile {
                spec: spec.clone(),
                strategy: cost.strategy,
                encode_s_per_elem: cost.encode_s_per_elem,
                decode_s_per_elem: cost.decode_s_per_elem,
                wire_bytes_per_elem: cost.wire_bytes_per_elem,
            }
        })
        .collect();
    let stack = if args.calibrate {
        let s = calibrate_stack()?;
        eprintln!(
            "calibrated (TCP loopback): alpha {:.1} us per message, {:.3} ns per byte of \
             software copies ({:.2} GB/s), gamma {:.3} ns per byte reduced",
            s.alpha * 1e6,
            s.beta * 1e9,
            1e-9 / s.beta.max(1e-15),
            s.gamma * 1e9
        );
        Some(s)
    } else {
        None
    };
    let mut codec_profiles = codec_profiles;
    let mut engine_factors = Vec::new();
    if let Some(s) = stack {
        let specs: Vec<TensorSpec> = tensors
            .iter()
            .map(gradwire_train::ParamTensor::spec)
            .collect();
        // Two ranks in one process: the copies cost about the stack's per-byte time.
        let local = Network::new(s.alpha, s.beta, s.gamma)?;
        for ((_, config), c) in codecs.iter().zip(codec_profiles.iter_mut()) {
            if c.strategy == Strategy::Dense {
                continue;
            }
            let measured = engine_step_time(config, &specs, &grad, args.seed)?;
            let scenario = Scenario {
                workers: 2,
                network: local,
                overlap: 0.0,
                fusion_bytes: args.fusion_bytes,
                host: None,
            };
            let no_compute = ModelProfile {
                compute_s: 0.0,
                ..profile.clone()
            };
            let predicted = step(&no_compute, c, &scenario)?;
            let factor = if predicted.codec_s > 0.0 {
                ((measured - predicted.comm_s) / predicted.codec_s).max(1.0)
            } else {
                1.0
            };
            eprintln!(
                "calibrated: {} through the engine: {:.1} ms per step at 2 ranks, bare codec \
                 {:.1} ms + copies {:.1} ms: codec costs x{factor:.2}",
                c.spec,
                measured * 1e3,
                predicted.codec_s * 1e3,
                predicted.comm_s * 1e3
            );
            c.encode_s_per_elem *= factor;
            c.decode_s_per_elem *= factor;
            engine_factors.push((c.spec.clone(), factor));
        }
    }
    let mut networks = Vec::new();
    for spec in &args.link {
        let cfg: LinkConfig = spec.parse()?;
        let s = stack.unwrap_or(Stack {
            alpha: 0.0,
            beta: 0.0,
            gamma: DEFAULT_GAMMA,
        });
        let mut net = Network::from_link(&cfg.default, s.alpha, s.gamma)?;
        net.beta += s.beta;
        networks.push((spec.clone(), net));
    }
    if args.host_cores == Some(0) {
        bail!("--host-cores must be at least 1");
    }
    // Ranks sharing this host: a whole step of theirs measured, per worker count and codec.
    let mut host_steps = Vec::new();
    if let (Some(cores), None) = (args.host_cores, args.compute_ms) {
        for &workers in &args.workers {
            // As `gradwire train` sizes each worker: the host's cores divided among the ranks.
            let threads = gradwire_train::threads_per_worker(cores, workers);
            // Dense too, as the speedup's baseline, if it is not among the codecs.
            let dense = (!codecs.iter().any(|(s, _)| s == DENSE)).then_some(DENSE);
            let specs = codecs.iter().map(|(s, _)| s.as_str()).chain(dense);
            for spec in specs {
                let h = crate::simulate_host::lockstep_step(args, spec, workers, cores)?;
                eprintln!(
                    "measured: {workers} ranks of {spec} stepping at once on this host without \
                     a link, {threads} thread(s) each: {:.1} ms per step, compute {:.1} ms \
                     (the slowest of each pass)",
                    h.step_s * 1e3,
                    h.compute.slowest_s * 1e3
                );
                host_steps.push(h);
            }
        }
    }
    let mut results = Vec::new();
    let mut rows = Vec::new();
    for (spec, net) in &networks {
        for &workers in &args.workers {
            let share = args
                .host_cores
                .map_or(1.0, |cores| (workers as f64 / cores as f64).max(1.0));
            // With --host-cores (and no --compute-ms): the step of this codec measured on
            // this host, or none (a --compute-ms is taken as given, with the codec costs
            // scaled to the ranks sharing the cores).
            let host_of = |codec: &str| {
                let cores = args.host_cores?;
                host_steps
                    .iter()
                    .find(|h| h.workers == workers && h.codec == codec)
                    .map(|h| MeasuredStep {
                        cores,
                        compute_s: h.compute.slowest_s,
                        step_s: h.step_s,
                    })
            };
            let at = |host| Scenario {
                workers,
                network: *net,
                overlap: args.overlap,
                fusion_bytes: args.fusion_bytes,
                host,
            };
            for c in &codec_profiles {
                let shared = CodecProfile {
                    encode_s_per_elem: c.encode_s_per_elem * share,
                    decode_s_per_elem: c.decode_s_per_elem * share,
                    ..c.clone()
                };
                let mut p = predict(&profile, &shared, &at(host_of(&c.spec)))?;
                // On a shared host dense's own measured step is the speedup's baseline.
                if let Some(h) = host_of(DENSE) {
                    p.dense = step(&profile, &CodecProfile::dense(), &at(Some(h)))?;
                    p.speedup = p.dense.step_s / p.step.step_s;
                }
                // Against one worker with the machine to itself.
                p.efficiency = profile.compute_s / p.step.step_s;
                rows.push((spec.clone(), workers, c.clone(), p));
                results.push(SimResult {
                    workers,
                    link: spec.clone(),
                    codec: c.spec.clone(),
                    step_s: p.step.step_s,
                    speedup: p.speedup,
                    efficiency: p.efficiency,
                });
            }
        }
    }
    print_table(&profile, &rows, args.compute_ms.is_none());
    let (model_parallel, model_parallel_inputs) = if mp_nets.is_empty() {
        (None, None)
    } else {
        let flops = 6.0 * model.num_params() as f64 * args.batch as f64;
        let gflops = match args.mp_gflops {
            Some(g) => g,
            None if profile.compute_s > 0.0 => flops / profile.compute_s / 1e9,
            None => bail!("--compute-ms 0 gives no rate for --model-parallel: give --mp-gflops"),
        };
        let inputs = MpInputs {
            batch: args.batch,
            gflops,
            gflops_measured: args.mp_gflops.is_none(),
            micro_batches: args.micro_batches,
            half_rate_dim: args.mp_half_dim,
        };
        let rows = model_parallel_rows(&mp_nets, args, &inputs, &networks)?;
        print_mp_table(&rows, &inputs, args.compute_ms.is_some());
        (Some(rows), Some(inputs))
    };
    let report = SimReport {
        results,
        inputs: Inputs {
            model: profile,
            compute_measured: args.compute_ms.is_none(),
            codecs: codec_profiles,
            networks,
            calibrated: args.calibrate,
            overlap: args.overlap,
            fusion_bytes: args.fusion_bytes,
            host_cores: args.host_cores,
            engine_factors,
            host_steps,
        },
        provenance: crate::records::Provenance::current(),
        model_parallel,
        model_parallel_inputs,
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn print_table(
    model: &ModelProfile,
    rows: &[(String, usize, CodecProfile, gradwire_sim::Prediction)],
    measured: bool,
) {
    println!(
        "# {}: {} elements, compute {:.1} ms/step ({})",
        model.name,
        model.elements(),
        model.compute_s * 1e3,
        if measured {
            "measured here"
        } else {
            "--compute-ms"
        }
    );
    println!(
        "{:<14} {:>7} {:<24} {:<9} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "link", "workers", "codec", "strategy", "step_ms", "codec_ms", "comm_ms", "speedup", "eff"
    );
    for (link, workers, c, p) in rows {
        println!(
            "{:<14} {:>7} {:<24} {:<9} {:>10.2} {:>10.2} {:>10.2} {:>8.2} {:>8.3}",
            link,
            workers,
            c.spec,
            c.strategy.to_string(),
            p.step.step_s * 1e3,
            p.step.codec_s * 1e3,
            p.step.comm_s * 1e3,
            p.speedup,
            p.efficiency
        );
    }
}

/// One row per (model, split, link, K), in that nesting.
fn model_parallel_rows(
    nets: &[FcNet],
    args: &SimulateArgs,
    inputs: &MpInputs,
    networks: &[(String, Network)],
) -> Result<Vec<MpRow>> {
    let config = MpConfig {
        micro_batches: inputs.micro_batches,
        half_rate_dim: inputs.half_rate_dim,
        ..MpConfig::new(inputs.batch, inputs.gflops * 1e9)
    };
    let mut rows = Vec::new();
    for fc in nets {
        for &split in &args.mp_split {
            for (link, net) in networks {
                for &k in &args.model_parallel {
                    let s = mp_step(fc, split, k, &config, net)?;
                    rows.push(MpRow {
                        params: fc.params() as u64,
                        layers: fc.layers,
                        width: fc.width,
                        k,
                        split,
                        link: link.clone(),
                        step_s: s.step_s,
                        compute_s: s.compute_s,
                        boundary_bytes: s.boundary_bytes,
                        comm_s: s.comm_s,
                        speedup: s.speedup,
                    });
                }
            }
        }
    }
    Ok(rows)
}

/// A parameter count as people write it: `100M`, `1.70B`.
fn format_params(p: u64) -> String {
    let p = p as f64;
    if p >= 1e9 {
        format!("{:.2}B", p / 1e9)
    } else if p >= 1e6 {
        format!("{:.0}M", p / 1e6)
    } else {
        format!("{p:.0}")
    }
}

fn print_mp_table(rows: &[MpRow], inputs: &MpInputs, given_compute: bool) {
    let source = match (inputs.gflops_measured, given_compute) {
        (false, _) => "--mp-gflops",
        (true, false) => "--model's step measured here",
        (true, true) => "--model's --compute-ms",
    };
    println!(
        "# model parallel: one replica of batch {} split over K partitions, {:.1} GFLOP/s \
         each ({source}), {} micro-batches (pipeline), half-rate dim {}",
        inputs.batch, inputs.gflops, inputs.micro_batches, inputs.half_rate_dim
    );
    println!(
        "{:>7} {:>6} {:>6} {:<8} {:<14} {:>3} {:>11} {:>11} {:>10} {:>12} {:>8}",
        "params",
        "layers",
        "width",
        "split",
        "link",
        "K",
        "step_ms",
        "compute_ms",
        "comm_ms",
        "boundary_MB",
        "speedup"
    );
    for r in rows {
        println!(
            "{:>7} {:>6} {:>6} {:<8} {:<14} {:>3} {:>11.1} {:>11.1} {:>10.1} {:>12.1} {:>8.2}",
            format_params(r.params),
            r.layers,
            r.width,
            r.split.name(),
            r.link,
            r.k,
            r.step_s * 1e3,
            r.compute_s * 1e3,
            r.comm_s * 1e3,
            r.boundary_bytes / 1e6,
            r.speedup
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_counts() {
        assert_eq!(param_count("100M"), Ok(1e8));
        assert_eq!(param_count("1.7B"), Ok(1.7e9));
        assert_eq!(param_count("1.7g"), Ok(1.7e9));
        assert_eq!(param_count("2e9"), Ok(2e9));
        assert_eq!(param_count("42k"), Ok(42e3));
        assert_eq!(param_count("12"), Ok(12.0));
        for bad in ["", "M", "1.7X", "-5M", "0", "inf", "1e"] {
            assert!(param_count(bad).is_err(), "{bad}");
        }
        assert_eq!(format_params(1_700_000_000), "1.70B");
        assert_eq!(format_params(100_020_000), "100M");
    }
}
