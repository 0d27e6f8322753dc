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
