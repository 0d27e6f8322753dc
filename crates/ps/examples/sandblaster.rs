//! Sandblaster L-BFGS with a straggler: how much do backup copies save?
//!
//! `cargo run --release -p gradwire-ps --example sandblaster`
//!
//! Logistic regression (20,000 examples, 64 features), 4 workers, 2 shards, in 200 units of
//! 100 examples and then 40 units of 500. Every 100 examples cost 2 ms of emulated compute
//! (a sleep) on a normal worker and 10 ms on worker 0 (5× slower). Three runs per unit
//! size: no straggler; straggler without backups; straggler with backups. Each run does the
//! same 10 L-BFGS iterations. Every run must lower the loss, and count its backups
//! consistently (none without backups; no more won than issued; every unit of every pass
//! run at least once); the times are shown, not checked.

use std::sync::Arc;
use std::time::Duration;

use gradwire_ps::sandblaster::{run, LogisticRegression, SandblasterConfig};
use gradwire_ps::{Key, Server, ServerConfig, ShardConfig};

fn main() {
    let servers: Vec<Server> = (0..2)
        .map(|i| {
            Server::start(ServerConfig::loopback(ShardConfig {
                shard_id: i,
                num_workers: 5,
                ..ShardConfig::default()
            }))
            .unwrap()
        })
        .collect();
    let addrs: Vec<_> = servers.iter().map(|s| s.local_addr()).collect();
    for unit_size in [100, 500] {
        compare(&addrs, unit_size);
    }
}

fn compare(addrs: &[std::net::SocketAddr], unit_size: usize) {
    let obj = Arc::new(LogisticRegression::synthetic(
        20_000, 64, unit_size, 1e-4, 11,
    ));
    let w0 = vec![0.0f32; 64];
    let unit = Duration::from_micros(20 * unit_size as u64);
    let mut base = None;
    println!("{} units of {unit_size} examples:", 20_000 / unit_size);
    for (k, (name, slow, backups)) in [
        ("no straggler", false, false),
        ("worker 0 5x slower, no backups", true, false),
        ("worker 0 5x slower, backups", true, true),
    ]
    .into_iter()
    .enumerate()
    {
        let mut delays = vec![unit; 4];
        if slow {
            delays[0] = unit * 5;
        }
        let cfg = SandblasterConfig {
            iterations: 10,
            backups,
            unit_delay: delays,
            chunk_elems: 32,
            key: Key(10 * unit_size as u64 + k as u64),
            ..SandblasterConfig::default()
        };
        let r = run(addrs.to_vec(), obj.clone(), &w0, 4, &cfg).unwrap();
        let (first, last) = (r.losses[0], *r.losses.last().unwrap());
        assert!(
            r.losses.iter().all(|l| l.is_finite()) && last < first,
            "{name}: loss {first} -> {last}"
        );
        assert!(r.backups_won <= r.backups_issued, "{name}: {r:?}");
        if !backups {
            assert_eq!(r.backups_issued, 0, "{name}");
        }
        assert!(
            r.units_run >= r.passes * (20_000 / unit_size),
            "{name}: {} units run in {} passes",
            r.units_run,
            r.passes
        );
        let secs = r.elapsed.as_secs_f64();
        let b = *base.get_or_insert(secs);
        println!(
            "  {name}: {secs:.2} s ({:+.1}% vs no straggler), {} passes, loss {:.4} -> {:.4}, units run {}, backups issued {}, won {}",
            100.0 * (secs / b - 1.0),
            r.passes,
            r.losses[0],
            r.losses.last().unwrap(),
            r.units_run,
            r.backups_issued,
            r.backups_won
        );
    }
}
