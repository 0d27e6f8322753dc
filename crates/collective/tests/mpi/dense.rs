//! The dense sections: every algorithm, op and element type against the naive references
//! (the in-process property suite's battery), and sizes past the automatic thresholds.

use gradwire_collective::{broadcast, chunks, gather, reference, Collectives, ReduceOp};
use gradwire_transport::mpi::Mpi;
use gradwire_transport::Transport;

use crate::suite::{floats_f32, floats_f64, ints_f32, ints_i32, Tally, ALGOS, OPS, SEGS};

pub(crate) fn dense_checks(t: &mut Mpi, k: &mut Tally) {
    let (rank, world) = (t.rank(), t.world_size());
    let lens = [0usize, 1, 2, 3, 5, 7, 13, 31, 97, 1000];
    for (i, &len) in lens.iter().enumerate() {
        let seed = 0x6d70_6900 + i as u64 * 977;
        battery(t, k, len, seed);
        if k.broken {
            return;
        }
    }
    // Float sums (order-dependent bits) agree across ranks.
    let mut bits = Vec::new();
    for algo in ALGOS {
        let mut b = floats_f32(5, rank, 777);
        if k.res(
            "float all_reduce",
            gradwire_collective::all_reduce(t, &mut b, ReduceOp::Sum, algo, 64),
        )
        .is_some()
        {
            bits.extend(b.iter().flat_map(|x| x.to_bits().to_le_bytes()));
        }
    }
    let mut all = Vec::new();
    if k.res("all_gather_bytes", t.all_gather_bytes(&bits, &mut all))
        .is_some()
    {
        for (r, b) in all.iter().enumerate() {
            k.ok(
                &format!("rank {r}'s float sums differ from rank {rank}'s"),
                *b == bits,
            );
        }
    }
    let _ = world;
}

/// One rank's battery for (len, seed), as the in-process property suite runs it.
pub(crate) fn battery(t: &mut Mpi, k: &mut Tally, len: usize, seed: u64) {
    let (rank, world) = (t.rank(), t.world_size());
    let all = |f: &dyn Fn(usize) -> Vec<f32>| -> Vec<Vec<f32>> { (0..world).map(f).collect() };
    let in_f32 = all(&|r| ints_f32(seed, r, len));
    let in_i32: Vec<Vec<i32>> = (0..world).map(|r| ints_i32(seed, r, len)).collect();
    let in_f64: Vec<Vec<f64>> = (0..world).map(|r| floats_f64(seed, r, len)).collect();
    for algo in ALGOS {
        for seg in SEGS {
            if k.broken {
                return;
            }
            for op in OPS {
                let tag = format!("len {len} {algo} seg {seg} {op}");
                let mut b = in_f32[rank].clone();
                if k.res(
                    &tag,
                    gradwire_collective::all_reduce(t, &mut b, op, algo, seg),
                )
                .is_some()
                {
                    k.eq(
                        &format!("{tag} f32"),
                        &b,
                        &reference::all_reduce(&in_f32, op),
                    );
                }
                let mut b = in_i32[rank].clone();
                if k.res(
                    &tag,
                    gradwire_collective::all_reduce(t, &mut b, op, algo, seg),
                )
                .is_some()
                {
                    k.eq(
                        &format!("{tag} i32"),
                        &b,
                        &reference::all_reduce(&in_i32, op),
                    );
                }
            }
            let tag = format!("len {len} {algo} seg {seg}");
            let mut b = in_f64[rank].clone();
            if k.res(
                &tag,
                gradwire_collective::all_reduce(t, &mut b, ReduceOp::Sum, algo, seg),
            )
            .is_some()
            {
                let want = reference::all_reduce(&in_f64, ReduceOp::Sum);
                k.ok(
                    &format!("{tag} f64 within 1e-9"),
                    b.len() == want.len()
                        && b.iter().zip(&want).all(|(x, y)| (x - y).abs() <= 1e-9),
                );
            }
            for op in [ReduceOp::Sum, ReduceOp::Mean] {
                let mut b = in_f32[rank].clone();
                if let Some(r) = k.res(
                    &tag,
                    gradwire_collective::reduce_scatter(t, &mut b, op, algo, seg),
                ) {
                    k.ok(
                        &format!("{tag} reduce_scatter range"),
                        r == chunks::range(len, world, rank),
                    );
                    if r == chunks::range(len, world, rank) {
                        k.eq(
                            &format!("{tag} reduce_scatter {op}"),
                            &b[r],
                            &reference::reduce_scatter(&in_f32, op, rank),
                        );
                    }
                }
            }
            let mut b = in_i32[rank].clone();
            if k.res(&tag, gradwire_collective::all_gather(t, &mut b, algo, seg))
                .is_some()
            {
                k.eq(
                    &format!("{tag} all_gather"),
                    &b,
                    &reference::all_gather(&in_i32),
                );
            }
        }
    }
    for seg in SEGS {
        for root in [0, world - 1, world / 2] {
            let tag = format!("len {len} seg {seg} root {root}");
            let want = &in_f32[root];
            let mut b = in_f32[rank].clone();
            if k.res(&tag, broadcast::binomial(t, &mut b, root, seg))
                .is_some()
            {
                k.eq(&format!("{tag} binomial"), &b, want);
            }
            let mut b = in_f32[rank].clone();
            if k.res(&tag, broadcast::scatter_all_gather(t, &mut b, root, seg))
                .is_some()
            {
                k.eq(&format!("{tag} scatter+allgather"), &b, want);
            }
            let mut b = in_f32[rank].clone();
            if k.res(&tag, broadcast::broadcast(t, &mut b, root, seg))
                .is_some()
            {
                k.eq(&format!("{tag} broadcast"), &b, want);
            }
            let payload = |r: usize| vec![r as u8; (len + r * 3) % 17];
            let mut b = if rank == root {
                payload(root)
            } else {
                vec![9; 3]
            };
            if k.res(
                &tag,
                broadcast::broadcast_bytes(
                    t,
                    &mut b,
                    root,
                    seg,
                    broadcast::DEFAULT_MAX_BROADCAST_BYTES,
                ),
            )
            .is_some()
            {
                k.eq(&format!("{tag} broadcast_bytes"), &b, &payload(root));
            }
        }
        let mut out = vec![0i32; len * world];
        if k.res(
            "all_gather_into",
            gather::all_gather_into(t, &in_i32[rank], &mut out, seg),
        )
        .is_some()
        {
            k.eq(
                &format!("len {len} seg {seg} all_gather_into"),
                &out,
                &reference::concat(&in_i32),
            );
        }
    }
    let mut out = vec![vec![1u8; 5]; 2];
    for round in 0..2usize {
        let payload = |r: usize| -> Vec<u8> {
            (0..(len + 7 * r + round) % 23)
                .map(|i| (i + r) as u8)
                .collect()
        };
        if k.res(
            "all_gather_bytes",
            t.all_gather_bytes(&payload(rank), &mut out),
        )
        .is_some()
        {
            let want: Vec<Vec<u8>> = (0..world).map(payload).collect();
            k.ok(
                &format!("len {len} all_gather_bytes round {round}"),
                out == want,
            );
        }
    }
    k.res("barrier", t.barrier());
}

/// Sizes past the automatic thresholds, through the public trait (default segments).
pub(crate) fn large_checks(t: &mut Mpi, k: &mut Tally) {
    let (r, world) = (t.rank(), t.world_size());
    for len in [20_000usize, 300_001] {
        if k.broken {
            return;
        }
        let inputs: Vec<Vec<f32>> = (0..world).map(|q| ints_f32(7, q, len)).collect();
        let mut b = inputs[r].clone();
        if k.res("all_reduce", t.all_reduce(&mut b, ReduceOp::Sum))
            .is_some()
        {
            k.eq(
                &format!("large all_reduce {len}"),
                &b,
                &reference::all_reduce(&inputs, ReduceOp::Sum),
            );
        }
        let mut c = inputs[r].clone();
        if k.res("broadcast", t.broadcast(&mut c, world - 1)).is_some() {
            k.eq(&format!("large broadcast {len}"), &c, &inputs[world - 1]);
        }
        let mut d = inputs[r].clone();
        if let Some(mine) = k.res("reduce_scatter", t.reduce_scatter(&mut d, ReduceOp::Max)) {
            d[mine.clone()].copy_from_slice(&reference::reduce_scatter(&inputs, ReduceOp::Max, r));
            if k.res("all_gather", t.all_gather(&mut d)).is_some() {
                k.eq(
                    &format!("large rs+ag {len}"),
                    &d,
                    &reference::all_reduce(&inputs, ReduceOp::Max),
                );
            }
        }
    }
}
