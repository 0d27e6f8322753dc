//! `gradwire check`: all-reduce a known pattern across the job and verify it exactly
//! ([`gradwire_collective::bench::check`]).

use anyhow::Result;
use clap::Args;
use gradwire_collective::bench::{check_iteration, HierarchicalAllReduce};
use gradwire_collective::{Algorithm, Collectives};
use gradwire_run::join::TransportKind;

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
    transport: TransportKind,
}

/// Runs the check on this rank.
pub fn run(args: &CheckArgs) -> Result<()> {
    let mut t = gradwire_run::join::join_from_env(args.transport)?;
    let (rank, world) = (t.rank(), t.world_size());
    let mut transport = args.transport.resolve().to_string();
    let mut hier = None;
    if args.transport.resolve() == TransportKind::Tcp {
        hier = gradwire_engine::HostGroups::connect_from_env(&mut *t)?;
        if let Some(h) = &hier {
            transport = format!("tcp+shm, {}", h.describe());
        }
    }
    let mut buf = vec![0f32; args.elements];
    for iter in 0..args.iters {
        let h = hier.as_mut().map(|h| h as &mut dyn HierarchicalAllReduce);
        let ms = check_iteration(&mut *t, h, args.algo, &mut buf, iter)?.as_secs_f64() * 1e3;
        println!(
            "rank {rank}/{world} ({transport}): iteration {iter}: all-reduce of {} elements ok \
             ({ms:.2} ms)",
            args.elements
        );
    }
    t.barrier()?;
    Ok(())
}
