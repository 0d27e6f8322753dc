//! The fault harness: dropped, duplicated, reordered, delayed and corrupted frames are
//! applied exactly once; malformed, oversized and truncated frames get typed errors while
//! other clients are still served; partitions heal; checkpoints keep optimizer state.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{addrs, authed, client, client_cfg, shards};
use gradwire_ps::fault::{FaultConfig, FaultProxy};
use gradwire_ps::wire::{read_frame, ErrorCode, Request, Response, DEFAULT_MAX_BODY, HEADER_LEN};
use gradwire_ps::{
    ChunkId, Consistency, Key, KvStore, PushMode, Role, Shard, ShardConfig, TableSpec, UpdaterSpec,
    WorkerId,
};

fn lossy() -> FaultConfig {
    FaultConfig {
        seed: 42,
        drop: 0.05,
        duplicate: 0.1,
        reorder: 0.1,
        delay: 0.1,
        max_delay: Duration::from_millis(3),
        corrupt: 0.03,
        both_directions: true,
    }
}

fn faulty_run(consistency: Consistency) {
    const W: u32 = 3;
    const STEPS: usize = 15;
    let servers = shards(2, W, |_| {});
    let proxies: Vec<FaultProxy> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            FaultProxy::start(
                s.local_addr(),
                FaultConfig {
                    seed: 42 + i as u64,
                    ..lossy()
                },
            )
            .unwrap()
        })
        .collect();
    let via: Vec<_> = proxies.iter().map(|p| p.local_addr()).collect();
    let spec = TableSpec::new(consistency, UpdaterSpec::Sum);
    let handles: Vec<_> = (0..W)
        .map(|w| {
            let via = via.clone();
            let spec = spec.clone();
            std::thread::spawn(move || {
                let mut cfg = client_cfg(w, via);
                cfg.attempt_timeout = Duration::from_millis(200);
                let mut kv = KvStore::connect(cfg).unwrap();
                kv.init(Key(1), spec, &[0.0; 600]).unwrap();
                let mut out = vec![0.0; 600];
                for t in 1..=STEPS {
                    let v: Vec<f32> = (0..600).map(|i| ((i % 3) as u32 + w + 1) as f32).collect();
                    kv.push_pull_with(Key(1), &v, PushMode::Add, &mut out)
                        .unwrap();
                    if consistency == Consistency::Sync {
                        for (i, x) in out.iter().enumerate() {
                            let per_round: u32 = (0..W).map(|w| (i % 3) as u32 + w + 1).sum();
                            assert_eq!(*x, (per_round as usize * t) as f32, "round {t} elem {i}");
                        }
                    }
                }
                kv.leave().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker");
    }
    let mut kv = client(0, addrs(&servers));
    kv.init(Key(1), spec, &[0.0; 600]).unwrap();
    let mut out = vec![0.0; 600];
    kv.pull(Key(1), &mut out).unwrap();
    for (i, x) in out.iter().enumerate() {
        let per_step: u32 = (0..W).map(|w| (i % 3) as u32 + w + 1).sum();
        assert_eq!(*x, (per_step as usize * STEPS) as f32, "elem {i}");
    }
    let dups: u64 = (0..2).map(|s| kv.stats(s).unwrap().duplicates).sum();
    let injected: u64 = proxies
        .iter()
        .map(|p| {
            p.counts().duplicated.load(Ordering::Relaxed)
                + p.counts().dropped.load(Ordering::Relaxed)
                + p.counts().reordered.load(Ordering::Relaxed)
        })
        .sum();
    assert!(injected > 10, "the proxy injected faults ({injected})");
    assert!(
        dups > 0,
        "some repeated pushes reached a shard and were applied once"
    );
}

#[test]
fn lossy_network_async_pushes_apply_exactly_once() {
    faulty_run(Consistency::Async);
}

#[test]
fn lossy_network_sync_rounds_count_each_worker_once() {
    faulty_run(Consistency::Sync);
}

#[test]
fn partition_then_heal_loses_and_doubles_nothing() {
    let servers = shards(1, 1, |_| {});
    let proxy =
        Arc::new(FaultProxy::start(servers[0].local_addr(), FaultConfig::default()).unwrap());
    let mut cfg = client_cfg(0, vec![proxy.local_addr()]);
    cfg.attempt_timeout = Duration::from_millis(200);
    cfg.heartbeat = None;
    let mut kv = KvStore::connect(cfg).unwrap();
    kv.init(
        Key(1),
        TableSpec::new(Consistency::Async, UpdaterSpec::Sum),
        &[0.0],
    )
    .unwrap();
    let p2 = proxy.clone();
    let healer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        p2.partition(false);
    });
    proxy.partition(true);
    for _ in 0..10 {
        kv.push_with(Key(1), &[1.0], PushMode::Add).unwrap();
    }
    healer.join().unwrap();
    let mut out = [0.0];
    kv.pull(Key(1), &mut out).unwrap();
    assert_eq!(out, [10.0]);
}

fn raw_exchange(
    addr: std::net::SocketAddr,
    bytes: &[u8],
    close_write: bool,
) -> (Option<Response>, bool) {
    let mut s = authed(addr, 1, Role::Worker);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(bytes).unwrap();
    if close_write {
        s.shutdown(Shutdown::Write).unwrap();
    }
    let mut body = Vec::new();
    let resp = read_frame(&mut s, DEFAULT_MAX_BODY, &mut body)
        .ok()
        .map(|h| Response::decode(&h, &body).unwrap());
    // Then the server must have closed the connection.
    let mut rest = [0u8; 16];
    let closed = matches!(s.read(&mut rest), Ok(0) | Err(_));
    (resp, closed)
}

fn code(r: &Option<Response>) -> ErrorCode {
    match r {
        Some(Response::Error(e)) => e.code,
        other => panic!("expected an Error response, got {other:?}"),
    }
}

#[test]
fn malformed_oversized_and_truncated_frames_get_typed_errors_while_others_are_served() {
    let servers = shards(1, 2, |c| c.max_body = 1 << 20);
    let addr = servers[0].local_addr();
    // A well-behaved worker keeps pushing during the abuse.
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let good = std::thread::spawn(move || {
        let mut kv = client(0, vec![addr]);
        kv.init(
            Key(1),
            TableSpec::new(Consistency::Async, UpdaterSpec::Sum),
            &[0.0],
        )
        .unwrap();
        ready_tx.send(()).unwrap();
        let mut n = 0;
        while !s2.load(Ordering::SeqCst) || n < 20 {
            kv.push_with(Key(1), &[1.0], PushMode::Add).unwrap();
            n += 1;
        }
        let mut out = [0.0];
        kv.pull(Key(1), &mut out).unwrap();
        assert_eq!(out, [n as f32]);
    });
    let mut frame = Vec::new();
    Request::Stats.encode(9, &mut frame);
    // Bad magic.
    let mut b = frame.clone();
    b[0] = b'X';
    let (r, closed) = raw_exchange(addr, &b, false);
    assert_eq!(code(&r), ErrorCode::BadMagic);
    assert!(closed);
    // Unknown version, unknown opcode.
    let mut b = frame.clone();
    b[4] = 9;
    assert_eq!(
        code(&raw_exchange(addr, &b, false).0),
        ErrorCode::UnknownVersion
    );
    let mut b = frame.clone();
    b[5] = 0x33;
    assert_eq!(
        code(&raw_exchange(addr, &b, false).0),
        ErrorCode::UnknownOpcode
    );
    // Oversized: refused from the header alone.
    let mut b = frame[..HEADER_LEN].to_vec();
    b[8..12].copy_from_slice(&(2u32 << 20).to_le_bytes());
    let (r, closed) = raw_exchange(addr, &b, false);
    assert_eq!(code(&r), ErrorCode::Oversized);
    assert!(closed);
    // Truncated: a push whose body stops early, then EOF.
    let mut push = Vec::new();
    Request::Push(gradwire_ps::wire::Push {
        worker: WorkerId(1),
        incarnation: 1,
        seq: 0,
        chunk: ChunkId {
            key: Key(1),
            index: 0,
        },
        clock: 0,
        mode: PushMode::Add,
        encoding: gradwire_ps::wire::Encoding::Dense,
        payload: vec![0; 4],
    })
    .encode(3, &mut push);
    let (r, _) = raw_exchange(addr, &push[..push.len() - 3], true);
    assert_eq!(code(&r), ErrorCode::Truncated);
    // Corrupt body: checksum.
    let mut b = push.clone();
    let last = b.len() - 1;
    b[last] ^= 0x40;
    assert_eq!(
        code(&raw_exchange(addr, &b, false).0),
        ErrorCode::BadChecksum
    );
    // Well-framed but inconsistent: a dense push of the wrong size is a request-level
    // error, and that connection stays up.
    // (Key 1 must exist first, or the answer is an unknown key: wait for the good worker's
    // init, which races with the probes above.)
    ready
        .recv_timeout(Duration::from_secs(30))
        .expect("the good worker initialized key 1");
    let mut bad = Vec::new();
    Request::Push(gradwire_ps::wire::Push {
        worker: WorkerId(1),
        incarnation: 1,
        seq: 0,
        chunk: ChunkId {
            key: Key(1),
            index: 0,
        },
        clock: 0,
        mode: PushMode::Add,
        encoding: gradwire_ps::wire::Encoding::Dense,
        payload: vec![0; 8],
    })
    .encode(4, &mut bad);
    let mut s = authed(addr, 1, Role::Worker);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&bad).unwrap();
    let mut body = Vec::new();
    let h = read_frame(&mut s, DEFAULT_MAX_BODY, &mut body).unwrap();
    assert!(
        matches!(Response::decode(&h, &body).unwrap(), Response::Error(e) if e.code == ErrorCode::ShapeMismatch)
    );
    s.write_all(&frame).unwrap();
    let h = read_frame(&mut s, DEFAULT_MAX_BODY, &mut body).unwrap();
    assert!(matches!(
        Response::decode(&h, &body).unwrap(),
        Response::Stats(_)
    ));
    stop.store(true, Ordering::SeqCst);
    good.join().expect("the good client was served throughout");
    assert_eq!(servers[0].shard().stats().rejected_frames, 6);
}

#[test]
fn a_checkpoint_restores_parameters_and_optimizer_state() {
    let dir = std::env::temp_dir().join(format!("gwps-ckpt-opt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = |dir: Option<std::path::PathBuf>, wal: bool| ShardConfig {
        num_workers: 1,
        dir,
        wal,
        ..ShardConfig::default()
    };
    let chunk = ChunkId {
        key: Key(1),
        index: 0,
    };
    let push = |seq: u64, g: &[f32]| {
        Request::Push(gradwire_ps::wire::Push {
            worker: WorkerId(0),
            incarnation: 1,
            seq,
            chunk,
            clock: seq,
            mode: PushMode::Grad,
            encoding: gradwire_ps::wire::Encoding::Dense,
            payload: g.iter().flat_map(|x| x.to_le_bytes()).collect(),
        })
    };
    let init = Request::Init {
        chunk,
        spec: TableSpec::new(Consistency::Async, "adam:lr=0.1".parse().unwrap()),
        values: vec![1.0, -1.0, 0.5],
    };
    let grads: Vec<Vec<f32>> = (0..8)
        .map(|s| vec![0.3 * s as f32 - 1.0, 0.7, -0.2 * s as f32])
        .collect();
    let pull = Request::Pull {
        worker: WorkerId(0),
        chunk,
        clock: 0,
        rows: None,
    };
    // Reference: one shard, never restarted.
    let reference = Shard::open(cfg(None, false)).unwrap();
    reference.handle(init.clone());
    for (s, g) in grads.iter().enumerate() {
        reference.handle(push(s as u64, g));
    }
    // Checkpoint after 3 pushes, WAL for 2 more, then a "crash" (drop) and a reopen.
    {
        let a = Shard::open(cfg(Some(dir.clone()), true)).unwrap();
        a.handle(init.clone());
        for (s, g) in grads.iter().enumerate().take(3) {
            a.handle(push(s as u64, g));
        }
        a.checkpoint().unwrap();
        for (s, g) in grads.iter().enumerate().take(5).skip(3) {
            a.handle(push(s as u64, g));
        }
    }
    let b = Shard::open(cfg(Some(dir.clone()), true)).unwrap();
    assert_eq!(b.stats().replayed, 2);
    // A resent push (seq 4) is recognized after the restart; the rest continue.
    for (s, g) in grads.iter().enumerate().skip(4) {
        b.handle(push(s as u64, g));
    }
    assert_eq!(b.stats().duplicates, 1);
    assert_eq!(
        b.handle(pull.clone()),
        reference.handle(pull.clone()),
        "Adam m, v, t restored"
    );
    // Checkpoint only (no WAL): nothing past the checkpoint, but the checkpoint is exact.
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_stalled_or_slowloris_peer_is_dropped_by_the_frame_deadline() {
    let mut cfg = gradwire_ps::ServerConfig::loopback(ShardConfig::default());
    cfg.frame_timeout = Duration::from_millis(300);
    let server = gradwire_ps::Server::start(cfg).unwrap();
    let mut frame = Vec::new();
    Request::Stats.encode(1, &mut frame);
    let mut s = authed(server.local_addr(), 0, Role::Worker);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // One byte every 100 ms: each read succeeds, but the whole frame misses its deadline.
    let t0 = std::time::Instant::now();
    let mut closed = false;
    for b in &frame {
        if s.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        if t0.elapsed() > Duration::from_secs(5) {
            break;
        }
    }
    if !closed {
        let mut buf = [0u8; 64];
        closed = matches!(s.read(&mut buf), Ok(0) | Err(_));
    }
    assert!(closed, "the server closed the slow connection");
    assert!(t0.elapsed() < Duration::from_secs(8));
    // The server still serves others.
    let mut kv = client(0, vec![server.local_addr()]);
    kv.init(
        Key(1),
        TableSpec::new(Consistency::Async, UpdaterSpec::Sum),
        &[0.0],
    )
    .unwrap();
}
