//! Link emulator unit tests: env parsing and jitter draws. Timing (accuracy at 100 Mbit/s,
//! 1 and 10 Gbit/s, latency, a slow rank) is in `tests/link.rs`, its own test binary, so it
//! does not share the cores with this crate's other tests.

use std::collections::HashMap;
use std::time::Duration;

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

/// The emulator's own waits end at the inner transport's deadline with a timeout naming the
/// peer: 100 kB at 1 Mbit/s is 0.8 s on the wire, the deadline 150 ms.
#[test]
fn waits_longer_than_the_deadline_time_out_naming_the_peer() {
    let deadline = Duration::from_millis(150);
    let cfg: LinkConfig = "1mbit,1ms".parse().unwrap();
    let mut world = Throttled::wrap_all(Local::world(3), &cfg);
    for t in &mut world {
        t.set_timeout(deadline);
    }
    let mut c = world.pop().unwrap();
    let mut b = world.pop().unwrap();
    let mut a = world.pop().unwrap();
    let msg = vec![7u8; 100_000];
    let within = |start: std::time::Instant| {
        let e = start.elapsed();
        assert!(
            e >= deadline && e < Duration::from_millis(600),
            "returned after {e:?}"
        );
    };

    // Sender: its slot ends past the deadline.
    let start = std::time::Instant::now();
    match a.send(2, &msg) {
        Err(Error::Timeout {
            peer: 2,
            op: Op::Send,
            after,
        }) => assert_eq!(after, deadline),
        other => panic!("expected a send timeout naming rank 2, got {other:?}"),
    }
    within(start);
    // Receiver: the message is there, its arrival past the deadline.
    let start = std::time::Instant::now();
    let mut buf = Vec::new();
    match c.recv(0, &mut buf) {
        Err(Error::Timeout {
            peer: 0,
            op: Op::Recv,
            ..
        }) => {}
        other => panic!("expected a receive timeout naming rank 0, got {other:?}"),
    }
    within(start);

    // A duplex step both ways between ranks 1 and 2 (threads): each names the other.
    let h = std::thread::spawn(move || {
        let mut out = vec![0u8; 100_000];
        let r = c.send_recv_into(1, &[1u8; 100_000], 1, &mut out);
        (r, c)
    });
    let start = std::time::Instant::now();
    let mut out = vec![0u8; 100_000];
    match b.send_recv_into(2, &msg, 2, &mut out) {
        Err(Error::Timeout { peer: 2, .. }) => {}
        other => panic!("expected a timeout naming rank 2, got {other:?}"),
    }
    within(start);
    match h.join().unwrap().0 {
        Err(Error::Timeout { peer: 1, .. }) => {}
        other => panic!("expected a timeout naming rank 1, got {other:?}"),
    }

    // Waits under the deadline still work: 10 kB is 80 ms.
    let cfg: LinkConfig = "1mbit".parse().unwrap();
    let mut world = Throttled::wrap_all(Local::world(2), &cfg);
    for t in &mut world {
        t.set_timeout(deadline);
    }
    let mut y = world.pop().unwrap();
    let mut x = world.pop().unwrap();
    x.send(1, &[3u8; 10_000]).unwrap();
    y.recv(0, &mut buf).unwrap();
    assert_eq!(buf, vec![3u8; 10_000]);
}
