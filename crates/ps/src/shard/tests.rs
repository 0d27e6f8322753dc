//! Dedup window bounds and checkpoint/WAL decoding of one shard.

use super::*;
use crate::spec::{Key, PushMode, TableSpec, WorkerId};
use crate::wire::{Encoding, Push};

fn sample_checkpoint() -> Vec<u8> {
    let shard = Shard::open(ShardConfig {
        num_workers: 2,
        ..ShardConfig::default()
    })
    .unwrap();
    let chunk = ChunkId {
        key: Key(3),
        index: 0,
    };
    shard.handle(Request::Init {
        chunk,
        spec: TableSpec::new(Consistency::Sync, "adam:lr=0.1".parse().unwrap()),
        values: vec![1.0, 2.0],
    });
    shard.handle(Request::Push(Push {
        worker: WorkerId(1),
        incarnation: 3,
        seq: 0,
        chunk,
        clock: 0,
        mode: PushMode::Grad,
        encoding: Encoding::Dense,
        payload: [0.5f32, -0.5]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
    }));
    let st = shard.lock();
    shard.snapshot(&st)
}

#[test]
fn dedup_state_stays_within_the_window() {
    let shard = Shard::open(ShardConfig {
        num_workers: 1,
        dedup_window: 64,
        ..ShardConfig::default()
    })
    .unwrap();
    let chunk = ChunkId {
        key: Key(1),
        index: 0,
    };
    shard.handle(Request::Init {
        chunk,
        spec: TableSpec::new(Consistency::Async, crate::UpdaterSpec::Sum),
        values: vec![0.0],
    });
    let push = |seq: u64| {
        Request::Push(Push {
            worker: WorkerId(0),
            incarnation: 1,
            seq,
            chunk,
            clock: 0,
            mode: PushMode::Add,
            encoding: Encoding::Dense,
            payload: 1f32.to_le_bytes().to_vec(),
        })
    };
    // 10,000 pushes, each block of 50 in scrambled order, each sent twice.
    for block in 0..200u64 {
        for i in 0..50u64 {
            let seq = block * 50 + (i * 37) % 50;
            shard.handle(push(seq));
            shard.handle(push(seq));
            let st = shard.lock();
            assert!(st.workers[0].above.len() <= 64);
        }
    }
    let st = shard.lock();
    assert_eq!((st.workers[0].base, st.workers[0].above.len()), (10_000, 0));
    assert_eq!(st.chunks[&chunk].values, vec![10_000.0]);
    assert_eq!(st.stats.duplicates, 10_000);
    drop(st);
    match shard.handle(push(10_000 + 64)) {
        Response::Error(e) => assert_eq!(e.code, ErrorCode::WindowExceeded),
        other => panic!("{other:?}"),
    }
}

#[test]
fn checkpoint_body_round_trips_and_every_truncation_is_refused() {
    let body = sample_checkpoint();
    check_checkpoint_body(2, &body).unwrap();
    for cut in 0..body.len() {
        assert!(check_checkpoint_body(2, &body[..cut]).is_err(), "cut {cut}");
    }
    assert!(
        check_checkpoint_body(3, &body).is_err(),
        "worker count differs"
    );
}

proptest::proptest! {
    #[test]
    fn checkpoint_and_wal_decoders_never_panic(
        flips in proptest::collection::vec((0usize..400, proptest::num::u8::ANY), 0..6),
        noise in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
    ) {
        let mut body = sample_checkpoint();
        for (i, x) in flips {
            let n = body.len();
            body[i % n] ^= x;
        }
        let _ = check_checkpoint_body(2, &body);
        let _ = check_checkpoint_body(2, &noise);
        check_wal_bytes(2, &noise);
        // A WAL of well-framed records with random bodies.
        let mut wal = Vec::new();
        for rec in [&body[..], &noise[..]] {
            wal.extend_from_slice(&(rec.len() as u32).to_le_bytes());
            wal.extend_from_slice(&crc32fast::hash(rec).to_le_bytes());
            wal.extend_from_slice(rec);
        }
        check_wal_bytes(2, &wal);
    }
}
