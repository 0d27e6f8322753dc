//! `gradwire check`: all-reduce a known pattern across the job and verify it exactly.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use gradwire_collective::{Algorithm, Collectives, ReduceOp};
use gradwire_transport::Transport;

/// Arguments of `gradwire check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Elements (f32) per all-reduce.
    #[arg(long, default_value_t = 1 << 20)]
    elements: usize,
    /// How many all-reduces to run.
    #[arg(long, default_value_t = 3)]
    iters: usize,
    /// Algorithm: auto, ring, rd, rabenseifner.
    #[arg(long, default_value = "auto")]
    algo: Algorithm,
    #[arg(long, value_enum, default_value = "auto", help = gradwire_run::join::TRANSPORT_HELP)]
    transport: gradwire_run::join::TransportKind,
}

/// Runs the check on this rank.
pub fn run(args: &CheckArgs) -> Result<()> {
    let mut t = gradwire_run::join::join_from_env(args.transport)?;
    let (rank, world) = (t.rank(), t.world_size());
    let mut transport = args.transport.resolve().to_string();
    let mut hier = None;
    if args.transport.resolve() == gradwire_run::join::TransportKind::Tcp {
        hier = crate::hier::detect(&mut *t)?;
        if let Some(h) = &hier {
            transport = format!("tcp+shm, {}", h.describe());
        }
    }
    let mut buf = vec![0f32; args.elements];
    // Integer-valued inputs: the sum is exact whatever the reduction order.
    let total = (world * (world + 1) / 2) as f32;
    for iter in 0..args.iters {
        for (i, x) in buf.iter_mut().enumerate() {
            *x = ((rank + 1) * (i % 7 + iter)) as f32;
        }
        let start = Instant::now();
        match hier.as_mut() {
            Some(h) => h.all_reduce(&mut *t, &mut buf, ReduceOp::Sum)?,
            None => t.all_reduce_with(&mut buf, ReduceOp::Sum, args.algo)?,
        }
        let ms = start.elapsed().as_secs_f64() * 1e3;
        if let Some((i, x)) = buf
            .iter()
            .enumerate()
            .find(|&(i, &x)| x != total * (i % 7 + iter) as f32)
        {
            bail!(
                "rank {rank}: element {i} is {x}, expected {}",
                total * (i % 7 + iter) as f32
            );
        }
        println!(
            "rank {rank}/{world} ({transport}): iteration {iter}: all-reduce of {} elements ok \
             ({ms:.2} ms)",
            args.elements
        );
    }
    t.barrier()?;
    Ok(())
}
