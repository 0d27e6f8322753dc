//! The transport section: the MPI transport's own behaviour, checked point to point.

use std::time::{Duration, Instant};

use gradwire_transport::mpi::Mpi;
use gradwire_transport::{Error, Op, Transport};

use crate::suite::Tally;

/// The transport itself: ordering, any size (eager and rendezvous), self-sends, bytes_sent,
/// size mismatch, invalid ranks, named timeouts on a stalled peer (receive and send).
pub(crate) fn transport_checks(t: &mut Mpi, k: &mut Tally) {
    let (me, n) = (t.rank(), t.world_size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let payload = |from: usize, i: usize, len: usize| -> Vec<u8> {
        (0..len).map(|j| (from * 31 + i * 7 + j) as u8).collect()
    };
    let sizes = [0usize, 1, 4095, 4096, 65_537, 3 << 20];
    let mut buf = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        if k.broken {
            return;
        }
        let before = t.bytes_sent();
        if k.res(
            "send_recv",
            t.send_recv(right, &payload(me, i, len), left, &mut buf),
        )
        .is_some()
        {
            k.eq(
                &format!("ring send_recv len {len}"),
                &buf,
                &payload(left, i, len),
            );
        }
        k.ok(
            "bytes_sent counts payload",
            t.bytes_sent() - before == len as u64,
        );
        let mut out = vec![0u8; len];
        if k.res(
            "send_recv_into",
            t.send_recv_into(left, &payload(me, i, len), right, &mut out),
        )
        .is_some()
        {
            k.eq(
                &format!("reverse send_recv_into len {len}"),
                &out,
                &payload(right, i, len),
            );
        }
        // To itself.
        if k.res(
            "self send_recv",
            t.send_recv(me, &payload(me, i, len), me, &mut buf),
        )
        .is_some()
        {
            k.eq("self send_recv", &buf, &payload(me, i, len));
        }
    }
    // Many messages in a row keep their order (sends to the right complete eagerly).
    for i in 0..5 {
        if me % 2 == 0 {
            k.res("send", t.send(right, &payload(me, i, 100)));
            k.res("recv", t.recv(left, &mut buf));
            k.eq("ordered recv", &buf, &payload(left, i, 100));
        } else {
            k.res("recv", t.recv(left, &mut buf));
            k.eq("ordered recv", &buf, &payload(left, i, 100));
            k.res("send", t.send(right, &payload(me, i, 100)));
        }
    }
    k.ok(
        "invalid rank",
        matches!(t.send(n + 3, b"x"), Err(Error::InvalidRank { rank, .. }) if rank == n + 3),
    );
    // A receive into a slice of the wrong length names the sender and consumes the message.
    k.res("send", t.send(right, &[1, 2, 3]));
    let mut two = [0u8; 2];
    let err = t.recv_into(left, &mut two);
    k.ok(
        &format!("size mismatch names rank {left}: {err:?}"),
        matches!(err, Err(Error::SizeMismatch { peer, expected: 2, got: 3 }) if peer == left),
    );
    t.native_barrier().expect("barrier");

    // A stalled peer is named within the deadline: rank 1 sleeps while rank 0 waits on it.
    let short = Duration::from_millis(300);
    let normal = t.timeout();
    if n < 2 {
        return;
    }
    if me == 0 {
        t.set_timeout(short);
        let t0 = Instant::now();
        let err = t.recv(1, &mut buf);
        let took = t0.elapsed();
        k.ok(
            &format!("stalled peer: {err:?} after {took:?}"),
            matches!(
                err,
                Err(Error::Timeout {
                    peer: 1,
                    op: Op::Recv,
                    ..
                })
            ) && took < short + Duration::from_secs(2),
        );
        // A send the peer does not take (large: no eager copy) times out too, and its
        // buffer stays with the transport until the peer takes it late.
        let big = payload(0, 9, 4 << 20);
        let t0 = Instant::now();
        let err = t.send(1, &big);
        let took = t0.elapsed();
        k.ok(
            &format!("stalled receiver: {err:?} after {took:?}"),
            matches!(
                err,
                Err(Error::Timeout {
                    peer: 1,
                    op: Op::Send,
                    ..
                })
            ) && took < short + Duration::from_secs(2),
        );
        drop(big); // our copy is gone; MPI reads the transport's staging buffer
        t.set_timeout(normal);
        // Keep MPI progressing until rank 1 has taken the message.
        k.res("ack", t.recv(1, &mut buf));
    } else if me == 1 {
        std::thread::sleep(short * 3);
        if k.res("late recv", t.recv(0, &mut buf)).is_some() {
            k.eq(
                "late recv of a stranded send",
                &buf,
                &payload(0, 9, 4 << 20),
            );
        }
        k.res("ack", t.send(0, b"ok"));
    }
    t.native_barrier().expect("barrier");
}
