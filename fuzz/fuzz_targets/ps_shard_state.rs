#![no_main]
//! Stateful fuzzing of one shard: the input is a sequence of requests, each from one of
//! several peers (workers 0-2, the coordinator, the trusted in-process caller), against one
//! sans-IO shard with small limits and millisecond waits. After every request it checks:
//! - the shard answered (nothing panicked);
//! - a request naming another worker than its peer's was refused with `PermissionDenied`;
//! - a push that was applied, sent again unchanged, changes no value (exactly once);
//! - a table never changes length once created, and holds only finite values;
//! - the elements held stay within the shard's limit.
use std::collections::HashMap;
use std::time::Duration;

use gradwire_ps::wire::{Encoding, ErrorCode, Push, Request, Response, VecOp};
use gradwire_ps::{
    ChunkId, Consistency, Key, Limits, Peer, PushMode, Role, Shard, ShardConfig, TableSpec,
    UpdaterSpec, WorkerId,
};
use libfuzzer_sys::fuzz_target;

const MAX_ELEMENTS: usize = 256;

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn small(&mut self, n: u8) -> Option<u8> {
        self.byte().map(|b| b % n)
    }
    fn f32s(&mut self, n: usize) -> Option<Vec<f32>> {
        (0..n)
            .map(|_| self.byte().map(|b| (b as f32 - 128.0) / 16.0))
            .collect()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b.to_vec()
    }
}

fn spec(i: u8) -> TableSpec {
    let s = match i % 6 {
        0 => TableSpec::new(Consistency::Async, UpdaterSpec::Sum),
        1 => TableSpec::new(Consistency::Sync, UpdaterSpec::Sgd { lr: 0.5 }),
        2 => TableSpec::new(Consistency::Ssp { staleness: 1 }, UpdaterSpec::Sum),
        3 => TableSpec::new(Consistency::Async, "adam:lr=0.1".parse().unwrap()),
        4 => TableSpec::new(Consistency::Async, "adagrad:lr=0.1".parse().unwrap())
            .with_codec("2bit".parse().unwrap()),
        _ => TableSpec::new(Consistency::Async, UpdaterSpec::Sum)
            .with_codec("qsgd:bits=4".parse().unwrap()),
    };
    if i >= 128 {
        s.with_row_len(2)
    } else {
        s
    }
}

/// The values of `chunk`, read by the trusted caller (`None` when it cannot be read now).
fn peek(shard: &Shard, chunk: ChunkId) -> Option<Vec<f32>> {
    match shard.handle(Request::Pull {
        worker: WorkerId(0),
        chunk,
        clock: 0,
        rows: None,
    }) {
        Response::Values { values, .. } => Some(values),
        _ => None,
    }
}

/// The worker a request names, if any.
fn named(req: &Request) -> Option<WorkerId> {
    match req {
        Request::Hello { worker, .. }
        | Request::Heartbeat { worker, .. }
        | Request::Leave { worker, .. }
        | Request::Pull { worker, .. } => Some(*worker),
        Request::Push(p) | Request::PushPull(p) => Some(p.worker),
        _ => None,
    }
}

fn one(shard: &Shard, inp: &mut Input<'_>, lens: &mut HashMap<ChunkId, usize>) -> Option<()> {
    let op = inp.byte()?;
    let peer = match inp.small(5)? {
        w @ 0..=2 => Some(Peer {
            worker: WorkerId(w as u32),
            role: Role::Worker,
        }),
        3 => Some(Peer {
            worker: WorkerId(0),
            role: Role::Coordinator,
        }),
        _ => None,
    };
    let worker = WorkerId(inp.small(4)? as u32);
    let chunk = ChunkId {
        key: Key(inp.small(3)? as u64),
        index: inp.small(2)? as u32,
    };
    let incarnation = inp.small(3)? as u64;
    let slot = |b: u8| [0u64, 1, 2, 1 << 32, 1 << 33][(b % 5) as usize];
    let req = match op % 11 {
        0 => Request::Hello {
            worker,
            incarnation,
        },
        1 => Request::Heartbeat {
            worker,
            incarnation,
        },
        2 => Request::Leave {
            worker,
            incarnation,
        },
        3 => {
            let s = spec(inp.byte()?);
            let n = inp.small(24)? as usize;
            Request::Init {
                chunk,
                spec: s,
                values: inp.f32s(n)?,
            }
        }
        4 | 5 => {
            let mode = match inp.small(3)? {
                0 => PushMode::Grad,
                1 => PushMode::Add,
                _ => PushMode::Assign,
            };
            let (encoding, payload) = match inp.small(3)? {
                0 => {
                    let n = inp.small(24)? as usize;
                    let v = inp.f32s(n)?;
                    (
                        Encoding::Dense,
                        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    )
                }
                1 => {
                    let n = inp.small(64)? as usize;
                    (Encoding::TwoBit, inp.bytes(n))
                }
                _ => {
                    let n = inp.small(64)? as usize;
                    (Encoding::Codec, inp.bytes(n))
                }
            };
            let p = Push {
                worker,
                incarnation,
                seq: inp.small(20)? as u64,
                chunk,
                clock: 0,
                mode,
                encoding,
                payload,
            };
            if op % 11 == 4 {
                Request::Push(p)
            } else {
                Request::PushPull(p)
            }
        }
        6 => {
            let rows = match inp.small(3)? {
                0 => None,
                k => Some(
                    (0..k * 3)
                        .map(|_| inp.small(8).map(u32::from))
                        .collect::<Option<Vec<u32>>>()?,
                ),
            };
            Request::Pull {
                worker,
                chunk,
                clock: inp.small(3)? as u64,
                rows,
            }
        }
        7 => Request::Stats,
        8 => {
            let (a, b, c) = (slot(inp.byte()?), slot(inp.byte()?), slot(inp.byte()?));
            let alpha = (inp.byte()? as f32 - 128.0) / 8.0;
            Request::VecOp(match inp.small(3)? {
                0 => VecOp::Dot { a, b },
                1 => VecOp::Axpy { a, b, c, alpha },
                _ => VecOp::Scale { a, c, alpha },
            })
        }
        9 => {
            let n = inp.small(24)? as usize;
            Request::SetVec {
                slot: slot(inp.byte()?),
                chunk,
                values: inp.f32s(n)?,
            }
        }
        _ => Request::Checkpoint,
    };
    let before = peek(shard, chunk);
    let resp = shard.handle_from(peer.as_ref(), req.clone());
    if let (Some(p), Some(w)) = (peer, named(&req)) {
        if w != p.worker {
            match &resp {
                Response::Error(e) => assert_eq!(e.code, ErrorCode::PermissionDenied, "{req:?}"),
                other => panic!("{req:?} from {p:?} answered {other:?}"),
            }
        }
    }
    // Exactly once: an applied push, resent unchanged, changes nothing.
    if let (Request::Push(_), Response::Ok { .. }) = (&req, &resp) {
        let after = peek(shard, chunk);
        if after.is_some() && after != before {
            let _ = shard.handle_from(peer.as_ref(), req.clone());
            let again = peek(shard, chunk);
            if again.is_some() {
                assert_eq!(
                    again
                        .as_ref()
                        .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                    after
                        .as_ref()
                        .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()),
                    "a resent push changed {chunk}"
                );
            }
        }
    }
    // Tables keep their length and finite values; the shard stays within its limit.
    let mut held = 0;
    for key in 0..3 {
        for index in 0..2 {
            let id = ChunkId {
                key: Key(key),
                index,
            };
            if let Some(v) = peek(shard, id) {
                assert!(v.iter().all(|x| x.is_finite()), "{id}: {v:?}");
                let n = *lens.entry(id).or_insert(v.len());
                assert_eq!(v.len(), n, "{id} changed length");
                held += v.len();
            }
        }
    }
    assert!(held <= MAX_ELEMENTS, "{held} elements held");
    Some(())
}

fuzz_target!(|data: &[u8]| {
    let shard = Shard::open(ShardConfig {
        num_workers: 3,
        heartbeat_timeout: Duration::from_millis(5),
        max_wait: Duration::from_millis(1),
        dedup_window: 16,
        limits: Limits {
            max_chunks: 4,
            max_elements: MAX_ELEMENTS,
            max_vectors: 4,
            ..Limits::default()
        },
        ..ShardConfig::default()
    })
    .expect("a shard in memory opens");
    let mut inp = Input(data);
    let mut lens = HashMap::new();
    while one(&shard, &mut inp, &mut lens).is_some() {}
});
