//! Throughput of push_pull rounds: 4 workers, 2 shards, loopback TCP, sync SGD.
//!
//! `cargo bench -p gradwire-ps --bench ps_throughput`
//!
//! Prints ms per push_pull round for a LeNet-sized model (62k f32) and a 16 MiB model
//! (4 Mi f32), in sync and async mode, then micro-timings of the pieces a round is made of.
#![allow(missing_docs)] // a bench binary: nothing here is API

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use gradwire_ps::wire::{read_frame, Encoding, Push, Request, DEFAULT_MAX_BODY};
use gradwire_ps::{
    ChunkId, ClientConfig, Consistency, Key, KvStore, PushMode, Server, ServerConfig, ShardConfig,
    TableSpec, UpdaterSpec, WorkerId,
};

const WORKERS: usize = 4;
const SHARDS: usize = 2;

fn round_ms(len: usize, consistency: Consistency, rounds: usize, wal: bool) -> f64 {
    let dir = std::env::temp_dir().join(format!("gwps-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let servers: Vec<Server> = (0..SHARDS)
        .map(|i| {
            Server::start(ServerConfig::loopback(ShardConfig {
                shard_id: i as u32,
                num_workers: WORKERS as u32,
                max_wait: Duration::from_secs(60),
                dir: wal.then(|| dir.clone()),
                wal,
                ..ShardConfig::default()
            }))
            .unwrap()
        })
        .collect();
    let addrs: Vec<_> = servers.iter().map(|s| s.local_addr()).collect();
    let barrier = Arc::new(Barrier::new(WORKERS));
    let handles: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (addrs, barrier) = (addrs.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut kv =
                    KvStore::connect(ClientConfig::new(WorkerId(w as u32), addrs)).unwrap();
                let spec = TableSpec::new(consistency, UpdaterSpec::Sgd { lr: 0.01 });
                kv.init(Key(0), spec, &vec![0.0; len]).unwrap();
                let g = vec![0.001f32; len];
                let mut out = vec![0.0f32; len];
                for _ in 0..3 {
                    kv.push_pull(Key(0), &g, &mut out).unwrap();
                }
                barrier.wait();
                let t = Instant::now();
                for _ in 0..rounds {
                    kv.push_pull(Key(0), &g, &mut out).unwrap();
                }
                let ms = t.elapsed().as_secs_f64() * 1e3 / rounds as f64;
                kv.leave().unwrap();
                ms
            })
        })
        .collect();
    let ms: Vec<f64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    drop(servers);
    let _ = std::fs::remove_dir_all(&dir);
    ms.iter().sum::<f64>() / ms.len() as f64
}

fn micro(len: usize) {
    let g = vec![0.001f32; len];
    let n = 10;
    let t = Instant::now();
    let mut frame = Vec::new();
    for _ in 0..n {
        let mut payload = Vec::with_capacity(4 * len);
        payload.extend_from_slice(bytemuck::cast_slice(&g));
        Request::Push(Push {
            worker: WorkerId(0),
            incarnation: 1,
            seq: 0,
            chunk: ChunkId {
                key: Key(0),
                index: 0,
            },
            clock: 0,
            mode: PushMode::Grad,
            encoding: Encoding::Dense,
            payload,
        })
        .encode(1, &mut frame);
    }
    let enc = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    let t = Instant::now();
    let mut body = Vec::new();
    for _ in 0..n {
        let h = read_frame(&mut &frame[..], DEFAULT_MAX_BODY, &mut body).unwrap();
        let _ = Request::decode(&h, &body).unwrap();
    }
    let dec = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(crc32fast::hash(&frame));
    }
    let crc = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    let mut w = vec![0.0f32; len];
    let mut st = gradwire_ps::OptState::default();
    let t = Instant::now();
    for _ in 0..n {
        gradwire_ps::apply_update(&UpdaterSpec::Sgd { lr: 0.01 }, &mut st, &mut w, &g);
    }
    let upd = t.elapsed().as_secs_f64() * 1e3 / n as f64;
    println!(
        "  pieces for one {len}-float message: encode {enc:.3} ms, read+crc+decode {dec:.3} ms (crc alone {crc:.3} ms), sgd apply {upd:.3} ms"
    );
}

fn main() {
    for (name, len, rounds) in [
        ("LeNet-sized (62k f32)", 62_006usize, 50usize),
        ("16 MiB (4 Mi f32)", 4 << 20, 8),
    ] {
        for (c, wal) in [
            (Consistency::Sync, false),
            (Consistency::Async, false),
            (Consistency::Sync, true),
        ] {
            let ms = round_ms(len, c, rounds, wal);
            let c = if wal {
                format!("{c} + fsynced WAL")
            } else {
                c.to_string()
            };
            let bytes = (2 * WORKERS * len * 4) as f64;
            println!(
                "{name}, {c}: {ms:.2} ms per push_pull round ({:.2} GB/s of f32 through the shards)",
                bytes / (ms * 1e-3) / 1e9
            );
        }
        micro(len);
    }
}
