//! Shared-memory transport tests: in-process worlds (threads), and real child processes
//! (this test binary spawned again in a child role) for a rank that is killed.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::header::HeaderError;
use super::ring::Ring;
use super::setup::should_populate;
use super::*;

fn world(n: usize, ring: u64) -> Vec<Shm> {
    local_world(n, ring).expect("shm world")
}

fn files_of(job_hex: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(job_hex))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn ring_exchange_order_and_sizes() {
    let n = 3;
    let sizes = [0usize, 1, 7, 4096, 5000, 100_000];
    let hs: Vec<_> = world(n, 4096)
        .into_iter()
        .map(|mut t| {
            std::thread::spawn(move || {
                let me = t.rank();
                let (right, left) = ((me + 1) % n, (me + n - 1) % n);
                let mut buf = Vec::new();
                for (i, &len) in sizes.iter().enumerate() {
                    let msg: Vec<u8> = (0..len).map(|k| (k * 31 + me + i) as u8).collect();
                    t.send_recv(right, &msg, left, &mut buf).unwrap();
                    let want: Vec<u8> = (0..len).map(|k| (k * 31 + left + i) as u8).collect();
                    assert_eq!(buf, want, "rank {me} step {i}");
                }
                // Plain sends queue in the ring; the peer reads them in order.
                if me == 0 {
                    for i in 0..5u8 {
                        t.send(1, &[i; 10]).unwrap();
                    }
                } else if me == 1 {
                    for i in 0..5u8 {
                        t.recv(0, &mut buf).unwrap();
                        assert_eq!(buf, [i; 10]);
                    }
                }
                // Messages to oneself.
                t.send(me, b"self").unwrap();
                let mut out = [0u8; 4];
                t.recv_into(me, &mut out).unwrap();
                assert_eq!(&out, b"self");
                t.bytes_sent()
            })
        })
        .collect();
    for h in hs {
        assert!(h.join().unwrap() > 100_000);
    }
}

/// The rings are faulted in at setup (`MAP_POPULATE`) when the file system has room: no
/// page of a ring is first touched while a message is timed.
#[test]
fn rings_are_resident_before_the_first_message() {
    let ranks = world(3, 256 << 10);
    for t in &ranks {
        for ring in t.tx.iter().chain(&t.rx).flatten() {
            let (resident, pages) = ring.resident_pages();
            // 256 KiB of data and the header page.
            assert_eq!(pages, 65, "rank {}", t.rank());
            assert_eq!(resident, pages, "rank {}: pages not faulted in", t.rank());
        }
    }
    // Too big for the room left: not faulted in (only the touched header page is resident).
    let mut cfg = ShmConfig::new(0, 4, "x");
    cfg.ring_bytes = 1 << 20;
    assert!(should_populate(&cfg, Some(25 << 20))); // 12 rings of 1 MiB + 4 KiB
    assert!(!should_populate(&cfg, Some(24 << 20)));
    assert!(!should_populate(&cfg, None));
    cfg.world_size = 1 << 24; // the product saturates instead of wrapping
    assert!(!should_populate(&cfg, Some(u64::MAX)));
}

#[test]
fn large_duplex_through_small_rings_does_not_deadlock() {
    // 8 MiB each way through 4 KiB rings, both ranks sending at once.
    let len = 8 << 20;
    let hs: Vec<_> = world(2, 4096)
        .into_iter()
        .map(|mut t| {
            std::thread::spawn(move || {
                let me = t.rank();
                let msg = vec![me as u8 + 1; len];
                let mut out = vec![0u8; len];
                t.send_recv_into(1 - me, &msg, 1 - me, &mut out).unwrap();
                assert!(out.iter().all(|&b| b == 2 - me as u8));
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// A rank asleep on a ring (futex, a 60 s nap) is woken by its peer's publish: for data
/// (consumer) and for room (producer). A lost wake-up would sleep the full minute.
#[test]
fn sleeping_ranks_are_woken_by_the_peer() {
    let mut w = world(2, 4096);
    let mut b = w.pop().unwrap();
    let mut a = w.pop().unwrap();
    let nap = Duration::from_secs(60);
    // Consumer: b sleeps on its empty ring from a until a sends.
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        b.rx[0].as_ref().unwrap().sleep(nap);
        let mut got = [0u8; 3];
        b.recv_into(0, &mut got).unwrap();
        tx.send(got).unwrap();
        b
    });
    std::thread::sleep(Duration::from_millis(50));
    a.send(1, b"abc").unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), *b"abc");
    let mut b = h.join().unwrap();
    // Producer: a fills the 4 KiB ring (8-byte length + 4088 bytes) and sleeps for room.
    let big = vec![7u8; 4088];
    a.send(1, &big).unwrap();
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        a.tx[1].as_ref().unwrap().sleep(nap);
        a.send(1, b"after").unwrap();
        tx.send(()).unwrap();
    });
    std::thread::sleep(Duration::from_millis(50));
    let mut got = Vec::new();
    b.recv(0, &mut got).unwrap();
    assert_eq!(got, big);
    rx.recv_timeout(Duration::from_secs(30)).unwrap();
    b.recv(0, &mut got).unwrap();
    assert_eq!(got, b"after");
    h.join().unwrap();
}

/// Every wait policy (sleeping at once included) moves the same bytes: large messages
/// through small rings both ways, and small ones.
#[test]
fn every_wait_policy_delivers() {
    let policies = [
        WaitPolicy {
            spin: Duration::ZERO,
            yield_for: Duration::ZERO,
        },
        WaitPolicy {
            spin: Duration::from_micros(20),
            yield_for: Duration::ZERO,
        },
        WaitPolicy::new(),
    ];
    for policy in policies {
        let hs: Vec<_> = world(3, 4096)
            .into_iter()
            .map(|mut t| {
                t.wait = policy;
                std::thread::spawn(move || {
                    let me = t.rank();
                    let (right, left) = ((me + 1) % 3, (me + 2) % 3);
                    for (i, len) in [0usize, 5, 4089, 100_000, 1 << 20].into_iter().enumerate() {
                        let msg: Vec<u8> = (0..len).map(|k| (k * 7 + me + i) as u8).collect();
                        let mut out = vec![0u8; len];
                        t.send_recv_into(right, &msg, left, &mut out).unwrap();
                        let want: Vec<u8> = (0..len).map(|k| (k * 7 + left + i) as u8).collect();
                        assert!(out == want, "{policy:?} rank {me} message {i}");
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }
}

#[test]
fn size_mismatch_is_reported_and_stream_stays_usable() {
    let mut w = world(2, 4096);
    let mut b = w.pop().unwrap();
    let mut a = w.pop().unwrap();
    let h = std::thread::spawn(move || {
        a.send(1, &[1; 10_000]).unwrap();
        a.send(1, &[2; 3]).unwrap();
        a
    });
    let mut out = [0u8; 5];
    let err = b.recv_into(0, &mut out).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SizeMismatch {
                peer: 0,
                expected: 5,
                got: 10_000
            }
        ),
        "{err}"
    );
    let mut out = [0u8; 3];
    b.recv_into(0, &mut out).unwrap();
    assert_eq!(out, [2; 3]);
    let _a = h.join().unwrap();
    assert!(matches!(
        b.send(9, &[]),
        Err(Error::InvalidRank { rank: 9, .. })
    ));
}

#[test]
fn dropped_peer_is_named_and_stalled_peer_times_out() {
    let mut w = world(3, 4096);
    let c = w.pop().unwrap();
    let mut b = w.pop().unwrap();
    let mut a = w.pop().unwrap();
    drop(c);
    let err = a.recv(2, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, Error::PeerClosed { peer: 2, .. }), "{err}");
    // A full ring to a dropped peer is a closed peer too, not a hang.
    let err = a.send(2, &[0; 10_000]).unwrap_err();
    assert!(matches!(err, Error::PeerClosed { peer: 2, .. }), "{err}");
    a.set_timeout(Duration::from_millis(50));
    let t0 = Instant::now();
    let err = a.recv(1, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, Error::Timeout { peer: 1, .. }), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    // Data sent before a peer left is still delivered.
    b.send(0, b"last words").unwrap();
    drop(b);
    let mut buf = Vec::new();
    a.recv(1, &mut buf).unwrap();
    assert_eq!(buf, b"last words");
}

#[test]
fn corrupt_positions_are_a_typed_error() {
    let mut w = world(2, 4096);
    let b = w.pop().unwrap();
    let mut a = w.pop().unwrap();
    // The peer (rank 1) claims to have written more than the ring holds.
    a.rx[1].as_ref().unwrap().corrupt_head(1 << 40);
    let err = a.recv(1, &mut Vec::new()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::BadRing {
                peer: 1,
                source: HeaderError::Positions { .. }
            }
        ),
        "{err}"
    );
    drop(b);
}

#[test]
fn oversized_frame_is_refused_before_allocating() {
    let mut w = world(2, 4096);
    let mut b = w.pop().unwrap();
    let mut a = w.pop().unwrap();
    b.max_frame = 100;
    a.send(1, &[0; 200]).unwrap();
    let err = b.recv(0, &mut Vec::new()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::FrameTooLarge {
                peer: 0,
                len: 200,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_ring_file_is_refused_and_missing_peer_times_out() {
    let dir = std::env::temp_dir().join(format!("gw-shm-test-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cfg = ShmConfig::new(1, 2, "bad-header");
    cfg.dir = dir.clone();
    cfg.timeout = Duration::from_millis(100);
    // Nobody creates the rings: rank 1 times out naming rank 0.
    let err = Shm::connect(&cfg).err().unwrap();
    assert!(
        matches!(
            err,
            Error::Timeout {
                peer: 0,
                op: Op::Connect,
                ..
            }
        ),
        "{err}"
    );
    // A file with garbage where the ring should be: a typed header error.
    std::fs::write(cfg.path(1, 0), vec![0xAB; 8192]).unwrap();
    set_mode(&cfg.path(1, 0), 0o600);
    let err = Shm::connect(&cfg).err().unwrap();
    assert!(
        matches!(
            err,
            Error::BadRing {
                peer: 0,
                source: HeaderError::BadMagic
            }
        ),
        "{err}"
    );
    // A valid ring that others may read or write: never opened.
    Ring::create(&cfg.path(1, 0), &cfg.header(1, 0)).unwrap();
    set_mode(&cfg.path(1, 0), 0o644);
    let err = Shm::connect(&cfg).err().unwrap();
    assert!(
        matches!(
            err,
            Error::BadRing {
                peer: 0,
                source: HeaderError::NotOurs { mode: 0o644, .. }
            }
        ),
        "{err}"
    );
    // A symbolic link to a valid ring: never followed.
    let elsewhere = dir.join("elsewhere");
    Ring::create(&elsewhere, &cfg.header(1, 0)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, cfg.path(1, 0)).unwrap();
    let err = Shm::connect(&cfg).err().unwrap();
    assert!(
        matches!(
            err,
            Error::BadRing {
                peer: 0,
                source: HeaderError::Link
            }
        ),
        "{err}"
    );
    assert!(elsewhere.exists(), "the link's target was removed");
    // A valid ring of another job: refused as well.
    let mut other = cfg.clone();
    other.job = "another".into();
    Ring::create(&cfg.path(1, 0), &other.header(1, 0)).unwrap();
    let err = Shm::connect(&cfg).err().unwrap();
    assert!(
        matches!(
            err,
            Error::BadRing {
                source: HeaderError::Mismatch { .. },
                ..
            }
        ),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn setup_leaves_no_files() {
    let n = 3;
    let job = format!("cleanup-{:016x}", rand::random::<u64>());
    let ranks: Vec<Shm> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let cfg = ShmConfig::new(r, n, job.clone());
                s.spawn(move || Shm::connect(&cfg).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Unlinked as soon as both ends are mapped: nothing in /dev/shm while the job runs.
    let key = format!("{:016x}", ShmConfig::new(0, n, job).job_key());
    assert!(files_of(&key).is_empty(), "{:?}", files_of(&key));
    assert_eq!(ranks.len(), n);
    let solo = Shm::connect(&ShmConfig::new(0, 1, "solo")).unwrap();
    assert_eq!(solo.world_size(), 1);
}

#[test]
fn reads_env() {
    let get = |k: &str| {
        match k {
            "GRADWIRE_RANK" => Some("1"),
            "GRADWIRE_WORLD_SIZE" => Some("4"),
            "GRADWIRE_TOKEN" => Some("tok"),
            "GRADWIRE_SHM_RING_BYTES" => Some("65536"),
            "GRADWIRE_SHM_SPIN_US" => Some("7"),
            _ => None,
        }
        .map(String::from)
    };
    let c = config_from(get).unwrap().unwrap();
    assert_eq!((c.rank, c.world_size, c.ring_bytes), (1, 4, 65536));
    assert_eq!(c.wait.spin, Duration::from_micros(7));
    assert_eq!(c.wait.yield_for, WaitPolicy::new().yield_for);
    assert!(c.job.starts_with("tok@"));
    let bad = |k: &str| {
        match k {
            "GRADWIRE_RANK" => Some("0"),
            "GRADWIRE_WORLD_SIZE" => Some("2"),
            "GRADWIRE_SHM_RING_BYTES" => Some("1000"),
            _ => None,
        }
        .map(String::from)
    };
    let e = config_from(bad).unwrap_err();
    assert!(e.to_string().contains("GRADWIRE_SHM_RING_BYTES"), "{e}");
    assert!(config_from(|_| None).unwrap().is_none());
}

#[test]
fn two_mpi_jobs_without_a_token_get_different_rings() {
    let job = |ns: &'static str| {
        move |k: &str| {
            match k {
                "OMPI_COMM_WORLD_RANK" => Some("0"),
                "OMPI_COMM_WORLD_SIZE" => Some("2"),
                "PMIX_NAMESPACE" => Some(ns),
                _ => None,
            }
            .map(String::from)
        }
    };
    let (a, b) = (
        config_from(job("1001")).unwrap().unwrap(),
        config_from(job("1002")).unwrap().unwrap(),
    );
    assert_ne!(a.path(0, 1), b.path(0, 1));
    assert_eq!(
        a.path(0, 1),
        config_from(job("1001")).unwrap().unwrap().path(0, 1)
    );
}

// ---- real processes ----------------------------------------------------------------------

const CHILD_VAR: &str = "GRADWIRE_SHM_TEST_CHILD";

/// The child role: a rank of a shared-memory job from the environment, exchanging around a
/// ring until something fails; it prints `CHILD ready` and then `CHILD error: ...`.
/// Run by `killed_rank_is_named_by_the_others`; as a plain test it does nothing.
#[test]
fn child_role() {
    if std::env::var(CHILD_VAR).is_err() {
        return;
    }
    let cfg = config_from_env().unwrap().expect("child without a rank");
    let mut t = Shm::connect(&cfg).unwrap();
    let (me, n) = (t.rank(), t.world_size());
    println!("CHILD ready {me}");
    let mut buf = Vec::new();
    let msg = vec![me as u8; 64 << 10];
    let started = Instant::now();
    let err = loop {
        if let Err(e) = t.send_recv((me + 1) % n, &msg, (me + n - 1) % n, &mut buf) {
            break e.to_string();
        }
        if started.elapsed() > Duration::from_secs(60) {
            break "no failure within 60 s".into();
        }
    };
    println!("CHILD error: {err}");
    drop(t); // close our ends cleanly, so the others blame the killed rank only
    std::process::exit(3);
}

/// Child processes, killed when dropped (a failing test leaves no stray ranks).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn killed_rank_is_named_by_the_others() {
    let n = 3;
    let token = format!("kill-test-{:016x}", rand::random::<u64>());
    let exe = std::env::current_exe().unwrap();
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut kids = Children(Vec::new());
    for rank in 0..n {
        let mut child = Command::new(&exe)
            .args(["shm::tests::child_role", "--exact", "--nocapture"])
            .env(CHILD_VAR, "1")
            .env("GRADWIRE_RANK", rank.to_string())
            .env("GRADWIRE_WORLD_SIZE", n.to_string())
            .env("GRADWIRE_TOKEN", &token)
            .env("GRADWIRE_TIMEOUT", "20")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if let Some(rest) = line.strip_prefix("CHILD ") {
                    let _ = tx.send((rank, rest.to_string()));
                }
            }
        });
        kids.0.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let next = |what: &str| {
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| panic!("children: no {what} in time"))
    };
    for _ in 0..n {
        let (rank, line) = next("ready line");
        assert!(line.starts_with("ready"), "rank {rank}: {line}");
    }
    std::thread::sleep(Duration::from_millis(100));
    let victim = 1;
    let pid = kids.0[victim].id();
    kids.0[victim].kill().unwrap();
    kids.0[victim].wait().unwrap();
    let mut errors = Vec::new();
    for _ in 0..n - 1 {
        errors.push(next("error line"));
    }
    eprintln!("errors: {errors:?}");
    for (rank, line) in &errors {
        // Either it saw the death itself, or a peer that did told it.
        assert!(
            line.contains(&format!("rank {victim}: process {pid} died"))
                || line.contains(&format!("rank {victim} failed (reported by rank")),
            "rank {rank} said: {line}"
        );
    }
    for (r, c) in kids.0.iter_mut().enumerate().filter(|(r, _)| *r != victim) {
        let status = c.wait().unwrap();
        assert_eq!(status.code(), Some(3), "rank {r}");
    }
    let key = ShmConfig::new(0, n, format!("{token}@127.0.0.1:29500")).job_key();
    assert!(
        files_of(&format!("{key:016x}")).is_empty(),
        "ring files left"
    );
}

#[test]
fn a_failure_is_reported_to_the_rest_of_the_job() {
    let mut w = world(3, 4096);
    let c = w.pop().unwrap();
    let mut b = w.pop().unwrap();
    let mut a = w.pop().unwrap();
    drop(c);
    let err = b.recv(2, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, Error::PeerClosed { peer: 2, .. }), "{err}");
    // Rank 0 waits for rank 1, which is alive: it learns that rank 2 failed, from rank 1.
    let err = a.recv(1, &mut Vec::new()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::PeerFailed {
                peer: 2,
                reported_by: 1
            }
        ),
        "{err}"
    );
}
