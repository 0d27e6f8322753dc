//! all_reduce over in-process (`Local`) worlds of 2 and 4 ranks at a few sizes, per
//! algorithm. Each iteration runs one all-reduce on every rank (threads kept alive across
//! iterations, driven through channels). Kept short: a few sizes, small sample counts.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gradwire_collective::{Algorithm, Collectives, ReduceOp};
use gradwire_transport::local::Local;

/// A world of ranks parked in threads; `run(iters)` makes each do `iters` all-reduces.
struct World {
    go: Vec<Sender<u64>>,
    done: Receiver<()>,
    threads: Vec<JoinHandle<()>>,
}

impl World {
    fn new(n: usize, len: usize, algo: Algorithm) -> World {
        let (done_tx, done) = channel();
        let mut go = Vec::new();
        let threads = Local::world(n)
            .into_iter()
            .map(|mut t| {
                let (tx, rx) = channel::<u64>();
                go.push(tx);
                let done_tx = done_tx.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![1.0f32; len];
                    while let Ok(iters) = rx.recv() {
                        for _ in 0..iters {
                            t.all_reduce_with(&mut buf, ReduceOp::Sum, algo).unwrap();
                        }
                        done_tx.send(()).unwrap();
                    }
                })
            })
            .collect();
        World { go, done, threads }
    }

    fn run(&self, iters: u64) -> Duration {
        let start = Instant::now();
        for g in &self.go {
            g.send(iters).unwrap();
        }
        for _ in &self.go {
            self.done.recv().unwrap();
        }
        start.elapsed()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.go.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn all_reduce(c: &mut Criterion) {
    let mut g = c.benchmark_group("all_reduce_local");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(600));
    for world in [2usize, 4] {
        for len in [256usize, 65_536, 1 << 20] {
            g.throughput(Throughput::Bytes((len * 4) as u64));
            for algo in [
                Algorithm::Auto,
                Algorithm::Ring,
                Algorithm::RecursiveDoubling,
                Algorithm::Rabenseifner,
            ] {
                let w = World::new(world, len, algo);
                g.bench_with_input(
                    BenchmarkId::new(format!("w{world}/{algo}"), len * 4),
                    &len,
                    |b, _| b.iter_custom(|iters| w.run(iters)),
                );
            }
        }
    }
    g.finish();
}

criterion_group!(benches, all_reduce);
criterion_main!(benches);
