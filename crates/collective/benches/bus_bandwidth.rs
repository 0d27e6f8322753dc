//! Bus bandwidth of `all_reduce` over the in-process transports: `local` (channels), `shm`
//! (shared-memory rings) and `tcp` (loopback), for 2 and 4 ranks at 4 KiB .. 16 MiB.
//!
//! Bus bandwidth is NCCL's: `2 (n - 1) / n * bytes / time`, the rate each rank's link runs
//! at in a ring all-reduce, comparable across world sizes. Each rank is a thread; times are
//! the median of the iterations (after one warm-up), taken as the slowest rank's.
//!
//! ```text
//! cargo bench -p gradwire-collective --bench bus_bandwidth [-- MAX_SECONDS_PER_CELL]
//! ```
#![allow(missing_docs)] // a bench binary: nothing here is API

use std::time::{Duration, Instant};

use gradwire_collective::{Collectives, ReduceOp};
use gradwire_transport::{local::Local, shm, tcp, Transport};

fn world(kind: &str, n: usize) -> Vec<Box<dyn Transport>> {
    match kind {
        "local" => Local::world(n)
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .collect(),
        "shm" => shm::local_world(n, shm::DEFAULT_RING_BYTES)
            .expect("shm world")
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .collect(),
        "tcp" => tcp::loopback_world(n)
            .expect("tcp world")
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .collect(),
        _ => unreachable!(),
    }
}

/// Median seconds per all-reduce of `bytes` over `n` ranks.
fn time_all_reduce(kind: &str, n: usize, bytes: usize, budget: Duration) -> f64 {
    let len = bytes / 4;
    let ranks = world(kind, n);
    let per_rank: Vec<Vec<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .into_iter()
            .map(|mut t| {
                s.spawn(move || {
                    let mut buf = vec![1.0f32; len];
                    t.all_reduce(&mut buf, ReduceOp::Sum).unwrap(); // warm-up
                                                                    // Rank 0 decides how many iterations fit the budget; all follow it.
                    let t0 = Instant::now();
                    t.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                    let one = t0.elapsed().as_secs_f64().max(1e-7);
                    let mut iters = [((budget.as_secs_f64() / one) as i32).clamp(3, 1000)];
                    t.broadcast(&mut iters, 0).unwrap();
                    (0..iters[0] as u32)
                        .map(|_| {
                            let t0 = Instant::now();
                            t.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
                            t0.elapsed().as_secs_f64()
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let iters = per_rank[0].len();
    let mut slowest: Vec<f64> = (0..iters)
        .map(|i| per_rank.iter().map(|r| r[i]).fold(0.0, f64::max))
        .collect();
    slowest.sort_by(|a, b| a.total_cmp(b));
    slowest[iters / 2]
}

fn main() {
    let budget = Duration::from_secs_f64(
        // `cargo bench` passes `--bench`; the rest are this bench's own arguments.
        std::env::args()
            .skip(1)
            .find(|a| !a.starts_with("--"))
            .and_then(|a| a.parse().ok())
            .unwrap_or(0.3),
    );
    let sizes = [4usize << 10, 64 << 10, 1 << 20, 16 << 20];
    println!("bus bandwidth of all_reduce (GB/s = 1e9 bytes/s), median, slowest rank");
    println!(
        "{:>5} {:>6} {:>9} {:>12} {:>12}",
        "ranks", "kind", "size", "time", "busbw GB/s"
    );
    for n in [2usize, 4] {
        for &bytes in &sizes {
            for kind in ["local", "shm", "tcp"] {
                let t = time_all_reduce(kind, n, bytes, budget);
                let busbw = 2.0 * (n as f64 - 1.0) / n as f64 * bytes as f64 / t / 1e9;
                println!(
                    "{n:>5} {kind:>6} {:>9} {:>10.1}us {busbw:>12.3}",
                    human(bytes),
                    t * 1e6
                );
            }
        }
    }
}

fn human(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{}MiB", b >> 20)
    } else {
        format!("{}KiB", b >> 10)
    }
}
