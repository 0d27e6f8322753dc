//! Durability: a torn append or a failed fsync (injected) is never acknowledged and never
//! costs a later acknowledged push; a WAL damaged in the middle is refused, not cut; the
//! WAL rotates into checkpoints; Sandblaster's vector ops and scratch vectors survive a
//! restart.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gradwire_ps::durability::WalFaults;
use gradwire_ps::wire::{Encoding, ErrorCode, Push, Request, Response, VecOp};
use gradwire_ps::{
    ChunkId, Consistency, Key, KvStore, PushMode, Server, ServerConfig, Shard, ShardConfig,
    TableSpec, UpdaterSpec, WorkerId,
};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gwps-dur-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn cfg(dir: &Path, faults: Option<Arc<WalFaults>>) -> ShardConfig {
    ShardConfig {
        num_workers: 1,
        dir: Some(dir.to_path_buf()),
        wal: true,
        wal_faults: faults,
        max_wait: Duration::from_secs(2),
        ..ShardConfig::default()
    }
}

fn chunk(key: u64) -> ChunkId {
    ChunkId {
        key: Key(key),
        index: 0,
    }
}

fn add(seq: u64, v: f32) -> Request {
    Request::Push(Push {
        worker: WorkerId(0),
        incarnation: 1,
        seq,
        chunk: chunk(1),
        clock: 0,
        mode: PushMode::Add,
        encoding: Encoding::Dense,
        payload: v.to_le_bytes().to_vec(),
    })
}

fn value(shard: &Shard, key: u64) -> Vec<f32> {
    match shard.handle(Request::Pull {
        worker: WorkerId(0),
        chunk: chunk(key),
        clock: 0,
        rows: None,
    }) {
        Response::Values { values, .. } => values,
        other => panic!("{other:?}"),
    }
}

fn init(shard: &Shard) {
    let r = shard.handle(Request::Init {
        chunk: chunk(1),
        spec: TableSpec::new(Consistency::Async, UpdaterSpec::Sum),
        values: vec![0.0],
    });
    assert!(matches!(r, Response::Ok { .. }), "{r:?}");
}

#[test]
fn a_torn_append_or_a_failed_fsync_loses_no_acknowledged_push_through_a_restart() {
    let d = dir("torn");
    let faults = Arc::new(WalFaults::new());
    let mut server = ServerConfig::loopback(cfg(&d, Some(faults.clone())));
    server.shard.num_workers = 1;
    let srv = Server::start(server).unwrap();
    let mut c = common::client_cfg(0, vec![srv.local_addr()]);
    c.heartbeat = None;
    let mut kv = KvStore::connect(c).unwrap();
    kv.init(
        Key(1),
        TableSpec::new(Consistency::Async, UpdaterSpec::Sum),
        &[0.0],
    )
    .unwrap();
    const N: usize = 30;
    for i in 0..N {
        match i {
            5 => faults.tear_writes(1),
            12 => faults.fail_syncs(1),
            // The push fails, and so do the repair right after it and the one before its
            // resend.
            20 => faults.fail_syncs(3),
            _ => {}
        }
        kv.push_with(Key(1), &[1.0], PushMode::Add).unwrap();
    }
    let stats = srv.shard().stats();
    assert_eq!(
        stats.request_errors, 4,
        "each injected failure refused a push"
    );
    assert_eq!(stats.applied, N as u64);
    drop(kv);
    drop(srv);
    // A restart replays the log: every acknowledged push, once.
    let shard = Shard::open(cfg(&d, None)).unwrap();
    assert_eq!(value(&shard, 1), vec![N as f32]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn while_the_wal_cannot_be_made_durable_nothing_is_acknowledged() {
    let d = dir("nosync");
    let faults = Arc::new(WalFaults::new());
    let shard = Shard::open(cfg(&d, Some(faults.clone()))).unwrap();
    init(&shard);
    assert!(matches!(shard.handle(add(0, 1.0)), Response::Ok { .. }));
    faults.fail_syncs(u32::MAX);
    for seq in 1..6 {
        match shard.handle(add(seq, 10.0)) {
            Response::Error(e) => assert_eq!(e.code, ErrorCode::Durability),
            other => panic!("acknowledged while the WAL fails: {other:?}"),
        }
    }
    // Reads go on; the refused pushes were never applied.
    assert_eq!(value(&shard, 1), vec![1.0]);
    faults.fail_syncs(0);
    assert!(matches!(shard.handle(add(6, 100.0)), Response::Ok { .. }));
    assert_eq!(value(&shard, 1), vec![101.0]);
    drop(shard);
    let shard = Shard::open(cfg(&d, None)).unwrap();
    assert_eq!(value(&shard, 1), vec![101.0]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_wal_damaged_in_the_middle_is_refused_and_left_as_it_is() {
    let d = dir("middle");
    {
        let shard = Shard::open(cfg(&d, None)).unwrap();
        init(&shard);
        for seq in 0..5 {
            assert!(matches!(shard.handle(add(seq, 1.0)), Response::Ok { .. }));
        }
    }
    let wal = d.join("shard-0.wal");
    let mut bytes = std::fs::read(&wal).unwrap();
    // Records: hello is not logged here; init, then five pushes. Damage the third push.
    let mut pos = 0;
    for _ in 0..3 {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        pos += 8 + len;
    }
    bytes[pos + 20] ^= 0x55;
    std::fs::write(&wal, &bytes).unwrap();
    assert!(
        Shard::open(cfg(&d, None)).is_err(),
        "opened by cutting acknowledged pushes"
    );
    assert_eq!(std::fs::read(&wal).unwrap(), bytes, "the file is untouched");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_wal_rotates_into_checkpoints_by_size_and_a_restart_loses_nothing() {
    let d = dir("rotate");
    let mut c = cfg(&d, None);
    c.wal_rotate_bytes = 4096;
    {
        let shard = Shard::open(c.clone()).unwrap();
        init(&shard);
        for seq in 0..500 {
            assert!(matches!(shard.handle(add(seq, 1.0)), Response::Ok { .. }));
            let len = std::fs::metadata(d.join("shard-0.wal")).unwrap().len();
            assert!(len <= 4096 + 256, "WAL of {len} bytes");
        }
    }
    assert!(d.join("shard-0.ckpt").exists());
    let shard = Shard::open(c).unwrap();
    assert_eq!(value(&shard, 1), vec![500.0]);
    assert!(
        shard.stats().replayed < 100,
        "most of it from the checkpoint"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn sandblaster_vector_ops_and_scratch_vectors_survive_a_restart() {
    let d = dir("vecops");
    let slot = 1u64 << 33;
    let dot = |shard: &Shard| match shard.handle(Request::VecOp(VecOp::Dot { a: 1, b: slot })) {
        Response::Ok { value } => f64::from_bits(value),
        other => panic!("{other:?}"),
    };
    let (before, dot_before) = {
        let shard = Shard::open(cfg(&d, None)).unwrap();
        let r = shard.handle(Request::Init {
            chunk: chunk(1),
            spec: TableSpec::new(Consistency::Async, UpdaterSpec::Sum),
            values: vec![1.0, 2.0, 3.0],
        });
        assert!(matches!(r, Response::Ok { .. }));
        let set = Request::SetVec {
            slot,
            chunk: chunk(1),
            values: vec![0.5, -1.0, 2.0],
        };
        assert_eq!(shard.handle(set), Response::Ok { value: 0 });
        let axpy = |alpha| {
            Request::VecOp(VecOp::Axpy {
                a: 1,
                b: slot,
                c: 1,
                alpha,
            })
        };
        assert_eq!(shard.handle(axpy(2.0)), Response::Ok { value: 0 });
        shard.checkpoint().unwrap();
        assert_eq!(shard.handle(axpy(-0.5)), Response::Ok { value: 0 });
        (value(&shard, 1), dot(&shard))
    };
    assert_eq!(before, vec![1.75, 0.5, 6.0]);
    let shard = Shard::open(cfg(&d, None)).unwrap();
    assert_eq!(
        value(&shard, 1),
        before,
        "the table, from checkpoint and WAL"
    );
    assert_eq!(
        dot(&shard),
        dot_before,
        "the scratch vector, from the checkpoint"
    );
    std::fs::remove_dir_all(&d).unwrap();
}
