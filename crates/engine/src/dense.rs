//! The canonical-order dense all-reduce ([`DenseAlgorithm::Canonical`](crate::DenseAlgorithm)).
//!
//! Reduce-scatter by pairwise exchange: at step `s` (1..P) rank `r` sends its part of chunk
//! `r + s` to that chunk's owner while receiving, from rank `r - s`, that rank's part of its own
//! chunk `r` (one `send_recv`, so no deadlock at any size). The owner keeps every rank's part
//! and sums element `i` in rank order, `((g0[i] + g1[i]) + g2[i]) + ...`, then divides by P;
//! an all-gather (a copy, no arithmetic: recursive doubling on power-of-two worlds, else the
//! ring) spreads the chunks. An element's rounding thus
//! never depends on where it sits in the buffer: fusing tensors into one buffer, or changing
//! the world's chunking, leaves every result bit for bit unchanged. Bytes per rank as the
//! ring: `2 (P-1)/P` of the buffer; `P-1 + log2 P` messages on power-of-two worlds, `2 (P-1)`
//! otherwise (segmented by `seg_bytes`).

use gradwire_collective::{chunks, Algorithm, Result};
use gradwire_transport::Transport;

/// `out[k] = (((parts[0][k] + parts[1][k]) + ...) + parts[P-1][k]) / P`, where `parts` holds
/// the `P = world` ranks' parts of one chunk one after another (`out.len()` floats each):
/// every element summed in rank order, row by row (contiguous loops, no strided reads).
pub(crate) fn rank_order_mean(parts: &[f32], world: usize, out: &mut [f32]) {
    let m = out.len();
    out.copy_from_slice(&parts[..m]);
    for part in parts[m..world * m].chunks_exact(m.max(1)) {
        for (o, x) in out.iter_mut().zip(part) {
            *o += *x;
        }
    }
    if world > 1 {
        let n = world as f32;
        for o in out.iter_mut() {
            *o /= n;
        }
    }
}

/// Mean over ranks of `buf`, summed in rank order (see the module doc). `scratch` is reused.
pub(crate) fn canonical_mean<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [f32],
    seg_bytes: usize,
    scratch: &mut Vec<f32>,
) -> Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if world == 1 {
        return Ok(());
    }
    let len = buf.len();
    let mine = chunks::range(len, world, rank);
    let m = mine.len();
    let seg = (seg_bytes / 4).max(1);
    let nseg = chunks::segments(len.div_ceil(world), seg);
    scratch.clear();
    scratch.resize(world * m, 0.0);
    scratch[rank * m..(rank + 1) * m].copy_from_slice(&buf[mine.clone()]);
    for s in 1..world {
        let to = (rank + s) % world;
        let from = (rank + world - s) % world;
        let send = &buf[chunks::range(len, world, to)];
        let recv = &mut scratch[from * m..(from + 1) * m];
        for j in 0..nseg {
            let sp = chunks::range(send.len(), nseg, j);
            let rp = chunks::range(m, nseg, j);
            t.send_recv_into(
                to,
                bytemuck::cast_slice(&send[sp]),
                from,
                bytemuck::cast_slice_mut(&mut recv[rp]),
            )?;
        }
    }
    rank_order_mean(scratch, world, &mut buf[mine]);
    // A copy, no arithmetic: any all-gather gives the same bits. Recursive doubling on
    // power-of-two worlds (`log2 P` steps instead of the ring's `P-1`; same chunks), the ring
    // otherwise.
    gradwire_collective::all_gather(t, buf, Algorithm::Rabenseifner, seg_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_transport::local::Local;

    #[test]
    fn equals_rank_order_sum_bitwise() {
        for world in [1, 2, 3, 4, 5, 8] {
            for len in [0, 1, 4, 13, 100] {
                let g = |r: usize, i: usize| ((r * 31 + i * 7) % 23) as f32 * 0.1 - 1.1;
                let got: Vec<Vec<f32>> = std::thread::scope(|s| {
                    let hs: Vec<_> = Local::world(world)
                        .into_iter()
                        .map(|mut t| {
                            s.spawn(move || {
                                let mut b: Vec<f32> = (0..len).map(|i| g(t.rank(), i)).collect();
                                canonical_mean(&mut t, &mut b, 12, &mut Vec::new()).unwrap();
                                b
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).collect()
                });
                for (r, b) in got.iter().enumerate() {
                    for (i, v) in b.iter().enumerate() {
                        let mut want = g(0, i);
                        for q in 1..world {
                            want += g(q, i);
                        }
                        let want = if world > 1 { want / world as f32 } else { want };
                        assert_eq!(
                            v.to_bits(),
                            want.to_bits(),
                            "world {world} len {len} rank {r} [{i}]"
                        );
                    }
                }
            }
        }
    }
}
