//! `-- --bench`: our all-reduce over the MPI transport against MPI's native
//! `MPI_Allreduce`, one rank's side (`--mpi-bench N`).

use std::time::Instant;

use gradwire_collective::{Collectives, ReduceOp};
use gradwire_transport::mpi::{Mpi, NativeOp};
use gradwire_transport::Transport;

pub(crate) fn rank_bench(np: usize) {
    let mut t = Mpi::init().expect("initializing MPI");
    let (rank, world) = (t.rank(), t.world_size());
    assert_eq!(world, np);
    if rank == 0 {
        println!("all-reduce f32 sum, np {world}; median over iterations of the slowest rank;");
        println!("bus bandwidth = 2(P-1)/P * bytes / time (nccl-tests convention)");
        println!(
            "{:>8} {:>12} {:>10} {:>12} {:>10} {:>7}",
            "size", "ours us", "ours GB/s", "native us", "nat GB/s", "ratio"
        );
    }
    for size in [4usize << 10, 64 << 10, 1 << 20, 16 << 20] {
        let n = size / 4;
        let iters = ((256usize << 20) / size).clamp(10, 200);
        let mut buf: Vec<f32> = (0..n).map(|i| (i % 13) as f32).collect();
        let mut time = |t: &mut Mpi, native: bool| -> f64 {
            let mut samples = Vec::with_capacity(iters);
            for i in 0..iters + 3 {
                t.native_barrier().expect("barrier");
                let t0 = Instant::now();
                if native {
                    t.native_all_reduce_f32(&mut buf, NativeOp::Sum)
                        .expect("native");
                } else {
                    t.all_reduce(&mut buf, ReduceOp::Sum).expect("ours");
                }
                let mut dt = [t0.elapsed().as_secs_f32()];
                t.native_all_reduce_f32(&mut dt, NativeOp::Max)
                    .expect("max");
                if i >= 3 {
                    samples.push(dt[0] as f64);
                }
            }
            samples.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
            samples[samples.len() / 2]
        };
        let ours = time(&mut t, false);
        let native = time(&mut t, true);
        if rank == 0 {
            let bus = |s: f64| 2.0 * (world as f64 - 1.0) / world as f64 * size as f64 / s / 1e9;
            println!(
                "{:>8} {:>12.1} {:>10.2} {:>12.1} {:>10.2} {:>7.2}",
                human(size),
                ours * 1e6,
                bus(ours),
                native * 1e6,
                bus(native),
                ours / native
            );
        }
    }
}

pub(crate) fn human(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{}MiB", b >> 20)
    } else {
        format!("{}KiB", b >> 10)
    }
}
