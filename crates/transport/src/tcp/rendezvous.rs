//! Rendezvous: rank 0 admits every rank (handshake, see [`super::handshake`]) and notes its
//! listening address, then sends the address table back; ranks > 0 connect to the lower
//! ranks and accept the higher ones, with the same mutual handshake on every connection.

use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::frame::{decode_table, encode_table, table_len, Hello, HelloKind};
use super::handshake::{self, ConnectFailure, Gate};
use super::sys::{connect_before, read_exact_before};
use super::{check_cfg, rendezvous, Tcp, TcpConfig};
use crate::{Error, Op, Result};

/// First pause before trying again after an impostor answered; doubles up to a second.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

impl Tcp {
    /// Rank 0's side of the rendezvous on an already-bound listener (lets tests bind port 0).
    pub fn connect_rank0(listener: TcpListener, cfg: &TcpConfig) -> Result<Tcp> {
        check_cfg(cfg)?;
        let n = cfg.world_size;
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        let mut addrs: Vec<Option<SocketAddr>> = vec![None; n];
        addrs[0] = Some(
            listener
                .local_addr()
                .map_err(|e| rendezvous(format!("listener address: {e}")))?,
        );
        let deadline = Instant::now() + cfg.timeout;
        let mut gate = Gate::new(&listener, cfg.token.as_bytes(), 0, cfg.handshake_limit())
            .map_err(|e| rendezvous(format!("listener: {e}")))?;
        let mut missing = n - 1;
        while missing > 0 {
            let admitted = gate
                .next(deadline, |h| check_hello(h, cfg, HelloKind::Hello, &peers))
                .map_err(|e| rendezvous(format!("accept: {e}")))?;
            let Some(a) = admitted else {
                return Err(rendezvous(format!(
                    "rank(s) {} did not join within {:?}",
                    absent(&peers, 1),
                    cfg.timeout
                )));
            };
            let r = a.hello.rank as usize;
            addrs[r] = Some(SocketAddr::new(a.from.ip(), a.hello.port));
            peers[r] = Some(a.stream);
            missing -= 1;
        }
        // Everyone is here: send the table of listening addresses.
        let addrs: Vec<SocketAddr> = addrs
            .into_iter()
            .map(|a| a.expect("all ranks joined"))
            .collect();
        let table = encode_table(&addrs);
        for (r, p) in peers.iter_mut().enumerate() {
            if let Some(s) = p {
                s.write_all(&table).map_err(|e| Error::Io {
                    peer: r,
                    op: Op::Connect,
                    source: e,
                })?;
            }
        }
        Self::finish(cfg, peers)
    }

    pub(super) fn connect_other(cfg: &TcpConfig) -> Result<Tcp> {
        check_cfg(cfg)?;
        let n = cfg.world_size;
        let deadline = Instant::now() + cfg.timeout;
        let token = cfg.token.as_bytes();
        // Our own listener, on the interface that reaches rank 0, port 0.
        let first = connect_before(cfg.master, deadline, 0)?;
        let local_ip = first
            .local_addr()
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let listener = TcpListener::bind(SocketAddr::new(local_ip, 0))
            .map_err(|e| rendezvous(format!("cannot listen on {local_ip}: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| rendezvous(format!("listener address: {e}")))?
            .port();
        let hello = Hello {
            kind: HelloKind::Hello,
            rank: cfg.rank as u32,
            world_size: n as u32,
            port,
            nonce: [0; 16],
        };
        let mut master = connect_authenticated(cfg, cfg.master, 0, &hello, deadline, Some(first))?;
        // Wait for the table (rank 0 sends it once all ranks are in).
        let mut table = vec![0u8; table_len(n)];
        read_exact_before(&mut master, &mut table, deadline).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Rendezvous {
                reason: format!(
                    "rank 0 did not complete the rendezvous within {:?} (a rank missing?)",
                    cfg.timeout
                ),
            },
            io::ErrorKind::UnexpectedEof => Error::Rendezvous {
                reason: "rank 0 closed the connection during the rendezvous".into(),
            },
            _ => Error::Io {
                peer: 0,
                op: Op::Connect,
                source: e,
            },
        })?;
        let addrs = decode_table(&table, n)
            .map_err(|e| rendezvous(format!("rank 0 sent a malformed address table ({e:?})")))?;
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        peers[0] = Some(master);
        // Connect to lower ranks > 0.
        for (r, addr) in addrs.iter().enumerate().take(cfg.rank).skip(1) {
            let join = Hello {
                kind: HelloKind::Join,
                port: 0,
                ..hello.clone()
            };
            peers[r] = Some(connect_authenticated(cfg, *addr, r, &join, deadline, None)?);
        }
        // Accept higher ranks.
        let mut gate = Gate::new(&listener, token, cfg.rank as u32, cfg.handshake_limit())
            .map_err(|e| rendezvous(format!("listener: {e}")))?;
        let mut missing = n - 1 - cfg.rank;
        while missing > 0 {
            let admitted = gate
                .next(deadline, |h| check_hello(h, cfg, HelloKind::Join, &peers))
                .map_err(|e| rendezvous(format!("accept: {e}")))?;
            let Some(a) = admitted else {
                return Err(rendezvous(format!(
                    "rank(s) {} did not connect to rank {} within {:?}",
                    absent(&peers, cfg.rank + 1),
                    cfg.rank,
                    cfg.timeout
                )));
            };
            peers[a.hello.rank as usize] = Some(a.stream);
            missing -= 1;
        }
        Self::finish(cfg, peers)
    }
}

/// Ranks from `from` on that have no connection yet, as "2, 5".
fn absent(peers: &[Option<TcpStream>], from: usize) -> String {
    (from..peers.len())
        .filter(|&r| peers[r].is_none())
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether an accepting rank takes this hello: the right kind, our world size, a rank that
/// may connect to us (`> our rank`, `> 0`) and has not yet.
fn check_hello(
    h: &Hello,
    cfg: &TcpConfig,
    want: HelloKind,
    peers: &[Option<TcpStream>],
) -> std::result::Result<(), String> {
    if h.kind != want {
        return Err(format!("unexpected handshake kind {:?}", h.kind));
    }
    if h.world_size as usize != cfg.world_size {
        return Err(format!(
            "world size {} differs from ours ({})",
            h.world_size, cfg.world_size
        ));
    }
    let r = h.rank as usize;
    if r <= cfg.rank || r >= cfg.world_size {
        return Err(format!("rank {r} may not connect to rank {}", cfg.rank));
    }
    if peers[r].is_some() {
        return Err(format!("rank {r} is already connected"));
    }
    Ok(())
}

/// Connects to rank `peer` at `addr` and runs the handshake (a fresh nonce each try). An
/// answer that does not prove the token is logged and the connection tried again (the real
/// rank may not be up yet) until the deadline. `first`: an already open connection to try
/// first.
fn connect_authenticated(
    cfg: &TcpConfig,
    addr: SocketAddr,
    peer: usize,
    hello: &Hello,
    deadline: Instant,
    mut first: Option<TcpStream>,
) -> Result<TcpStream> {
    let mut pause = RETRY_PAUSE;
    loop {
        let mut s = match first.take() {
            Some(s) => s,
            None => connect_before(addr, deadline, peer)?,
        };
        let hello = Hello {
            nonce: rand::random(),
            ..hello.clone()
        };
        let try_until = deadline.min(Instant::now() + cfg.handshake_limit());
        match handshake::connect(&mut s, cfg.token.as_bytes(), &hello, peer as u32, try_until) {
            Ok(()) => return Ok(s),
            Err(ConnectFailure::Impostor(why)) => {
                tracing::warn!(%addr, rank = cfg.rank, "refused rank {peer} at {addr}: {why}");
                if Instant::now() + pause >= deadline {
                    return Err(rendezvous(format!(
                        "no genuine rank {peer} at {addr} within {:?}: {why} (a different \
                         GRADWIRE_TOKEN there, or an impostor)",
                        cfg.timeout
                    )));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(1));
            }
            Err(ConnectFailure::Closed) => {
                return Err(rendezvous(format!(
                    "rank {peer} at {addr} closed the connection during the handshake \
                     (wrong token or world size?)"
                )))
            }
            Err(ConnectFailure::Io(e)) => {
                return Err(rendezvous(format!(
                    "handshake with rank {peer} at {addr} failed: {e}"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::sync::{Arc, Mutex};

    use super::super::frame::{Challenge, Proof, CHALLENGE_LEN, HELLO_LEN};
    use super::super::handshake::{accept_mac, connect_mac};
    use super::*;
    use crate::Transport;

    /// Collects the events logged on this thread, as "field=value" text.
    #[derive(Clone)]
    struct Capture(Arc<Mutex<Vec<String>>>);

    impl Default for Capture {
        fn default() -> Self {
            keep_callsites_interested();
            Capture(Arc::default())
        }
    }

    /// The global subscriber of this test binary: it records nothing, but answers every
    /// callsite with "always". Without it, a callsite first reached on a thread with no
    /// subscriber (another test's rank thread) while a single scoped `Capture` was alive is
    /// cached as "never" by tracing-core (it then asks only that thread's default), and the
    /// capture loses the event: this made `strangers_cost_the_real_ranks_nothing_and_are_logged`
    /// fail in CI.
    fn keep_callsites_interested() {
        struct Interested;
        impl tracing::Subscriber for Interested {
            fn register_callsite(
                &self,
                _: &tracing::Metadata<'_>,
            ) -> tracing::subscriber::Interest {
                tracing::subscriber::Interest::always()
            }
            fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
                false
            }
            fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
                tracing::span::Id::from_u64(1)
            }
            fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
            fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
            fn event(&self, _: &tracing::Event<'_>) {}
            fn enter(&self, _: &tracing::span::Id) {}
            fn exit(&self, _: &tracing::span::Id) {}
        }
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // `Dispatch::new` registers it in tracing-core's list of dispatchers for good (the
            // global default is never dropped), so the list never holds a lone capture.
            let _ = tracing::dispatcher::set_global_default(tracing::Dispatch::new(Interested));
            tracing::callsite::rebuild_interest_cache();
        });
    }

    struct Fields(String);

    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
            use std::fmt::Write as _;
            let _ = write!(self.0, "{}={:?} ", f.name(), v);
        }
    }

    impl tracing::Subscriber for Capture {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, e: &tracing::Event<'_>) {
            let mut f = Fields(String::new());
            e.record(&mut f);
            self.0.lock().unwrap().push(f.0);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    impl Capture {
        fn logged(&self, needle: &str) -> bool {
            self.0.lock().unwrap().iter().any(|l| l.contains(needle))
        }
    }

    fn hello(rank: u32, world_size: u32) -> Hello {
        Hello {
            kind: HelloKind::Hello,
            rank,
            world_size,
            port: 1,
            nonce: rand::random(),
        }
    }

    /// A stranger that runs the whole protocol with the wrong token; returns whether rank 0
    /// then closed the connection.
    fn fake_rank(master: SocketAddr) -> bool {
        let mut s = TcpStream::connect(master).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let h = hello(1, 3).encode();
        s.write_all(&h).unwrap();
        let mut ch = [0u8; CHALLENGE_LEN];
        s.read_exact(&mut ch).unwrap();
        let proof = Proof {
            mac: connect_mac(b"not the token", &h, &ch),
        };
        s.write_all(&proof.encode()).unwrap();
        matches!(s.read(&mut [0u8; 1]), Ok(0) | Err(_))
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
                s.write_all(&hello(1, 3).encode()).unwrap();
                s
            })
            .collect();
        let dribblers: Vec<_> = (0..5)
            .map(|_| {
                let mut s = TcpStream::connect(master).unwrap();
                std::thread::spawn(move || {
                    for b in hello(2, 3).encode().iter().take(HELLO_LEN - 1) {
                        if s.write_all(&[*b]).is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                })
            })
            .collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let others = std::thread::spawn(move || {
            let refused = fake_rank(master);
            let start = Instant::now();
            tx.send(start).unwrap();
            let hs: Vec<_> = (1..3)
                .map(|r| {
                    let cfg = TcpConfig::new(r, 3, master, "right");
                    std::thread::spawn(move || Tcp::connect(&cfg))
                })
                .collect();
            let ranks: Vec<Tcp> = hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
            (refused, ranks)
        });
        let log = Capture::default();
        let cfg0 = TcpConfig::new(0, 3, master, "right");
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
        assert!(log.logged("wrong token"), "{:?}", log.0.lock().unwrap());
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

    #[test]
    fn a_fake_master_is_refused_and_never_learns_the_token() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let master = listener.local_addr().unwrap();
        let log = Capture::default();
        let log1 = log.clone();
        let h = std::thread::spawn(move || {
            let cfg = TcpConfig::new(1, 2, master, "the real token");
            tracing::subscriber::with_default(log1, || Tcp::connect(&cfg))
        });
        // The impostor answers the first connection with a proof made without the token...
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hb = [0u8; HELLO_LEN];
        s.read_exact(&mut hb).unwrap();
        let nonce = rand::random();
        let signed = Challenge::encode_signed(0, &nonce);
        let ch = Challenge {
            rank: 0,
            nonce,
            mac: accept_mac(b"a guess", &hb, &signed),
        };
        s.write_all(&ch.encode()).unwrap();
        // ...and gets nothing more: rank 1 hangs up without a proof.
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "rank 1 sent {} more bytes", rest.len());
        assert!(!hb.windows(5).any(|w| w == b"token"));
        // Then the real rank 0 takes over the address, and the job forms.
        let mut a =
            Tcp::connect_rank0(listener, &TcpConfig::new(0, 2, master, "the real token")).unwrap();
        let mut b = h.join().unwrap().unwrap();
        assert!(
            log.logged("does not prove it knows the token"),
            "{:?}",
            log.0.lock().unwrap()
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

    #[test]
    fn an_empty_token_off_loopback_is_warned_about() {
        let log = Capture::default();
        let far = TcpConfig::new(1, 2, "10.1.2.3:29500".parse().unwrap(), "");
        let near = TcpConfig::new(1, 2, "127.0.0.1:29500".parse().unwrap(), "");
        tracing::subscriber::with_default(log.clone(), || check_cfg(&near)).unwrap();
        assert!(!log.logged("token is empty"));
        tracing::subscriber::with_default(log.clone(), || check_cfg(&far)).unwrap();
        assert!(log.logged("token is empty"), "{:?}", log.0.lock().unwrap());
    }
}
