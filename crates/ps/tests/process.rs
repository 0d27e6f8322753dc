//! A real shard process is SIGKILLed mid-run and restarted on the same port and directory:
//! with the write-ahead log, no acknowledged push is lost and none is applied twice.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gradwire_ps::fault::ShardProcess;
use gradwire_ps::{
    ClientConfig, Consistency, Key, KvStore, PushMode, TableSpec, UpdaterSpec, WorkerId,
};

const BIN: &str = env!("CARGO_BIN_EXE_gradwire-ps-server");

fn spawn(listen: &str, dir: &std::path::Path, checkpoint_every_ms: Option<u64>) -> ShardProcess {
    let mut args: Vec<String> = [
        "--listen",
        listen,
        "--workers",
        "2",
        "--dir",
        dir.to_str().unwrap(),
        "--wal",
        "--heartbeat-timeout",
        "10",
        "--max-wait",
        "10",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(ms) = checkpoint_every_ms {
        let s = ms as f64 / 1000.0;
        args.extend(["--checkpoint-every".to_string(), s.to_string()]);
    }
    ShardProcess::spawn(BIN.as_ref(), &args).expect("shard process starts")
}

fn kill_and_restart(consistency: Consistency, checkpoint_every_ms: Option<u64>) {
    const N: u64 = 40;
    let dir = std::env::temp_dir().join(format!(
        "gwps-proc-{}-{consistency}-{checkpoint_every_ms:?}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut shard = spawn("127.0.0.1:0", &dir, checkpoint_every_ms);
    let addr = shard.addr();
    let acked = Arc::new(AtomicU64::new(0));
    let spec = TableSpec::new(consistency, UpdaterSpec::Sum);
    let workers: Vec<_> = (0..2u32)
        .map(|w| {
            let acked = acked.clone();
            let spec = spec.clone();
            std::thread::spawn(move || {
                let mut cfg = ClientConfig::new(WorkerId(w), vec![addr]);
                cfg.attempt_timeout = Duration::from_millis(500);
                cfg.deadline = Duration::from_secs(30);
                cfg.heartbeat = Some(Duration::from_millis(100));
                let mut kv = KvStore::connect(cfg).unwrap();
                kv.init(Key(1), spec, &[0.0, 0.0]).unwrap();
                let mut v = [0.0f32; 2];
                v[w as usize] = 1.0;
                let mut out = [0.0f32; 2];
                for t in 1..=N {
                    kv.push_pull_with(Key(1), &v, PushMode::Add, &mut out)
                        .unwrap();
                    acked.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(
                        out[w as usize], t as f32,
                        "worker {w} step {t}: own pushes exactly once"
                    );
                    if consistency == Consistency::Sync {
                        assert_eq!(out, [t as f32, t as f32]);
                    }
                }
                kv.leave().unwrap();
            })
        })
        .collect();
    let t0 = Instant::now();
    while acked.load(Ordering::SeqCst) < N / 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "workers made no progress"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    shard.kill();
    let before = acked.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(200));
    let shard2 = spawn(&addr.to_string(), &dir, checkpoint_every_ms);
    for w in workers {
        w.join().expect("worker survives the restart");
    }
    assert!(before < 2 * N, "the kill happened mid-run");
    let mut cfg = ClientConfig::new(WorkerId(0), vec![shard2.addr()]);
    cfg.heartbeat = None;
    let mut kv = KvStore::connect(cfg).unwrap();
    kv.init(Key(1), spec, &[0.0, 0.0]).unwrap();
    let mut out = [0.0f32; 2];
    kv.pull(Key(1), &mut out).unwrap();
    assert_eq!(
        out,
        [N as f32, N as f32],
        "every acknowledged push, exactly once"
    );
    drop(shard2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_and_restart_async_loses_nothing_with_the_wal() {
    kill_and_restart(Consistency::Async, None);
}

#[test]
fn sigkill_and_restart_with_periodic_checkpoints_and_the_wal_loses_nothing() {
    kill_and_restart(Consistency::Async, Some(5));
}

#[test]
fn sigkill_and_restart_sync_loses_nothing_with_the_wal() {
    kill_and_restart(Consistency::Sync, Some(20));
}
