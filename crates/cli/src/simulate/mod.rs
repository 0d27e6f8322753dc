//! `gradwire simulate`: predicted step time, speedup over dense and scaling efficiency of a
//! model with a codec on P workers over a link, from the cost model of `gradwire-sim`.
//!
//! This module is the command: its arguments, the flow from measurements to predictions, the
//! tables and the JSON. The measurements are [`gradwire_train::measure`]'s (its constants and
//! functions are linked below); the predictions, their grids and the report's data are
//! `gradwire_sim`'s ([`gradwire_sim::sweep`], [`gradwire_sim::projection`],
//! [`gradwire_sim::report`]).
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
//! without a link ([`crate::simulate::host::lockstep_step`], each rank
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

mod args;
pub mod host;
mod model_parallel;
mod report;
mod table;
#[cfg(test)]
mod tests;

use anyhow::{bail, Context, Result};
use gradwire_codec::{CodecConfig, TensorInfo};
use gradwire_engine::{Strategy, TensorSpec};
use gradwire_sim::report::{Inputs, MpInputs, SimResult};
use gradwire_sim::sweep::{sweep, Sweep, DENSE};
use gradwire_sim::{CodecProfile, ModelProfile, Network, DEFAULT_GAMMA};
use gradwire_train::data::{DataShape, DatasetKind};
use gradwire_train::measure::{
    calibrate_stack, codec_profile, engine_factor, measure_compute, synthetic_batch, Stack,
};
use gradwire_transport::link::LinkConfig;

pub use args::SimulateArgs;
use model_parallel::{model_parallel_plan, model_parallel_rows, print_mp_table};
use report::SimReport;
use table::print_table;

/// Runs `gradwire simulate`.
///
/// Longer than 120 lines on purpose: the command's flags are read in the order the
/// predictions need them (the model's profile, the codecs' measured costs, the links, the
/// sweep), then printed; the measuring and the model are `gradwire_train::measure` and
/// `gradwire_sim`.
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
    let codecs: Vec<(String, CodecConfig)> = crate::bench::codecs::split_specs(&args.codec)
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
        return crate::simulate::host::host_worker(args, codec, data, &batch);
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
    let mut codec_profiles: Vec<CodecProfile> = codecs
        .iter()
        .map(|(spec, c)| codec_profile(spec, c, &infos, &grad, args.seed))
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
    let mut engine_factors = Vec::new();
    if let Some(s) = &stack {
        let specs: Vec<TensorSpec> = tensors
            .iter()
            .map(gradwire_train::ParamTensor::spec)
            .collect();
        for ((_, config), c) in codecs.iter().zip(codec_profiles.iter_mut()) {
            if c.strategy == Strategy::Dense {
                continue;
            }
            let f = engine_factor(
                config,
                &specs,
                &grad,
                args.seed,
                &profile,
                c,
                s,
                args.fusion_bytes,
            )?;
            let factor = f.factor;
            eprintln!(
                "calibrated: {} through the engine: {:.1} ms per step at 2 ranks, bare codec \
                 {:.1} ms + copies {:.1} ms: codec costs x{factor:.2}",
                c.spec,
                f.measured_s * 1e3,
                f.predicted.codec_s * 1e3,
                f.predicted.comm_s * 1e3
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
        let net = Network::from_link_with_stack(&cfg.default, s.alpha, s.beta, s.gamma)?;
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
                let h = crate::simulate::host::lockstep_step(args, spec, workers, cores)?;
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
    let rows = sweep(&Sweep {
        model: &profile,
        codecs: &codec_profiles,
        networks: &networks,
        workers: &args.workers,
        overlap: args.overlap,
        fusion_bytes: args.fusion_bytes,
        host_cores: args.host_cores,
        host_steps: &host_steps,
    })?;
    let results: Vec<SimResult> = rows.iter().map(|r| r.result()).collect();
    print_table(&profile, &rows, args.compute_ms.is_none());
    let (model_parallel, model_parallel_inputs) = if mp_nets.is_empty() {
        (None, None)
    } else {
        let gflops = match args.mp_gflops {
            Some(g) => g,
            None => gradwire_sim::projection::measured_gflops(
                model.num_params(),
                args.batch,
                profile.compute_s,
            )
            .context("--compute-ms 0 gives no rate for --model-parallel: give --mp-gflops")?,
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
        provenance: gradwire_run::report::records::Provenance::current(),
        model_parallel,
        model_parallel_inputs,
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
