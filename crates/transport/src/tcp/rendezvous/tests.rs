//! Rendezvous tests: strangers and floods at rank 0, impostors at the master address, ranks
//! of another job or token, rank 0 closing connections, and the empty-token rules.

use std::io::Read;
use std::sync::mpsc;

use super::super::auth::{connect_mac, job_digest};
use super::super::capture::Capture;
use super::super::frame::{Challenge, Confirm, Proof, CHALLENGE_LEN, HELLO_LEN, NONCE_LEN};
use super::*;
use crate::Transport;

fn hello(rank: u32, world_size: u32, job: &str) -> Hello {
    Hello {
        kind: HelloKind::Hello,
        rank,
        world_size,
        port: 1,
        nonce: rand::random(),
        job: job_digest(job),
    }
}

fn config(rank: usize, n: usize, master: SocketAddr, token: &str, job: &str) -> TcpConfig {
    TcpConfig {
        job: job.into(),
        ..TcpConfig::new(rank, n, master, token)
    }
}

/// A stranger that runs the whole protocol with the wrong token; returns whether rank 0
/// then closed the connection without a confirm.
fn fake_rank(master: SocketAddr, job: &str) -> bool {
    let mut s = TcpStream::connect(master).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let h = hello(1, 3, job).encode();
    s.write_all(&h).unwrap();
    let mut ch = [0u8; CHALLENGE_LEN];
    s.read_exact(&mut ch).unwrap();
    let proof = Proof {
        mac: connect_mac(b"not the token", &h, &ch),
    };
    s.write_all(&proof.encode()).unwrap();
    matches!(s.read(&mut [0u8; 1]), Ok(0) | Err(_))
}

/// Raises this process's soft limit on descriptors towards `want` (a flood test holds a
/// thousand sockets; some machines start at 1024).
fn raise_fd_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[test]
fn strangers_cost_the_real_ranks_nothing_and_are_logged() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let master = listener.local_addr().unwrap();
    // Silent strangers, strangers that stop after a valid hello, and dribblers that send
    // a byte of hello every 100 ms: each used to cost rank 0 up to 5 s in turn.
    let silent: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(master).unwrap())
        .collect();
    let slow: Vec<TcpStream> = (0..5)
        .map(|_| {
            let mut s = TcpStream::connect(master).unwrap();
            s.write_all(&hello(1, 3, "j").encode()).unwrap();
            s
        })
        .collect();
    let dribblers: Vec<_> = (0..5)
        .map(|_| {
            let mut s = TcpStream::connect(master).unwrap();
            std::thread::spawn(move || {
                for b in hello(2, 3, "j").encode().iter().take(HELLO_LEN - 1) {
                    if s.write_all(&[*b]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    let (tx, rx) = mpsc::channel();
    let others = std::thread::spawn(move || {
        let refused = fake_rank(master, "j");
        let start = Instant::now();
        tx.send(start).unwrap();
        let hs: Vec<_> = (1..3)
            .map(|r| {
                let cfg = config(r, 3, master, "right", "j");
                std::thread::spawn(move || Tcp::connect(&cfg))
            })
            .collect();
        let ranks: Vec<Tcp> = hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        (refused, ranks)
    });
    let log = Capture::default();
    let cfg0 = config(0, 3, master, "right", "j");
    let mut a =
        tracing::subscriber::with_default(log.clone(), || Tcp::connect_rank0(listener, &cfg0))
            .unwrap();
    let formed = rx.recv().unwrap().elapsed();
    let (refused, mut ranks) = others.join().unwrap();
    assert!(refused, "rank 0 should close on a wrong proof");
    assert!(
        formed < Duration::from_secs(3),
        "the job took {formed:?} to form behind 30 strangers"
    );
    assert!(log.logged("wrong token"), "{:?}", log.lines());
    a.send(2, b"hi").unwrap();
    let mut buf = Vec::new();
    ranks[1].recv(0, &mut buf).unwrap();
    assert_eq!(buf, b"hi");
    ranks[1].send(1, b"ho").unwrap();
    ranks[0].recv(2, &mut buf).unwrap();
    assert_eq!(buf, b"ho");
    drop((silent, slow));
    for d in dribblers {
        d.join().unwrap();
    }
}

/// What one stranger of the flood does.
#[derive(Clone, Copy)]
enum Stranger {
    /// Connects and says nothing.
    Silent,
    /// Sends bytes that are no hello.
    Garbage,
    /// Sends a valid hello and stops.
    Stalls,
    /// Sends a valid hello, then a proof made without the token.
    WrongProof,
}

fn stranger(master: SocketAddr, kind: Stranger) -> Option<TcpStream> {
    let mut s = TcpStream::connect_timeout(&master, Duration::from_secs(5)).ok()?;
    let h = hello(1 + rand::random::<u32>() % 3, 4, "flood").encode();
    match kind {
        Stranger::Silent => {}
        Stranger::Garbage => {
            let _ = s.write_all(&[0xEE; HELLO_LEN]);
        }
        Stranger::Stalls => {
            let _ = s.write_all(&h);
        }
        Stranger::WrongProof => {
            let _ = s.write_all(&h);
            s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
            let mut ch = [0u8; CHALLENGE_LEN];
            if s.read_exact(&mut ch).is_ok() {
                let proof = Proof {
                    mac: connect_mac(b"a guess", &h, &ch),
                };
                let _ = s.write_all(&proof.encode());
            }
        }
    }
    Some(s)
}

/// 600 strangers at rank 0 (silent ones, garbage, valid hellos that stall, valid hellos with
/// wrong proofs), the real ranks arriving in the middle of them: the job forms, and rank 0
/// logs counts, not a line per stranger.
#[test]
fn a_flood_of_strangers_does_not_fail_the_real_ranks() {
    raise_fd_limit(4096);
    let n = 4;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let master = listener.local_addr().unwrap();
    let cfg = |r: usize| TcpConfig {
        timeout: Duration::from_secs(20),
        handshake_timeout: Duration::from_secs(1),
        ..config(r, n, master, "the real token", "flood")
    };
    let log = Capture::default();
    let cfg0 = cfg(0);
    let log0 = log.clone();
    let rank0 = std::thread::spawn(move || {
        tracing::subscriber::with_default(log0, || Tcp::connect_rank0(listener, &cfg0))
    });
    // Mostly strangers that hold a place (silent, or stalled after a valid hello), so that
    // rank 0 runs out of room while the real ranks arrive.
    let kinds = [
        Stranger::Silent,
        Stranger::Silent,
        Stranger::Silent,
        Stranger::Silent,
        Stranger::Stalls,
        Stranger::Stalls,
        Stranger::Stalls,
        Stranger::Garbage,
        Stranger::WrongProof,
        Stranger::WrongProof,
    ];
    let flood = |from: usize, to: usize| -> Vec<std::thread::JoinHandle<Vec<TcpStream>>> {
        (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    (from..to)
                        .filter(|i| i % 4 == t)
                        .filter_map(|i| stranger(master, kinds[i % kinds.len()]))
                        .collect()
                })
            })
            .collect()
    };
    // Most of the flood, then the real ranks with the rest of it.
    let first: Vec<TcpStream> = flood(0, 400)
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let start = Instant::now();
    let real: Vec<_> = (1..n)
        .map(|r| {
            let c = cfg(r);
            std::thread::spawn(move || Tcp::connect(&c))
        })
        .collect();
    let second: Vec<TcpStream> = flood(400, 600)
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let mut a = rank0
        .join()
        .unwrap()
        .expect("rank 0 failed behind the flood");
    let mut ranks: Vec<Tcp> = real
        .into_iter()
        .enumerate()
        .map(|(i, h)| {
            h.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("rank {} failed behind the flood: {e}", i + 1))
        })
        .collect();
    let formed = start.elapsed();
    // The strangers before the real ranks all connected (the rest raced rank 0, which
    // closes its listener once the job has formed).
    assert!(
        first.len() >= 390,
        "only {} strangers connected",
        first.len()
    );
    assert!(formed < Duration::from_secs(15), "took {formed:?}");
    // The mesh works.
    a.send(3, b"through").unwrap();
    let mut buf = Vec::new();
    ranks[2].recv(0, &mut buf).unwrap();
    assert_eq!(buf, b"through");
    drop((first, second));
    // Counts, not a line per stranger (the first drop, then one line per interval, then
    // the rest when the gate closes).
    let lines = log.count("refused");
    assert!(
        (1..=10).contains(&lines),
        "{lines} lines logged about refusals: {:?}",
        &log.lines()[..lines.min(20)]
    );
    assert!(log.logged("wrong token"), "{:?}", log.lines());
}

/// A rank of an earlier job (same token, same master address) is refused; the real rank of
/// this job takes its place.
#[test]
fn a_rank_of_another_job_cannot_join() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let master = listener.local_addr().unwrap();
    let mut stale = config(1, 2, master, "tok", "job-a");
    stale.timeout = Duration::from_millis(800);
    let stale = std::thread::spawn(move || Tcp::connect(&stale));
    std::thread::sleep(Duration::from_millis(100));
    let real = std::thread::spawn(move || Tcp::connect(&config(1, 2, master, "tok", "job-b")));
    let mut cfg0 = config(0, 2, master, "tok", "job-b");
    cfg0.timeout = Duration::from_secs(10);
    let log = Capture::default();
    let mut a =
        tracing::subscriber::with_default(log.clone(), || Tcp::connect_rank0(listener, &cfg0))
            .unwrap();
    let mut b = real.join().unwrap().unwrap();
    // The stale rank never got in: refused as of another job, then it found nobody.
    assert!(stale.join().unwrap().is_err(), "the stale rank joined");
    assert!(log.logged("another job"), "{:?}", log.lines());
    b.send(0, b"mine").unwrap();
    let mut buf = Vec::new();
    a.recv(1, &mut buf).unwrap();
    assert_eq!(buf, b"mine");
}

/// Rank 0 (or whatever holds its address) closes the first connections at once, as when it
/// has no room: the real rank tries again until rank 0 takes it.
#[test]
fn a_rank_retries_a_closed_rendezvous() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let master = listener.local_addr().unwrap();
    let mut cfg1 = config(1, 2, master, "tok", "j");
    cfg1.timeout = Duration::from_secs(10);
    let h = std::thread::spawn(move || Tcp::connect(&cfg1));
    // Close the first three connections (or stop waiting once rank 1 gave up).
    listener.set_nonblocking(true).unwrap();
    let (mut closed, until) = (0, Instant::now() + Duration::from_secs(10));
    while closed < 3 && Instant::now() < until && !h.is_finished() {
        match listener.accept() {
            Ok((s, _)) => {
                drop(s);
                closed += 1;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    listener.set_nonblocking(false).unwrap();
    let mut a = Tcp::connect_rank0(listener, &config(0, 2, master, "tok", "j")).unwrap();
    let mut b = h
        .join()
        .unwrap()
        .expect("rank 1 gave up on a closed rendezvous");
    b.send(0, b"again").unwrap();
    let mut buf = Vec::new();
    a.recv(1, &mut buf).unwrap();
    assert_eq!(buf, b"again");
}

#[test]
fn a_fake_master_is_refused_and_the_rank_tries_again() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let master = listener.local_addr().unwrap();
    let log = Capture::default();
    let log1 = log.clone();
    let h = std::thread::spawn(move || {
        let cfg = config(1, 2, master, "the real token", "j");
        tracing::subscriber::with_default(log1, || Tcp::connect(&cfg))
    });
    // The impostor answers the first connection, and its confirm is made without the token...
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hb = [0u8; HELLO_LEN];
    s.read_exact(&mut hb).unwrap();
    let ch = Challenge {
        rank: 0,
        nonce: [7; NONCE_LEN],
    };
    s.write_all(&ch.encode()).unwrap();
    let mut proof = [0u8; 36];
    s.read_exact(&mut proof).unwrap();
    s.write_all(&Confirm { mac: [1; 32] }.encode()).unwrap();
    // ...so rank 1 hangs up, sending nothing more.
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "rank 1 sent {} more bytes", rest.len());
    assert!(!hb.windows(5).any(|w| w == b"token"));
    // Then the real rank 0 takes over the address, and the job forms.
    let mut a = Tcp::connect_rank0(listener, &config(0, 2, master, "the real token", "j")).unwrap();
    let mut b = h.join().unwrap().unwrap();
    assert!(
        log.logged("does not prove it knows the token"),
        "{:?}",
        log.lines()
    );
    b.send(0, b"ok").unwrap();
    let mut buf = Vec::new();
    a.recv(1, &mut buf).unwrap();
    assert_eq!(buf, b"ok");
}

#[test]
fn a_rank_with_another_token_is_refused_by_name() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let master = listener.local_addr().unwrap();
    let mut cfg1 = TcpConfig::new(1, 2, master, "theirs");
    cfg1.timeout = Duration::from_millis(400);
    let h = std::thread::spawn(move || Tcp::connect(&cfg1));
    let mut cfg0 = TcpConfig::new(0, 2, master, "ours");
    cfg0.timeout = Duration::from_millis(1500);
    let e0 = Tcp::connect_rank0(listener, &cfg0).err().unwrap();
    let e1 = h.join().unwrap().err().unwrap();
    assert!(e0.to_string().contains("rank(s) 1 did not join"), "{e0}");
    assert!(e1.to_string().contains("no genuine rank 0"), "{e1}");
    assert!(e1.to_string().contains("refused"), "{e1}");
}

#[test]
fn max_frame_is_bounded_by_the_header() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let master = listener.local_addr().unwrap();
    let mut cfg = TcpConfig::new(0, 1, master, "t");
    cfg.max_frame = u64::from(u32::MAX) + 1;
    let e = Tcp::connect_rank0(listener, &cfg).err().unwrap();
    assert!(e.to_string().contains("max_frame"), "{e}");
}

/// An unset token with a master address off loopback is refused at once, on rank 0 and the
/// other ranks, with what to do; on loopback it runs with one warning line, and
/// `GRADWIRE_INSECURE=1` lets it run off loopback.
#[test]
fn an_unset_token_off_loopback_is_refused_with_a_clear_message() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    for rank in ["0", "1"] {
        let vars: &'static [(&str, &str)] = if rank == "0" {
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "10.1.2.3"),
                ("GRADWIRE_TIMEOUT", "1"),
            ]
        } else {
            &[
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "10.1.2.3"),
                ("GRADWIRE_TIMEOUT", "1"),
            ]
        };
        let (cfg, _) = crate::env::tcp_config_from(env(vars)).unwrap().unwrap();
        let start = Instant::now();
        let e = Tcp::connect(&cfg).err().expect("joined without a token");
        assert!(start.elapsed() < Duration::from_millis(500), "rank {rank}");
        assert!(matches!(e, Error::NoToken { .. }), "rank {rank}: {e}");
        let msg = e.to_string();
        for needle in [
            "GRADWIRE_TOKEN",
            "10.1.2.3",
            "not loopback",
            "GRADWIRE_INSECURE=1",
        ] {
            assert!(msg.contains(needle), "{needle} missing from: {msg}");
        }
    }
    // On loopback: one warning line on each rank (rank 0 too), and the job runs.
    // Rank 0 through `Tcp::connect`, as a launched rank joins: a port just free.
    let master = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap();
    let log1 = Capture::default();
    let l1 = log1.clone();
    let one = std::thread::spawn(move || {
        let cfg = TcpConfig::new(1, 2, master, "");
        tracing::subscriber::with_default(l1, || Tcp::connect(&cfg))
    });
    let log0 = Capture::default();
    let cfg0 = TcpConfig::new(0, 2, master, "");
    tracing::subscriber::with_default(log0.clone(), || Tcp::connect(&cfg0)).unwrap();
    one.join().unwrap().unwrap();
    for (rank, log) in [(0, log0), (1, log1)] {
        assert_eq!(
            log.count("GRADWIRE_TOKEN is not set"),
            1,
            "rank {rank}: {:?}",
            log.lines()
        );
    }
    // Off loopback, told it is fine.
    let (cfg, _) = crate::env::tcp_config_from(env(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.1.2.3"),
        ("GRADWIRE_INSECURE", "1"),
    ]))
    .unwrap()
    .unwrap();
    assert!(cfg.insecure);
    check_cfg(&cfg).unwrap();
    // A token off loopback needs nothing more.
    let far = TcpConfig::new(1, 2, "10.1.2.3:29500".parse().unwrap(), "t");
    check_cfg(&far).unwrap();
}
