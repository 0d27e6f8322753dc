//! The model-parallel projection of `gradwire simulate --model-parallel K,...`: its flags
//! checked and handed to [`gradwire_sim::projection`], and the rows' table.

use anyhow::{bail, Result};
use gradwire_sim::projection::{self, ProjectionError};
use gradwire_sim::report::{MpInputs, MpRow};
use gradwire_sim::{FcNet, Network};

use super::args::SimulateArgs;

/// The models, splits and partition counts of `--model-parallel`, checked against the
/// model before anything is measured ([`projection::plan`]).
pub(super) fn model_parallel_plan(args: &SimulateArgs) -> Result<Vec<FcNet>> {
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
    projection::plan(
        &args.params,
        args.layers,
        &args.mp_split,
        &args.model_parallel,
        args.batch,
        args.micro_batches,
        args.mp_half_dim,
    )
    .map_err(|e| match e {
        ProjectionError::Model {
            params,
            layers,
            source,
        } => anyhow::Error::new(source).context(format!("--params {params} in --layers {layers}")),
        ProjectionError::Split {
            k,
            params,
            layers,
            width,
            source,
        } => anyhow::Error::new(source).context(format!(
            "--model-parallel {k} of {params} parameters ({layers} layers of {width})"
        )),
    })
}

/// One row per (model, split, link, K), in that nesting ([`projection::rows`]).
pub(super) fn model_parallel_rows(
    nets: &[FcNet],
    args: &SimulateArgs,
    inputs: &MpInputs,
    networks: &[(String, Network)],
) -> Result<Vec<MpRow>> {
    Ok(projection::rows(
        nets,
        &args.mp_split,
        &args.model_parallel,
        inputs,
        networks,
    )?)
}

/// A parameter count as people write it: `100M`, `1.70B`.
pub(super) fn format_params(p: u64) -> String {
    let p = p as f64;
    if p >= 1e9 {
        format!("{:.2}B", p / 1e9)
    } else if p >= 1e6 {
        format!("{:.0}M", p / 1e6)
    } else {
        format!("{p:.0}")
    }
}

/// Prints the model-parallel rows under a header naming where the partitions' rate came
/// from.
pub(super) fn print_mp_table(rows: &[MpRow], inputs: &MpInputs, given_compute: bool) {
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
