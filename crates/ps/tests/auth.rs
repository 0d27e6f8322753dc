//! Authentication: a stranger without the token gets nothing from a shard (no value, no
//! "ok", no error echoing a worker's state) and cannot fence, leave, init or push for a
//! worker; an admitted connection is bound to its worker id and role; a shard off
//! loopback without a token refuses to start.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::authed;
use gradwire_ps::fault::ShardProcess;
use gradwire_ps::wire::{
    read_frame, Encoding, ErrorCode, Push, Request, Response, VecOp, DEFAULT_MAX_BODY,
};
use gradwire_ps::{
    ChunkId, ClientConfig, Consistency, Error, Key, KvStore, Peer, PushMode, Role, Server,
    ServerConfig, ShardConfig, TableSpec, UpdaterSpec, WorkerId,
};
use gradwire_transport::tcp::frame::{Hello, HelloKind, JOB_LEN, PROOF_LEN};

const BIN: &str = env!("CARGO_BIN_EXE_gradwire-ps-server");
const TOKEN: &str = "a-long-random-token-only-the-job-knows";

fn chunk(key: u64) -> ChunkId {
    ChunkId {
        key: Key(key),
        index: 0,
    }
}

fn push(worker: u32, incarnation: u64, seq: u64, key: u64, mode: PushMode, v: &[f32]) -> Push {
    Push {
        worker: WorkerId(worker),
        incarnation,
        seq,
        chunk: chunk(key),
        clock: 0,
        mode,
        encoding: Encoding::Dense,
        payload: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// Sends `bytes` on a fresh connection and returns every byte the shard sends back before
/// it closes the connection (or 2 s of silence pass).
fn stranger(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("the port is reachable");
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = s.write_all(bytes);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

fn client(worker: u32, addr: SocketAddr, token: &str) -> ClientConfig {
    let mut c = ClientConfig::new(WorkerId(worker), vec![addr]);
    c.token = token.into();
    c.heartbeat = None;
    c.deadline = Duration::from_secs(20);
    c.attempt_timeout = Duration::from_secs(10);
    c
}

#[test]
fn a_stranger_without_the_token_gets_no_value_no_ok_and_cannot_act_for_a_worker() {
    let dir = std::env::temp_dir().join(format!("gwps-auth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--dir",
        dir.to_str().unwrap(),
        "--wal",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let shard =
        ShardProcess::spawn_with_env(BIN.as_ref(), &args, &[("GRADWIRE_TOKEN", TOKEN)]).unwrap();
    let addr = shard.addr();
    let spec = TableSpec::new(Consistency::Async, UpdaterSpec::Sum);
    // The coordinator (worker 0) creates table 1 and pushes once.
    let mut w0 = KvStore::connect(client(0, addr, TOKEN)).unwrap();
    w0.init(Key(1), spec.clone(), &[0.0, 0.0]).unwrap();
    w0.push_with(Key(1), &[1.0, 0.0], PushMode::Add).unwrap();

    // A stranger speaks the PS protocol straight away: hello with the largest incarnation
    // (fencing), init of a new table and of table 1 with its own spec, assign pushes that
    // take worker 1's first sequence numbers, leave for worker 1, pulls, stats.
    let mut attempts: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut f = Vec::new();
    for w in 0..2 {
        Request::Hello {
            worker: WorkerId(w),
            incarnation: u64::MAX,
        }
        .encode(1, &mut f);
        attempts.push(("hello u64::MAX", f.clone()));
    }
    Request::Init {
        chunk: chunk(2),
        spec: TableSpec::new(Consistency::Async, UpdaterSpec::Sum),
        values: vec![666.0],
    }
    .encode(2, &mut f);
    attempts.push(("init of a new table", f.clone()));
    Request::Init {
        chunk: chunk(1),
        spec: TableSpec::new(Consistency::Sync, UpdaterSpec::Sum),
        values: vec![5.0, 5.0],
    }
    .encode(3, &mut f);
    attempts.push(("init of table 1", f.clone()));
    for seq in 0..4 {
        Request::Push(push(1, 1, seq, 1, PushMode::Assign, &[99.0, 99.0])).encode(4, &mut f);
        attempts.push(("assign push for worker 1", f.clone()));
    }
    Request::Push(push(0, u64::MAX, 1, 1, PushMode::Add, &[7.0, 7.0])).encode(5, &mut f);
    attempts.push(("push for worker 0", f.clone()));
    Request::Leave {
        worker: WorkerId(1),
        incarnation: u64::MAX,
    }
    .encode(6, &mut f);
    attempts.push(("leave for worker 1", f.clone()));
    Request::Pull {
        worker: WorkerId(0),
        chunk: chunk(1),
        clock: 0,
        rows: None,
    }
    .encode(7, &mut f);
    attempts.push(("pull", f.clone()));
    Request::Stats.encode(8, &mut f);
    attempts.push(("stats", f.clone()));
    // The transport's hello, then a made-up proof, then a PS frame.
    let mut forged = Hello {
        kind: HelloKind::Hello,
        rank: 1,
        world_size: u32::MAX,
        port: 1,
        nonce: [3; 16],
        job: [0; JOB_LEN],
    }
    .encode()
    .to_vec();
    forged.extend_from_slice(&[0u8; PROOF_LEN]);
    Request::Push(push(1, 1, 0, 1, PushMode::Assign, &[99.0, 99.0])).encode(9, &mut f);
    forged.extend_from_slice(&f);
    attempts.push(("a handshake with a forged proof", forged));
    for (what, bytes) in &attempts {
        let got = stranger(addr, bytes);
        let mut body = Vec::new();
        let reply = read_frame(&mut &got[..], DEFAULT_MAX_BODY, &mut body)
            .ok()
            .and_then(|h| Response::decode(&h, &body).ok());
        assert!(
            reply.is_none(),
            "{what}: the stranger got a PS answer: {reply:?}"
        );
    }

    // Worker 1 joins: not fenced, its own sequence numbers are its own, no one left for it.
    let mut w1 = KvStore::connect(client(1, addr, TOKEN)).unwrap();
    w1.init(Key(1), spec.clone(), &[0.0, 0.0]).unwrap();
    w1.push_with(Key(1), &[0.0, 1.0], PushMode::Add).unwrap();
    w0.push_with(Key(1), &[1.0, 0.0], PushMode::Add).unwrap();
    let mut out = [0.0f32; 2];
    w1.pull(Key(1), &mut out).unwrap();
    assert_eq!(out, [2.0, 1.0], "exactly the workers' pushes, nothing else");
    let stats = w0.stats(0).unwrap();
    assert_eq!(
        (stats.applied, stats.duplicates, stats.fenced),
        (3, 0, 0),
        "no push taken as a duplicate, no worker fenced"
    );
    // Table 2 does not exist: the coordinator's init creates it with its own values.
    w0.init(Key(2), spec, &[1.5]).unwrap();
    let mut t2 = [0.0f32];
    w0.pull(Key(2), &mut t2).unwrap();
    assert_eq!(t2, [1.5]);
    drop(shard);
    let _ = std::fs::remove_dir_all(&dir);
}

fn server(token: &str, workers: u32) -> Server {
    let mut cfg = ServerConfig::loopback(ShardConfig {
        num_workers: workers,
        max_wait: Duration::from_millis(300),
        ..ShardConfig::default()
    });
    cfg.token = token.into();
    Server::start(cfg).unwrap()
}

fn ask(s: &mut TcpStream, req: &Request) -> Response {
    let mut f = Vec::new();
    req.encode(11, &mut f);
    s.write_all(&f).unwrap();
    let mut body = Vec::new();
    let h = read_frame(s, DEFAULT_MAX_BODY, &mut body).unwrap();
    assert_eq!(h.rid, 11);
    Response::decode(&h, &body).unwrap()
}

fn code(r: Response) -> ErrorCode {
    match r {
        Response::Error(e) => e.code,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn a_connection_is_bound_to_its_worker_and_coordinator_ops_need_the_coordinator() {
    let srv = server("", 2);
    let addr = srv.local_addr();
    let spec = TableSpec::new(Consistency::Async, UpdaterSpec::Sum);
    let mut w1 = authed(addr, 1, Role::Worker);
    w1.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // A worker cannot create a table: it waits for the coordinator, then is told so.
    let init = Request::Init {
        chunk: chunk(1),
        spec: spec.clone(),
        values: vec![0.0],
    };
    assert_eq!(code(ask(&mut w1, &init)), ErrorCode::NotInitialized);
    let mut coord = authed(addr, 0, Role::Coordinator);
    assert_eq!(ask(&mut coord, &init), Response::Ok { value: 1 });
    assert_eq!(ask(&mut w1, &init), Response::Ok { value: 0 }, "joins");
    // Another worker's requests are refused, and say nothing of that worker.
    let denied = [
        Request::Hello {
            worker: WorkerId(0),
            incarnation: u64::MAX,
        },
        Request::Heartbeat {
            worker: WorkerId(0),
            incarnation: 1,
        },
        Request::Leave {
            worker: WorkerId(0),
            incarnation: 1,
        },
        Request::Push(push(0, 1, 0, 1, PushMode::Assign, &[9.0])),
        Request::PushPull(push(0, 1, 0, 1, PushMode::Add, &[9.0])),
        Request::Pull {
            worker: WorkerId(0),
            chunk: chunk(1),
            clock: 0,
            rows: None,
        },
        // The coordinator's operations.
        Request::Checkpoint,
        Request::VecOp(VecOp::Scale {
            a: 1,
            c: 1,
            alpha: 0.0,
        }),
        Request::SetVec {
            slot: 1 << 40,
            chunk: chunk(1),
            values: vec![1.0],
        },
    ];
    for req in &denied {
        match ask(&mut w1, req) {
            Response::Error(e) => {
                assert_eq!(e.code, ErrorCode::PermissionDenied, "{req:?}");
                assert_eq!((e.worker, e.value), (None, 0), "{req:?}: nothing echoed");
            }
            other => panic!("{req:?} was answered {other:?}"),
        }
    }
    // Its own requests go through.
    let own = Request::Push(push(1, 1, 0, 1, PushMode::Add, &[2.0]));
    assert!(matches!(ask(&mut w1, &own), Response::Ok { .. }));
    let pull = Request::Pull {
        worker: WorkerId(1),
        chunk: chunk(1),
        clock: 0,
        rows: None,
    };
    assert!(matches!(ask(&mut w1, &pull), Response::Values { values, .. } if values == [2.0]));
    assert!(matches!(ask(&mut w1, &Request::Stats), Response::Stats(_)));
    // The coordinator's vector op is taken.
    let scale = Request::VecOp(VecOp::Scale {
        a: 1,
        c: 1,
        alpha: 0.5,
    });
    assert_eq!(ask(&mut coord, &scale), Response::Ok { value: 0 });
    assert!(matches!(ask(&mut w1, &pull), Response::Values { values, .. } if values == [1.0]));
}

#[test]
fn a_wrong_token_or_an_unknown_worker_is_refused_at_the_handshake() {
    let srv = server(TOKEN, 2);
    let addr = srv.local_addr();
    let peer = |w: u32| Peer {
        worker: WorkerId(w),
        role: Role::Worker,
    };
    let deadline = || Instant::now() + Duration::from_secs(3);
    let mut s = TcpStream::connect(addr).unwrap();
    assert!(gradwire_ps::auth::connect(&mut s, "guess", peer(0), deadline()).is_err());
    let mut s = TcpStream::connect(addr).unwrap();
    assert!(gradwire_ps::auth::connect(&mut s, TOKEN, peer(2), deadline()).is_err());
    let mut s = TcpStream::connect(addr).unwrap();
    gradwire_ps::auth::connect(&mut s, TOKEN, peer(1), deadline()).unwrap();
    // A client with the wrong token never gets through (its retries fail alike).
    let mut cfg = client(0, addr, "guess");
    cfg.deadline = Duration::from_secs(1);
    match KvStore::connect(cfg) {
        Err(Error::Timeout { last, .. }) => assert!(last.contains("handshake"), "{last}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a client with the wrong token connected"),
    }
    let mut kv = KvStore::connect(client(0, addr, TOKEN)).unwrap();
    kv.init(
        Key(1),
        TableSpec::new(Consistency::Async, UpdaterSpec::Sum),
        &[1.0],
    )
    .unwrap();
}

#[test]
fn a_shard_off_loopback_without_a_token_refuses_to_start_unless_insecure() {
    let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let mut cfg = ServerConfig::loopback(ShardConfig::default());
    cfg.listen = any;
    cfg.token = String::new();
    match Server::start(cfg.clone()) {
        Err(Error::Insecure { listen }) => assert_eq!(listen, any),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("started off loopback without a token"),
    }
    cfg.insecure = true;
    drop(Server::start(cfg.clone()).unwrap());
    cfg.insecure = false;
    cfg.token = TOKEN.into();
    drop(Server::start(cfg).unwrap());
    // The binary says why and exits.
    let out = Command::new(BIN)
        .args(["--listen", "0.0.0.0:0"])
        .env_remove("GRADWIRE_TOKEN")
        .env_remove("GRADWIRE_PS_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|c| {
            let guard = common::KillOnDrop(Some(c));
            guard.wait_output(Duration::from_secs(10))
        })
        .unwrap();
    assert!(!out.status.success(), "the shard started");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without a token"), "{err}");
}
