//! The emulator's schedule on simulated time ([`FakeClock`]): the rate and latency of each
//! setting, duplex links, latency pipelining, lateness credited without accumulating, a slow
//! rank. Every expected time is the setting's own arithmetic (bytes × 8 / bit rate, plus the
//! latency), written out here rather than taken from [`LinkSpec::wire_ns`]; the emulator
//! rounds each message's slot down to whole nanoseconds, so a schedule may run ahead of it by
//! under one nanosecond per message and never behind.

use std::time::Duration;

use super::fake_clock::FakeClock;
use super::*;
use crate::local::Local;

/// Rank 0 and rank 1 of a 2-rank world, each on its own simulated clock.
fn pair(
    spec: &str,
    a: FakeClock,
    b: FakeClock,
) -> (Throttled<Local, FakeClock>, Throttled<Local, FakeClock>) {
    let cfg: LinkConfig = spec.parse().unwrap();
    let mut w = Local::world(2);
    let y = Throttled::with_clock(w.pop().unwrap(), &cfg, b);
    let x = Throttled::with_clock(w.pop().unwrap(), &cfg, a);
    (x, y)
}

/// Nanoseconds on the wire for `bytes` at `bps` bits per second (unrounded).
fn wire(bytes: usize, bps: f64) -> f64 {
    bytes as f64 * 8.0 * 1e9 / bps
}

/// `got` is `want` rounded down by under one nanosecond per message, `n` messages in all.
fn assert_schedule(got: u64, want: f64, n: usize, what: &str) {
    let early = want - got as f64;
    assert!(
        (0.0..=n as f64).contains(&early),
        "{what}: {got} ns, the setting gives {want} ns"
    );
}

/// Each setting of the accuracy suite streams 16 messages from rank 0 to rank 1: every
/// message arrives one slot after the previous one plus the latency, so the receiver measures
/// the set bit rate and the set latency, within the emulator's 5% (in fact to the nanosecond).
#[test]
fn each_setting_streams_at_its_rate_and_latency() {
    let n = 16;
    for (spec, bps, lat, chunk) in [
        ("100mbit", 1e8, 0.0, 64 << 10),
        ("1gbit", 1e9, 0.0, 1 << 20),
        ("10gbit", 1e10, 0.0, 8 << 20),
        ("100mbit,1ms", 1e8, 1e6, 64 << 10),
        ("1gbit,20ms", 1e9, 2e7, 1 << 20),
        ("1gbit,20us;rank1=100mbit", 1e8, 2e4, 256 << 10),
    ] {
        let (mut a, mut b) = pair(spec, FakeClock::new(), FakeClock::new());
        let msg = vec![7u8; chunk];
        let mut buf = Vec::new();
        let mut arrivals = Vec::new();
        for _ in 0..n {
            a.send(1, &msg).unwrap();
            b.recv(0, &mut buf).unwrap();
            assert_eq!(buf, msg);
            arrivals.push(b.clock().elapsed());
        }
        for (k, &t) in arrivals.iter().enumerate() {
            let want = (k + 1) as f64 * wire(chunk, bps) + lat;
            assert_schedule(t, want, k + 1, &format!("{spec}: arrival of message {k}"));
        }
        // The sender is released at the end of each slot, not after the latency.
        assert_schedule(a.clock().elapsed(), n as f64 * wire(chunk, bps), n, spec);
        // What a receiver measures: the rate over the stream, the latency of its first message.
        let last = *arrivals.last().unwrap() as f64;
        let rate = (n * chunk) as f64 * 8.0 / ((last - lat) / 1e9);
        let latency = arrivals[0] as f64 - wire(chunk, bps);
        assert!(
            (0.95..=1.0 + 1e-6).contains(&(rate / bps)),
            "{spec}: {rate} bit/s"
        );
        assert!(
            (latency - lat).abs() <= 0.05 * lat + 1.0,
            "{spec}: latency {latency} ns"
        );
        assert_eq!(a.bytes_sent(), (n * chunk) as u64);
        assert_eq!(b.stats().messages, 0, "the receiver sent nothing");
        assert_eq!(a.stats().messages, n as u64);
    }
}

/// A duplex link carries both directions at the full rate at once: 8 exchanges of 1 MiB at
/// 1 Gbit/s take 8 slots on each side, not 16.
#[test]
fn duplex_is_limited_both_ways() {
    let (n, chunk) = (8, 1 << 20);
    let (a, b) = pair("1gbit", FakeClock::new(), FakeClock::new());
    let ends: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = [a, b]
            .into_iter()
            .map(|mut t| {
                s.spawn(move || {
                    let me = t.rank();
                    let msg = vec![me as u8; chunk];
                    let mut buf = Vec::new();
                    for _ in 0..n {
                        t.send_recv(1 - me, &msg, 1 - me, &mut buf).unwrap();
                        assert_eq!(buf, vec![(1 - me) as u8; chunk]);
                    }
                    t.clock().elapsed()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for end in ends {
        assert_schedule(end, n as f64 * wire(chunk, 1e9), n, "duplex");
    }
}

/// Latency is paid once per message: a ping-pong costs two latencies, while ten messages
/// streamed back to back arrive one latency after their slots, and their sender does not wait
/// for it. One clock shared by both ranks (a host), the calls in causal order.
#[test]
fn latency_is_paid_once_per_message_and_pipelines() {
    let clock = FakeClock::new();
    let (mut a, mut b) = pair("1gbit,20ms", clock.clone(), clock.clone());
    let mut buf = Vec::new();
    a.send(1, b"ping").unwrap();
    b.recv(0, &mut buf).unwrap();
    b.send(0, &buf).unwrap();
    a.recv(1, &mut buf).unwrap();
    // Two latencies and two 4-byte slots (32 ns each at 1 Gbit/s).
    assert_eq!(clock.elapsed(), 2 * 20_000_000 + 2 * 32);
    let t = clock.elapsed();
    for _ in 0..10 {
        a.send(1, &[0; 100]).unwrap();
    }
    // Ten 100-byte slots of 800 ns: the sender never waits for the latency.
    assert_eq!(clock.elapsed() - t, 10 * 800);
    for _ in 0..10 {
        b.recv(0, &mut buf).unwrap();
    }
    // The last message arrives at the end of its slot plus one latency.
    assert_eq!(clock.elapsed() - t, 10 * 800 + 20_000_000);
    // Rank 1 waited 20 ms for the ping and 20 ms for the stream (the stream began when
    // it started receiving, 8 µs after the first slot).
    assert_eq!(b.stats().recv_wait, Duration::from_millis(40));
    assert_eq!(a.bytes_sent(), 4 + 1000);
}

/// Lateness of the sender's wakeups (a descheduled thread on a loaded machine) is credited to
/// its next message: the slots stay back to back, so the stream keeps the exact rate whether
/// each wakeup is 2 ms late (under a 5.24 ms slot) or 8 ms (over one), and is never faster.
#[test]
fn late_wakeups_are_credited_and_never_accumulate() {
    let (n, chunk, bps) = (16, 64 << 10, 1e8);
    for late in [2_000_000, 8_000_000] {
        let sender = FakeClock::oversleeping(late);
        let (mut a, mut b) = pair("100mbit", sender, FakeClock::new());
        let msg = vec![1u8; chunk];
        let mut buf = Vec::new();
        for _ in 0..n {
            a.send(1, &msg).unwrap();
            b.recv(0, &mut buf).unwrap();
        }
        let slots = n as f64 * wire(chunk, bps);
        // The receiver's clock is exact: its last message ends the 16th back-to-back slot.
        assert_schedule(b.clock().elapsed(), slots, n, &format!("late by {late}"));
        // The sender's lateness shows at most once: it returns no earlier than its last slot's
        // end and no later than one late wakeup after it (a wakeup later than a slot finds
        // the next slots already due, and sends them without sleeping).
        let done = a.clock().elapsed() as f64;
        assert!(
            (slots - n as f64..=slots + late as f64).contains(&done),
            "sender late by {late}: done at {done} ns, {slots} ns of slots"
        );
    }
}

/// Four ranks at 1 Gbit/s and 20 µs, rank 2 at 100 Mbit/s: every pair exchanges 256 KiB (a
/// round robin of duplex steps), each rank on its own clock. Every exchange of rank 2 takes at
/// least its 100 Mbit/s slot; every other one at most a 1 Gbit/s slot plus the latency.
#[test]
fn a_slow_rank_is_identified_by_timing() {
    let (n, chunk) = (4, 256 << 10);
    let cfg: LinkConfig = "1gbit,20us;rank2=100mbit".parse().unwrap();
    let world: Vec<_> = Local::world(n)
        .into_iter()
        .map(|t| Throttled::with_clock(t, &cfg, FakeClock::new()))
        .collect();
    let rows: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .map(|mut t| {
                s.spawn(move || {
                    let me = t.rank();
                    let msg = vec![0u8; chunk];
                    let mut buf = Vec::new();
                    let mut row = vec![0; n];
                    // Round r pairs rank i with rank i XOR r.
                    for r in 1..n {
                        let peer = me ^ r;
                        t.send_recv(peer, &[], peer, &mut buf).unwrap();
                        let t0 = t.clock().now_ns();
                        t.send_recv(peer, &msg, peer, &mut buf).unwrap();
                        row[peer] = t.clock().now_ns() - t0;
                    }
                    row
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (slow, fast) = (wire(chunk, 1e8), wire(chunk, 1e9) + 20_000.0);
    for (me, row) in rows.iter().enumerate() {
        for (peer, &d) in row.iter().enumerate().filter(|&(p, _)| p != me) {
            if me == 2 || peer == 2 {
                assert!(d as f64 >= slow - 1.0, "{me} with {peer}: {d} ns, {rows:?}");
            } else {
                assert!(d as f64 <= fast, "{me} with {peer}: {d} ns, {rows:?}");
            }
        }
    }
    let total = |r: usize| rows[r].iter().sum::<u64>();
    assert_eq!((0..n).max_by_key(|&r| total(r)), Some(2), "{rows:?}");
}
