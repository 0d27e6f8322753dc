//! The link emulator over real transports and the host's clock: a coarse end-to-end check.
//! The emulator's schedule (each setting's rate and latency to the nanosecond, duplex links,
//! pipelining, late wakeups, a slow rank) is checked on simulated time by the unit tests in
//! `src/link/schedule_tests.rs`; this binary only checks that the real clock drives it.
//!
//! The bounds, and why they hold on any machine:
//! * **never faster than the setting (1%)**: every slot starts where the previous one ended
//!   on the host's monotonic clock, so no load can make bytes leave early; a clock that did
//!   not advance or waits that returned early would break it at once;
//! * **at least a tenth of the setting**: 32 MiB at 1 Gbit/s is 0.27 s of slots, and a
//!   tenth leaves 2.4 s for the copies through the transport and a loaded machine's
//!   scheduling, while a wait in the wrong unit (µs for ns) misses it by orders of magnitude.
//!   Accuracy itself (5%) is not timed here: the schedule's arithmetic is the unit tests'.

use std::time::Instant;

use gradwire_transport::link::{LinkConfig, Throttled};
use gradwire_transport::Transport;

/// Streams `total` bytes in `chunk`-byte messages from rank 0 to rank 1 at `spec`; returns
/// the receiver's throughput in bits per second, measured from before the first send.
fn measure<T: Transport>(world: Vec<T>, spec: &str, total: usize, chunk: usize) -> f64 {
    let cfg: LinkConfig = spec.parse().unwrap();
    let world = Throttled::wrap_all(world, &cfg);
    let start = Instant::now();
    let done = std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .map(|mut t| {
                s.spawn(move || {
                    let msg = vec![0x5au8; chunk];
                    let mut buf = Vec::new();
                    for _ in 0..total / chunk {
                        if t.rank() == 0 {
                            t.send(1, &msg).unwrap();
                        } else {
                            t.recv(0, &mut buf).unwrap();
                            assert_eq!(buf, msg);
                        }
                    }
                    start.elapsed()
                })
            })
            .collect();
        let times: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        times[1]
    });
    (total / chunk * chunk) as f64 * 8.0 / done.as_secs_f64()
}

/// 1 Gbit/s over in-process channels, shared memory and TCP loopback: never faster than the
/// setting, and not grossly slower (the module doc gives the bounds).
#[test]
fn the_host_clock_paces_every_transport() {
    let (spec, bps, total, chunk) = ("1gbit", 1e9, 32 << 20, 1 << 20);
    for kind in ["local", "shm", "tcp"] {
        let r = match kind {
            "local" => measure(
                gradwire_transport::local::Local::world(2),
                spec,
                total,
                chunk,
            ),
            "shm" => measure(
                gradwire_transport::shm::local_world(2, 1 << 20).unwrap(),
                spec,
                total,
                chunk,
            ),
            _ => measure(
                gradwire_transport::tcp::loopback_world(2).unwrap(),
                spec,
                total,
                chunk,
            ),
        } / bps;
        eprintln!("{spec} over {kind}: {r:.4} of the setting");
        assert!(r < 1.01, "{kind}: faster than the setting: {r:.4}");
        assert!(r > 0.1, "{kind}: under a tenth of the setting: {r:.4}");
    }
}
