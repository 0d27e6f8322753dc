//! The model-parallel projection of `gradwire simulate --model-parallel K,...`: the models
//! and splits checked up front, one row per (model, split, link, K), and their table.

use anyhow::{bail, Context, Result};
use gradwire_sim::{mp_step, FcNet, MpConfig, Network};

use super::args::SimulateArgs;
use super::report::{MpInputs, MpRow};

/// The models, splits and partition counts of `--model-parallel`, checked against the
/// model before anything is measured (at a placeholder rate and link).
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

/// One row per (model, split, link, K), in that nesting.
pub(super) fn model_parallel_rows(
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
