//! Runs the engine bench (`engine` vs `per_tensor` vs `flat`) on a `Local` world of threads:
//! `cargo bench -p gradwire-engine --bench bench_engine -- [NP] [REPS] [canonical|tree|collective] [CASE]`
//! (`CASE`: `lenet`, `lstm` or `many-small`; default all).
#![allow(missing_docs)] // a bench binary: nothing here is API

use gradwire_engine::bench::{run, BenchCase};
use gradwire_engine::{DenseAlgorithm, EngineConfig};
use gradwire_transport::local::Local;

fn main() {
    // `cargo bench` passes `--bench`; the rest are this bench's own arguments.
    let mut args = std::env::args().skip(1).filter(|a| !a.starts_with("--"));
    let np: usize = args.next().map(|a| a.parse().expect("NP")).unwrap_or(4);
    let reps: usize = args.next().map(|a| a.parse().expect("REPS")).unwrap_or(20);
    let dense = match args.next().as_deref() {
        Some("tree") => DenseAlgorithm::Tree,
        Some("collective") => DenseAlgorithm::Collective,
        _ => DenseAlgorithm::Canonical,
    };
    let only = args.next();
    let config = EngineConfig {
        dense,
        ..Default::default()
    };
    println!("dense algorithm: {dense:?}");
    for case in BenchCase::ALL {
        if only.as_deref().is_some_and(|c| c != case.name()) {
            continue;
        }
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = Local::world(np)
                .into_iter()
                .map(|t| {
                    let config = config.clone();
                    s.spawn(move || run(t, case, reps, config).unwrap().0)
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let r = &results[0];
        println!(
            "{:<11} np={np} tensors={:<5} engine {:>8.3} ms  per_tensor {:>8.3} ms  flat {:>8.3} ms  \
             engine vs per_tensor {:.2}x  vs flat {:.2}x  (rounds {:.1}, collectives {:.1}, speculative {:.2})",
            r.case,
            r.tensors,
            r.engine_ms,
            r.per_tensor_ms,
            r.flat_ms,
            r.speedup_vs_per_tensor(),
            r.speedup_vs_flat(),
            r.engine_rounds,
            r.engine_collectives,
            r.engine_speculative
        );
    }
}
