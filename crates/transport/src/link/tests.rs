//! Link emulator tests: env parsing, and its accuracy measured by wall clock (a correctness
//! property of an emulator; sizes keep each run well under a second, and a run is retried
//! on a loaded machine because the emulator can only ever be slow, never fast).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::*;
use crate::local::Local;

fn env(vars: &[(&str, &str)], n: usize) -> Result<Option<LinkConfig>> {
    let m: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    config_from(|k| m.get(k).cloned(), n)
}

#[test]
fn reads_env() {
    assert!(env(&[], 4).unwrap().is_none());
    let c = env(
        &[
            ("GRADWIRE_LINK", "1gbit,50us,jitter=10us"),
            ("GRADWIRE_LINK_RANK_3", "100mbit"),
        ],
        4,
    )
    .unwrap()
    .unwrap();
    assert_eq!(c.link(0, 1).bandwidth.bits_per_sec(), 1_000_000_000);
    assert_eq!(c.link(2, 3).bandwidth.bits_per_sec(), 100_000_000);
    assert_eq!(c.interface(3).latency, Duration::from_micros(50));
    // An env override goes over one inside GRADWIRE_LINK.
    let c = env(
        &[
            ("GRADWIRE_LINK", "1gbit;rank1=10mbit"),
            ("GRADWIRE_LINK_RANK_1", "5ms"),
        ],
        2,
    )
    .unwrap()
    .unwrap();
    assert_eq!(c.interface(1).bandwidth.bits_per_sec(), 10_000_000);
    assert_eq!(c.interface(1).latency, Duration::from_millis(5));
}

#[test]
fn env_errors_name_the_variable() {
    let e = env(&[("GRADWIRE_LINK", "1gbit,fast")], 2).unwrap_err();
    assert!(e.to_string().contains("GRADWIRE_LINK=1gbit,fast"), "{e}");
    let e = env(&[("GRADWIRE_LINK_RANK_1", "1mbit")], 2).unwrap_err();
    assert!(e.to_string().contains("GRADWIRE_LINK is not"), "{e}");
    let e = env(
        &[("GRADWIRE_LINK", "1gbit"), ("GRADWIRE_LINK_RANK_0", "x")],
        2,
    )
    .unwrap_err();
    assert!(e.to_string().contains("GRADWIRE_LINK_RANK_0"), "{e}");
    let e = env(&[("GRADWIRE_LINK", "1gbit;rank5=1mbit")], 2).unwrap_err();
    assert!(e.to_string().contains("rank 5"), "{e}");
}

/// Streams `total` bytes in `chunk`-byte messages from rank 0 to rank 1 (or both ways at
/// once with `duplex`); returns the receiver's throughput in bits per second.
fn measure(spec: &str, total: usize, chunk: usize, duplex: bool) -> f64 {
    let cfg: LinkConfig = spec.parse().unwrap();
    let world = Throttled::wrap_all(Local::world(2), &cfg);
    let start = Instant::now();
    let times: Vec<Duration> = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .map(|mut t| {
                s.spawn(move || {
                    let me = t.rank();
                    let msg = vec![me as u8; chunk];
                    let mut buf = Vec::new();
                    for _ in 0..total / chunk {
                        if duplex {
                            t.send_recv(1 - me, &msg, 1 - me, &mut buf).unwrap();
                            assert_eq!(buf.len(), chunk);
                        } else if me == 0 {
                            t.send(1, &msg).unwrap();
                        } else {
                            t.recv(0, &mut buf).unwrap();
                            assert_eq!(buf.len(), chunk);
                        }
                    }
                    start.elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (total / chunk * chunk) as f64 * 8.0 / times[1].as_secs_f64()
}

/// Measured throughput within 5% of the setting (best of three runs on a loaded machine).
fn assert_accurate(spec: &str, bps: f64, total: usize, chunk: usize, duplex: bool) {
    let mut got = Vec::new();
    for _ in 0..3 {
        let r = measure(spec, total, chunk, duplex) / bps;
        got.push(r);
        assert!(
            r < 1.01,
            "{spec}: emulated link faster than set: {r:.4} of the setting"
        );
        if r > 0.95 {
            eprintln!("{spec} duplex={duplex}: {:.4} of the setting", r);
            return;
        }
    }
    panic!("{spec}: measured/setting ratios {got:?}, wanted within 5%");
}

#[test]
fn accurate_at_100mbit() {
    // 5 MB in 64 KiB messages: 0.42 s.
    assert_accurate("100mbit", 1e8, 5 << 20, 64 << 10, false);
}

#[test]
fn accurate_at_1gbit() {
    // 48 MiB in 1 MiB messages: 0.40 s.
    assert_accurate("1gbit", 1e9, 48 << 20, 1 << 20, false);
}

#[test]
fn accurate_at_10gbit() {
    // 480 MiB in 4 MiB messages: 0.40 s.
    assert_accurate("10gbit", 1e10, 480 << 20, 4 << 20, false);
}

#[test]
fn duplex_is_limited_both_ways() {
    // Each direction carries 24 MiB at 1 Gbit/s at the same time: 0.2 s, not 0.4 s, and not
    // faster either.
    assert_accurate("1gbit", 1e9, 24 << 20, 1 << 20, true);
}

#[test]
fn latency_is_paid_once_per_message_and_pipelines() {
    let cfg: LinkConfig = "1gbit,20ms".parse().unwrap();
    let mut w = Throttled::wrap_all(Local::world(2), &cfg);
    let mut b = w.pop().unwrap();
    let mut a = w.pop().unwrap();
    let start = Instant::now();
    // Ping-pong of small messages: one RTT is two latencies.
    let h = std::thread::spawn(move || {
        let mut buf = Vec::new();
        b.recv(0, &mut buf).unwrap();
        b.send(0, &buf).unwrap();
        // Then a stream of 10 messages: pipelined, so about one latency in all.
        for _ in 0..10 {
            b.recv(0, &mut buf).unwrap();
        }
        b
    });
    let mut buf = Vec::new();
    a.send(1, b"ping").unwrap();
    a.recv(1, &mut buf).unwrap();
    let rtt = start.elapsed();
    let t = Instant::now();
    for _ in 0..10 {
        a.send(1, &[0; 100]).unwrap();
    }
    let sent = t.elapsed();
    let b = h.join().unwrap();
    let stream = t.elapsed();
    assert!(
        rtt >= Duration::from_millis(40) && rtt < Duration::from_millis(60),
        "{rtt:?}"
    );
    assert!(
        sent < Duration::from_millis(15),
        "senders do not wait for latency: {sent:?}"
    );
    assert!(
        stream >= Duration::from_millis(20) && stream < Duration::from_millis(45),
        "{stream:?}"
    );
    assert!(b.stats().recv_wait >= Duration::from_millis(30));
    assert_eq!(a.bytes_sent(), 4 + 1000);
}

#[test]
fn jitter_is_seeded_and_bounded() {
    let cfg: LinkConfig = "10gbit,5ms,jitter=4ms,seed=1".parse().unwrap();
    let arrivals = |cfg: &LinkConfig| {
        let mut t = Throttled::new(Local::world(2).remove(0), cfg);
        (0..50)
            .map(|_| {
                let (end, arr) = t.book(1, 0);
                arr as i64 - end as i64
            })
            .collect::<Vec<_>>()
    };
    let a = arrivals(&cfg);
    // Within latency ± jitter; arrivals never reorder (the max with the previous arrival).
    assert!(
        a.iter().all(|&d| (1_000_000..=9_000_000).contains(&d)),
        "{a:?}"
    );
    assert!(a.iter().any(|&d| d != a[0]));
    // The same seed gives the same draws (to within the clock ticks between calls).
    let b = arrivals(&cfg);
    let close = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| (**x - **y).abs() < 500_000)
        .count();
    assert!(close > 40, "{a:?} vs {b:?}");
    let mut cfg2 = cfg.clone();
    cfg2.seed = 2;
    assert_ne!(a, arrivals(&cfg2));
}

#[test]
fn a_slow_rank_is_identified_by_timing() {
    // Four ranks at 1 Gbit/s, rank 2 at 100 Mbit/s. Every pair exchanges 256 KiB (a round
    // robin of duplex steps); each rank records the time of each exchange. The slow rank is
    // the one whose every exchange is slow.
    let n = 4;
    let cfg: LinkConfig = "1gbit,20us;rank2=100mbit".parse().unwrap();
    let world = Throttled::wrap_all(Local::world(n), &cfg);
    let rows: Vec<Vec<Duration>> = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .map(|mut t| {
                s.spawn(move || {
                    let me = t.rank();
                    let msg = vec![0u8; 256 << 10];
                    let mut buf = Vec::new();
                    let mut row = vec![Duration::ZERO; n];
                    // Round r pairs rank i with rank i XOR r.
                    for r in 1..n {
                        let peer = me ^ r;
                        // Meet the peer first, so waiting for it is not counted.
                        t.send_recv(peer, &[], peer, &mut buf).unwrap();
                        let t0 = Instant::now();
                        t.send_recv(peer, &msg, peer, &mut buf).unwrap();
                        row[peer] = t0.elapsed();
                    }
                    row
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total = |r: usize| rows[r].iter().sum::<Duration>();
    let slowest = (0..n).max_by_key(|&r| total(r)).unwrap();
    assert_eq!(slowest, 2, "per-rank exchange times {rows:?}");
    // And its every exchange took about 10x a fast one.
    let fast = rows[0][1];
    for p in [0, 1, 3] {
        assert!(rows[2][p] > fast * 4, "{rows:?}");
    }
}
