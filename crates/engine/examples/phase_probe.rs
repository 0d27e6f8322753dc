//! Temporary: where does engine time go.
use gradwire_engine::bench::BenchCase;
use gradwire_engine::{Engine, EngineConfig};
use gradwire_transport::local::Local;
use std::collections::HashMap;

fn main() {
    let np = 4;
    let tensors = BenchCase::ManySmall.tensors();
    let out: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = Local::world(np)
            .into_iter()
            .map(|t| {
                let tensors = tensors.clone();
                s.spawn(move || {
                    let cfg = EngineConfig {
                        timeline: true,
                        ..Default::default()
                    };
                    let e = Engine::start(t, cfg, &tensors).unwrap();
                    let (mut total, mut sub, mut wt) = (0.0, 0.0, 0.0);
                    for _ in 0..10 {
                        e.all_reduce("bar", vec![0.0]).wait().unwrap();
                        let t0 = std::time::Instant::now();
                        let hs: Vec<_> = tensors
                            .iter()
                            .map(|t| e.all_reduce(&t.name, vec![1.0; t.len()]))
                            .collect();
                        e.flush();
                        sub += t0.elapsed().as_secs_f64() * 1e3;
                        let t1 = std::time::Instant::now();
                        for h in hs {
                            h.wait().unwrap();
                        }
                        wt += t1.elapsed().as_secs_f64() * 1e3;
                        total += t0.elapsed().as_secs_f64() * 1e3;
                    }
                    let mut sums: HashMap<&'static str, (u64, u64)> = HashMap::new();
                    for sp in e.timeline() {
                        if sp.tensor == "t0500" {
                            let x = sums.entry(sp.phase.as_str()).or_default();
                            x.0 += sp.end_us - sp.start_us;
                            x.1 += 1;
                        }
                    }
                    e.shutdown().unwrap();
                    (total / 10.0, sub / 10.0, wt / 10.0, sums)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (ms, sub, wt, sums)) in out.iter().enumerate() {
        let mut v: Vec<_> = sums
            .iter()
            .map(|(k, (t, n))| (k, *t as f64 / *n as f64))
            .collect();
        v.sort_by(|a, b| a.0.cmp(b.0));
        println!("rank {r}: {ms:.3} ms/rep (submit {sub:.3}, wait {wt:.3}) {v:?}");
    }
}
