//! Link emulator accuracy, measured by wall clock: a correctness property of an emulator.
//! Sizes keep each run under half a second; tests take a lock so that they never overlap
//! one another (this binary is separate from the unit tests, which cargo runs apart), and a
//! run is retried on a loaded machine because the emulator can only be slow, never fast.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use gradwire_transport::link::{LinkConfig, Throttled};
use gradwire_transport::local::Local;
use gradwire_transport::Transport;

/// One timing test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
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

/// [`measure`] over any pair of connected ranks.
fn measure_world<T: Transport>(world: Vec<T>, spec: &str, total: usize, chunk: usize) -> f64 {
    let cfg: LinkConfig = spec.parse().unwrap();
    let world = Throttled::wrap_all(world, &cfg);
    let start = Instant::now();
    let times: Vec<Duration> = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .map(|mut t| {
                s.spawn(move || {
                    let msg = vec![0u8; chunk];
                    let mut buf = Vec::new();
                    for _ in 0..total / chunk {
                        if t.rank() == 0 {
                            t.send(1, &msg).unwrap();
                        } else {
                            t.recv(0, &mut buf).unwrap();
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

/// The emulator works over any transport: 1 Gbit/s over shared memory and TCP loopback.
#[test]
fn accurate_over_shm_and_tcp() {
    let _g = serial();
    for kind in ["shm", "tcp"] {
        let mut got = Vec::new();
        for _ in 0..3 {
            let r = match kind {
                "shm" => measure_world(
                    gradwire_transport::shm::local_world(2, 1 << 20).unwrap(),
                    "1gbit",
                    32 << 20,
                    1 << 20,
                ),
                _ => measure_world(
                    gradwire_transport::tcp::loopback_world(2).unwrap(),
                    "1gbit",
                    32 << 20,
                    1 << 20,
                ),
            } / 1e9;
            assert!(r < 1.01, "{kind}: faster than the setting: {r}");
            got.push(r);
            if r > 0.95 {
                break;
            }
        }
        eprintln!("1gbit over {kind}: {got:?} of the setting");
        assert!(got.iter().any(|&r| r > 0.95), "{kind}: {got:?}");
    }
}

/// Measured throughput within 5% of the setting (best of several runs on a loaded machine).
///
/// The emulator can only be as fast as the machine under it: when every run misses, the same
/// transfer is timed through plain `Local`, and if the machine cannot move it at three times
/// the setting right now (other jobs on the cores), the 5% check is reported as not made, loudly,
/// instead of failing. The emulator must never be faster than the setting in any case.
fn assert_accurate(spec: &str, bps: f64, total: usize, chunk: usize, duplex: bool) {
    let mut got = Vec::new();
    for _ in 0..4 {
        let r = measure(spec, total, chunk, duplex) / bps;
        got.push(r);
        assert!(
            r < 1.01,
            "{spec}: emulated link faster than set: {r:.4} of the setting"
        );
        if r > 0.95 {
            eprintln!("{spec} duplex={duplex}: {r:.4} of the setting");
            return;
        }
    }
    let raw = measure("1000tbit", total, chunk, duplex);
    if raw < 3.0 * bps {
        eprintln!(
            "!!! {spec}: 5% accuracy NOT CHECKED: measured/setting {got:?}, but this machine moves \
             only {:.2} Gbit/s through plain Local right now (loaded), under three times the setting",
            raw / 1e9
        );
        return;
    }
    panic!(
        "{spec}: measured/setting ratios {got:?}, wanted within 5% (Local alone: {:.2} Gbit/s)",
        raw / 1e9
    );
}

#[test]
fn accurate_at_100mbit() {
    let _g = serial();
    // 5 MB in 64 KiB messages: 0.42 s.
    assert_accurate("100mbit", 1e8, 5 << 20, 64 << 10, false);
}

#[test]
fn accurate_at_1gbit() {
    let _g = serial();
    // 48 MiB in 1 MiB messages: 0.40 s.
    assert_accurate("1gbit", 1e9, 48 << 20, 1 << 20, false);
}

#[test]
fn accurate_at_10gbit() {
    let _g = serial();
    // 480 MiB in 8 MiB messages: 0.40 s.
    assert_accurate("10gbit", 1e10, 480 << 20, 8 << 20, false);
}

#[test]
fn duplex_is_limited_both_ways() {
    let _g = serial();
    // Each direction carries 24 MiB at 1 Gbit/s at the same time: 0.2 s, not 0.4 s, and not
    // faster either.
    assert_accurate("1gbit", 1e9, 24 << 20, 1 << 20, true);
}

#[test]
fn latency_is_paid_once_per_message_and_pipelines() {
    let _g = serial();
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
fn a_slow_rank_is_identified_by_timing() {
    let _g = serial();
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
    // Every exchange of rank 2 is slower than every exchange without it (ideally 10x).
    let slow_min = [0, 1, 3].iter().map(|&p| rows[2][p]).min().unwrap();
    let fast_max = [(0, 1), (0, 3), (1, 3)]
        .iter()
        .map(|&(a, b)| rows[a][b].max(rows[b][a]))
        .max()
        .unwrap();
    assert!(slow_min > fast_max, "{rows:?}");
}
