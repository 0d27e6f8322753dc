//! Link emulator unit tests: env parsing, jitter draws and the deadline, on simulated time.
//! The schedule's rate and latency are in `schedule_tests.rs`; `tests/link.rs` checks the
//! emulator over real transports and the host's clock, coarsely.

use std::collections::HashMap;
use std::time::Duration;

use super::fake_clock::FakeClock;
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
        let mut t = Throttled::with_clock(Local::world(2).remove(0), cfg, FakeClock::new());
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
    // The same seed gives the same draws.
    assert_eq!(a, arrivals(&cfg));
    let mut cfg2 = cfg.clone();
    cfg2.seed = 2;
    assert_ne!(a, arrivals(&cfg2));
}

/// Each rank of a world on its own simulated clock, every deadline `deadline`.
fn world_on_fake_clocks(
    n: usize,
    spec: &str,
    deadline: Duration,
) -> Vec<Throttled<Local, FakeClock>> {
    let cfg: LinkConfig = spec.parse().unwrap();
    Local::world(n)
        .into_iter()
        .map(|t| {
            let mut t = Throttled::with_clock(t, &cfg, FakeClock::new());
            t.set_timeout(deadline);
            t
        })
        .collect()
}

/// The emulator's own waits end at the inner transport's deadline with a timeout naming the
/// peer: 100 kB at 1 Mbit/s is 0.8 s on the wire, the deadline 150 ms.
#[test]
fn waits_longer_than_the_deadline_time_out_naming_the_peer() {
    let deadline = Duration::from_millis(150);
    let mut world = world_on_fake_clocks(3, "1mbit,1ms", deadline);
    let mut c = world.pop().unwrap();
    let mut b = world.pop().unwrap();
    let mut a = world.pop().unwrap();
    let msg = vec![7u8; 100_000];
    // A wait that times out lasts the deadline exactly.
    let within = |clock: &FakeClock, start: u64| {
        assert_eq!(clock.now_ns() - start, deadline.as_nanos() as u64);
    };

    // Sender: its slot ends past the deadline.
    let start = a.clock().now_ns();
    match a.send(2, &msg) {
        Err(Error::Timeout {
            peer: 2,
            op: Op::Send,
            after,
        }) => assert_eq!(after, deadline),
        other => panic!("expected a send timeout naming rank 2, got {other:?}"),
    }
    within(a.clock(), start);
    // Receiver: the message is there, its arrival past the deadline.
    let start = c.clock().now_ns();
    let mut buf = Vec::new();
    match c.recv(0, &mut buf) {
        Err(Error::Timeout {
            peer: 0,
            op: Op::Recv,
            ..
        }) => {}
        other => panic!("expected a receive timeout naming rank 0, got {other:?}"),
    }
    within(c.clock(), start);

    // A duplex step both ways between ranks 1 and 2 (threads): each names the other.
    let h = std::thread::spawn(move || {
        let mut out = vec![0u8; 100_000];
        let r = c.send_recv_into(1, &[1u8; 100_000], 1, &mut out);
        (r, c)
    });
    let start = b.clock().now_ns();
    let mut out = vec![0u8; 100_000];
    match b.send_recv_into(2, &msg, 2, &mut out) {
        Err(Error::Timeout { peer: 2, .. }) => {}
        other => panic!("expected a timeout naming rank 2, got {other:?}"),
    }
    within(b.clock(), start);
    match h.join().unwrap().0 {
        Err(Error::Timeout { peer: 1, .. }) => {}
        other => panic!("expected a timeout naming rank 1, got {other:?}"),
    }

    // Waits under the deadline still work: 10 kB is 80 ms.
    let mut world = world_on_fake_clocks(2, "1mbit", deadline);
    let mut y = world.pop().unwrap();
    let mut x = world.pop().unwrap();
    x.send(1, &[3u8; 10_000]).unwrap();
    y.recv(0, &mut buf).unwrap();
    assert_eq!(buf, vec![3u8; 10_000]);
    assert_eq!(x.clock().elapsed(), 80_000_000);
    assert_eq!(y.clock().elapsed(), 80_000_000);
}
