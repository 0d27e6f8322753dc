//! Round trips, truncations, corruptions and lying counts of every PS message.

use super::encode::{begin, end};
use super::*;

fn examples() -> Vec<Request> {
    let push = Push {
        worker: WorkerId(3),
        incarnation: 7,
        seq: 9,
        chunk: ChunkId {
            key: Key(5),
            index: 1,
        },
        clock: 4,
        mode: PushMode::Add,
        encoding: Encoding::Dense,
        payload: vec![0, 0, 128, 63, 0, 0, 0, 64],
    };
    vec![
        Request::Hello {
            worker: WorkerId(1),
            incarnation: 2,
        },
        Request::Heartbeat {
            worker: WorkerId(1),
            incarnation: 2,
        },
        Request::Leave {
            worker: WorkerId(1),
            incarnation: 2,
        },
        Request::Init {
            chunk: push.chunk,
            spec: TableSpec::new(
                Consistency::Ssp { staleness: 3 },
                "adam:lr=0.01".parse().unwrap(),
            )
            .with_codec("topk:ratio=0.1".parse().unwrap())
            .with_dead_policy(DeadPolicy::Shrink)
            .with_row_len(4),
            values: vec![1.0, 2.0, 3.0, 4.0],
        },
        Request::Push(push.clone()),
        Request::PushPull(push),
        Request::Pull {
            worker: WorkerId(0),
            chunk: ChunkId {
                key: Key(1),
                index: 0,
            },
            clock: 3,
            rows: Some(vec![0, 5, 2]),
        },
        Request::Pull {
            worker: WorkerId(0),
            chunk: ChunkId {
                key: Key(1),
                index: 0,
            },
            clock: 0,
            rows: None,
        },
        Request::Checkpoint,
        Request::Stats,
        Request::VecOp(VecOp::Axpy {
            a: 1,
            b: 1 << 33,
            c: 1 << 34,
            alpha: -0.5,
        }),
        Request::SetVec {
            slot: 1 << 32,
            chunk: ChunkId {
                key: Key(1),
                index: 0,
            },
            values: vec![0.5],
        },
    ]
}

fn responses() -> Vec<Response> {
    vec![
        Response::Ok { value: 42 },
        Response::Values {
            round: 1,
            min_clock: 2,
            values: vec![1.5, -2.0],
        },
        Response::Stats(vec![1, 2, 3]),
        Response::Error(RemoteError {
            code: ErrorCode::WorkerLost,
            worker: Some(2),
            value: 5,
            message: "worker 2 died".into(),
        }),
    ]
}

fn split(frame: &[u8]) -> (FrameHeader, &[u8]) {
    let h = FrameHeader::decode(frame, DEFAULT_MAX_BODY).unwrap();
    (h, &frame[HEADER_LEN..])
}

#[test]
fn every_message_round_trips() {
    let mut buf = Vec::new();
    for r in examples() {
        r.encode(77, &mut buf);
        let (h, body) = split(&buf);
        assert_eq!(h.rid, 77);
        assert_eq!(Request::decode(&h, body).unwrap(), r);
    }
    for r in responses() {
        r.encode(5, &mut buf);
        let (h, body) = split(&buf);
        assert_eq!(Response::decode(&h, body).unwrap(), r);
    }
}

#[test]
fn every_truncation_is_a_typed_error() {
    let mut buf = Vec::new();
    for r in examples() {
        r.encode(1, &mut buf);
        for cut in 0..buf.len() {
            let res = read_frame(&mut &buf[..cut], DEFAULT_MAX_BODY, &mut Vec::new());
            match res {
                Err(ReadError::Closed) => assert_eq!(cut, 0),
                Err(ReadError::Wire(_)) => {}
                other => panic!("{r:?} cut at {cut}: {other:?}"),
            }
            if cut >= HEADER_LEN {
                let (h, _) = split(&buf);
                assert!(Request::decode(&h, &buf[HEADER_LEN..cut]).is_err());
            }
        }
    }
}

#[test]
fn header_refuses_bad_magic_version_opcode_flags_and_oversize() {
    let mut buf = Vec::new();
    Request::Stats.encode(1, &mut buf);
    let mut b = buf.clone();
    b[0] ^= 1;
    assert!(matches!(
        FrameHeader::decode(&b, 100),
        Err(WireError::BadMagic { .. })
    ));
    let mut b = buf.clone();
    b[4] = 2;
    assert_eq!(
        FrameHeader::decode(&b, 100),
        Err(WireError::UnknownVersion { found: 2 })
    );
    let mut b = buf.clone();
    b[5] = 0x40;
    assert_eq!(
        FrameHeader::decode(&b, 100),
        Err(WireError::UnknownOpcode { found: 0x40 })
    );
    let mut b = buf.clone();
    b[6] = 1;
    assert!(matches!(
        FrameHeader::decode(&b, 100),
        Err(WireError::BadField { .. })
    ));
    let mut b = buf.clone();
    b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        FrameHeader::decode(&b, 100),
        Err(WireError::Oversized {
            len: u32::MAX as u64,
            max: 100
        })
    );
    // An oversized frame is refused by read_frame before the body is allocated.
    let mut body = Vec::new();
    assert!(matches!(
        read_frame(&mut &b[..], 100, &mut body),
        Err(ReadError::Wire(WireError::Oversized { .. }))
    ));
    assert_eq!(body.capacity(), 0);
}

#[test]
fn bit_flips_in_the_body_fail_the_checksum() {
    let mut buf = Vec::new();
    for r in examples() {
        r.encode(1, &mut buf);
        for i in HEADER_LEN..buf.len() {
            let mut b = buf.clone();
            b[i] ^= 0x10;
            assert!(matches!(
                read_frame(&mut &b[..], DEFAULT_MAX_BODY, &mut Vec::new()),
                Err(ReadError::Wire(WireError::BadChecksum { .. }))
            ));
        }
    }
}

#[test]
fn lying_counts_are_refused_without_allocation() {
    // A body whose f32 count claims far more than is present (CRC made valid).
    let mut buf = Vec::new();
    Request::SetVec {
        slot: 1 << 32,
        chunk: ChunkId {
            key: Key(0),
            index: 0,
        },
        values: vec![1.0],
    }
    .encode(1, &mut buf);
    let at = HEADER_LEN + 8 + 12;
    buf[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    end(&mut buf);
    let (h, body) = split(&buf);
    assert_eq!(
        Request::decode(&h, body),
        Err(WireError::BadLength { field: "values" })
    );
}

proptest::proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200), op in 0u8..=0x90) {
        // Random bodies under a valid header for every opcode (CRC made valid).
        let mut frame = Vec::new();
        begin(&mut frame, 0, 0);
        frame[5] = op;
        frame.extend_from_slice(&bytes);
        end(&mut frame);
        if let Ok(h) = FrameHeader::decode(&frame, DEFAULT_MAX_BODY) {
            let _ = Request::decode(&h, &frame[HEADER_LEN..]);
            let _ = Response::decode(&h, &frame[HEADER_LEN..]);
        }
        let _ = read_frame(&mut &bytes[..], 1000, &mut Vec::new());
    }
}
