//! The canonical-order dense all-reduce ([`DenseAlgorithm::Canonical`](crate::DenseAlgorithm)):
//! every element summed in an order fixed by the world alone, whatever its position in the
//! buffer, so that fusing tensors into one buffer, or changing the world's chunking, leaves
//! every result bit for bit unchanged.
//!
//! - **Power-of-two worlds: the hypercube tree.** Rabenseifner's recursive halving (partner
//!   at distance `P/2` first, each rank adding its partner's partial to its own), then
//!   recursive doubling: element `i` is `T(0, 1) / P` with `T(a, m) = T(a, 2m) + T(a + m, 2m)`
//!   and `T(a, P) = g_a`, i.e. `(g0 + g2) + (g1 + g3)` on 4 ranks. `2 log2 P` messages (the
//!   fewest of any schedule here), `2 (P-1)/P` of the buffer per rank. The same bits as
//!   [`DenseAlgorithm::Tree`](crate::DenseAlgorithm) (the collective layer's Rabenseifner),
//!   which this calls. The speculative round (`worker.rs`) reproduces it in the negotiation
//!   round.
//! - **Other worlds: rank order.** Reduce-scatter by pairwise exchange: at step `s` (1..P)
//!   rank `r` sends its part of chunk `r + s` to that chunk's owner while receiving, from rank
//!   `r - s`, that rank's part of its own chunk `r` (one `send_recv`, so no deadlock at any
//!   size). The owner keeps every rank's part and sums element `i` in rank order,
//!   `((g0[i] + g1[i]) + g2[i]) + ...`, then divides by P; the ring all-gather (a copy, no
//!   arithmetic) spreads the chunks. `2 (P-1)` messages (segmented by `seg_bytes`), the
//!   ring's bytes.
//!
//! Before the engine of `a0cafbd` (2026-12-02) the rank order held on every world (`P-1 + log2 P`
//! messages on power-of-two worlds): one exchange more than the tree at `P = 4`, each coupling all
//! ranks, which cost the engine its LeNet step against a flat Rabenseifner all-reduce on an
//! oversubscribed host.
//!
//! [`hierarchical_mean`]: the same arithmetic when the job spans several hosts (see
//! `hosts.rs`): rank order within each host over its local link, then host order across the
//! hosts' leaders, then a broadcast within each host. Still position-independent (fusion stays
//! bit-identical); grouped by host, so it may differ from the flat order in the last bits.
//! A deviation from `gradwire_collective::hierarchical` (a ring within the host, the size-chosen
//! algorithm across hosts), whose sums depend on an element's position; that one runs under
//! [`DenseAlgorithm::Collective`](crate::DenseAlgorithm), which claims no bit-identity anyway.

use std::ops::Range;

use gradwire_collective::hierarchical::Group;
use gradwire_collective::{chunks, Algorithm, Element, ReduceOp, Result};
use gradwire_transport::Transport;

/// `out[k] = (((parts[0][k] + parts[1][k]) + ...) + parts[P-1][k]) / P` for the `P` ranks'
/// parts of one chunk (`out.len()` floats each), wherever they lie: every element summed in
/// rank order, part by part (contiguous loops, no strided reads).
pub(crate) fn rank_order_mean(parts: &[&[f32]], out: &mut [f32]) {
    rank_order_sum(parts, out);
    divide(out, parts.len());
}

/// `out[k] = a[k] + b[k]` (the AVX2-dispatched adder below).
pub(crate) fn add_into(out: &mut [f32], a: &[f32], b: &[f32]) {
    rank_order_sum(&[a, b], out);
}

/// `out[k] = (a[k] + b[k]) / p` for a power of two `p`, in one pass: the sum rounded to
/// f32 first, then multiplied by the exact `1/p`, which rounds as the division does (the
/// collective's divide does the same), so the bits are those of [`add_into`] followed by
/// the division. `a`: `None` adds `b` into `out` itself.
pub(crate) fn add_divide_into(out: &mut [f32], a: Option<&[f32]>, b: &[f32], p: usize) {
    debug_assert!(p.is_power_of_two());
    add_scaled(out, a, b, 1.0 / p as f32)
}

gradwire_codec::multiversion! {
    /// `out[k] = (a[k] + b[k]) * inv` (`a`: `None` reads `out[k]` instead).
    fn add_scaled(out: &mut [f32], a: Option<&[f32]>, b: &[f32], inv: f32) {
        let b = &b[..out.len()];
        match a {
            Some(a) => {
                let a = &a[..out.len()];
                for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
                    *o = (*x + *y) * inv;
                }
            }
            None => {
                for (o, y) in out.iter_mut().zip(b) {
                    *o = (*o + *y) * inv;
                }
            }
        }
    }
}

gradwire_codec::multiversion! {
    /// `out[k] = a[k] + out[k]`: the sum `a + out` (operands in that order) written where
    /// `out` lies, e.g. into a partner's part where it arrived.
    pub(crate) fn add_before(out: &mut [f32], a: &[f32]) {
        let a = &a[..out.len()];
        for (o, x) in out.iter_mut().zip(a) {
            // `a` first, as the normal path adds (equal bits to `*o += *x` except for which
            // of two NaNs' payloads survives).
            #[allow(clippy::assign_op_pattern)]
            {
                *o = *x + *o;
            }
        }
    }
}

gradwire_codec::multiversion! {
    /// [`rank_order_mean`] without the division: `((p0 + p1) + p2) + ...` element by element,
    /// in blocks that stay in L1 while every part is added (one pass over the output). Like
    /// every `multiversion!` function, the same additions in the same order on every CPU.
    fn rank_order_sum(parts: &[&[f32]], out: &mut [f32]) {
        const BLOCK: usize = 512;
        match parts {
            [] => {}
            [p0] => out.copy_from_slice(&p0[..out.len()]),
            [p0, p1, rest @ ..] => {
                for (i, o) in out.chunks_mut(BLOCK).enumerate() {
                    let r = i * BLOCK..i * BLOCK + o.len();
                    for ((o, a), b) in o.iter_mut().zip(&p0[r.clone()]).zip(&p1[r.clone()]) {
                        *o = *a + *b;
                    }
                    for p in rest {
                        for (o, x) in o.iter_mut().zip(&p[r.clone()]) {
                            *o += *x;
                        }
                    }
                }
            }
        }
    }
}

/// `x /= n` for every element (nothing for `n <= 1`): the collective's divide, bit-identical
/// to IEEE division (a multiply by the exact `1/n` for powers of two).
fn divide(out: &mut [f32], n: usize) {
    if n > 1 {
        <f32 as gradwire_collective::Element>::divide(out, n);
    }
}

/// The canonical reduce-scatter: afterwards `buf[range]` (the returned range, this rank's
/// chunk) holds the rank-order **sum** of every rank's chunk (see the module doc).
fn reduce_scatter_sum<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [f32],
    seg_bytes: usize,
    scratch: &mut Vec<f32>,
) -> Result<Range<usize>> {
    let (rank, world) = (t.rank(), t.world_size());
    let len = buf.len();
    let mine = chunks::range(len, world, rank);
    if world == 1 {
        return Ok(mine);
    }
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
    let parts: Vec<&[f32]> = scratch.chunks_exact(m.max(1)).take(world).collect();
    rank_order_sum(&parts, &mut buf[mine.clone()]);
    Ok(mine)
}

/// Mean over ranks of `buf` in the canonical order (see the module doc). `scratch` is reused.
pub(crate) fn canonical_mean<T: Transport + ?Sized>(
    t: &mut T,
    buf: &mut [f32],
    seg_bytes: usize,
    scratch: &mut Vec<f32>,
) -> Result<()> {
    let world = t.world_size();
    if world == 1 {
        return Ok(());
    }
    if world.is_power_of_two() {
        return gradwire_collective::all_reduce(
            t,
            buf,
            gradwire_collective::ReduceOp::Mean,
            Algorithm::Rabenseifner,
            seg_bytes,
        );
    }
    let mine = reduce_scatter_sum(t, buf, seg_bytes, scratch)?;
    divide(&mut buf[mine], world);
    // A copy, no arithmetic: any all-gather gives the same bits (the ring: not a power of two).
    gradwire_collective::all_gather(t, buf, Algorithm::Rabenseifner, seg_bytes)
}

/// Where this rank sits in a job that spans several hosts (see [`hierarchical_mean`]).
pub(crate) struct HostLinks {
    /// A transport among this host's ranks (local rank 0 leads); `None` when alone on it.
    pub local: Option<Box<dyn Transport>>,
    /// Job rank of each local rank.
    pub local_ranks: Vec<usize>,
    /// Job rank of each host's leader, in host order.
    pub leaders: Vec<usize>,
    /// Ranks in the job.
    pub world: usize,
    /// Ranks per host, in host order.
    pub sizes: Vec<usize>,
}

impl HostLinks {
    /// `2 hosts (2+2 ranks)`.
    pub(crate) fn describe(&self) -> String {
        let sizes: Vec<String> = self.sizes.iter().map(usize::to_string).collect();
        format!("{} hosts ({} ranks)", sizes.len(), sizes.join("+"))
    }

    /// Bytes sent over the local transport.
    pub(crate) fn bytes_sent(&self) -> u64 {
        self.local.as_ref().map_or(0, |l| l.bytes_sent())
    }

    /// All-reduces `buf` with [`gradwire_collective::hierarchical::all_reduce`]: within the
    /// host over `local`, between the leaders over the job's transport `world`, back within
    /// the host. A rank alone on its host takes only the leaders' step (its local link is a
    /// world of one).
    pub(crate) fn all_reduce<E: Element>(
        &mut self,
        world: &mut dyn Transport,
        buf: &mut [E],
        op: ReduceOp,
    ) -> Result<()> {
        let mut cross = Group::new(world, self.leaders.clone());
        let mut solo;
        let local: &mut dyn Transport = match self.local.as_deref_mut() {
            Some(l) => l,
            None => {
                solo = gradwire_transport::local::Local::world(1);
                &mut solo[0]
            }
        };
        gradwire_collective::hierarchical::all_reduce(
            local,
            cross.as_mut(),
            &self.local_ranks,
            &self.leaders,
            self.world,
            buf,
            op,
        )
    }
}

/// The hierarchical mean, in canonical order: every rank's host reduces to its leader over
/// `h.local` (the canonical reduce-scatter, summed in local rank order, then each chunk to
/// the leader), the leaders sum the host sums in host order (the canonical reduce-scatter and
/// an all-gather over the leaders' [`Group`] of the job transport `t`), each leader
/// broadcasts over `h.local`, and every rank divides by the job's size.
///
/// Element `i` is `((host_0 + host_1) + ...) / P` with `host_k` its host's ranks' values
/// summed in rank order: it depends on neither its position in the buffer nor the chunking,
/// so fused and unfused results stay bit-identical. It is grouped by host, so it may differ
/// from the flat [`canonical_mean`] in the last bits (exactly equal when the sums are exact).
/// Errors name job ranks.
pub(crate) fn hierarchical_mean(
    t: &mut dyn Transport,
    h: &mut HostLinks,
    buf: &mut [f32],
    seg_bytes: usize,
    scratch: &mut Vec<f32>,
) -> Result<()> {
    let local_ranks = &h.local_ranks;
    let to_job = |i: usize| local_ranks.get(i).copied().unwrap_or(i);
    let len = buf.len();
    let leader = match h.local.as_deref_mut() {
        Some(local) => {
            let (me, n) = (local.rank(), local.world_size());
            let res = (|| -> Result<()> {
                let mine = reduce_scatter_sum(local, buf, seg_bytes, scratch)?;
                if me != 0 {
                    local.send(0, bytemuck::cast_slice(&buf[mine]))?;
                    return Ok(());
                }
                for r in 1..n {
                    let range = chunks::range(len, n, r);
                    local.recv_into(r, bytemuck::cast_slice_mut(&mut buf[range]))?;
                }
                Ok(())
            })();
            res.map_err(|e| e.map_ranks(to_job))?;
            me == 0
        }
        None => true,
    };
    if leader && h.leaders.len() > 1 {
        let mut g = Group::new(t, h.leaders.clone()).ok_or(gradwire_collective::Error::Codec {
            what: "this host's leader is not among the leaders",
        })?;
        reduce_scatter_sum(&mut g, buf, seg_bytes, scratch)?;
        gradwire_collective::all_gather(&mut g, buf, Algorithm::Rabenseifner, seg_bytes)?;
    }
    if let Some(local) = h.local.as_deref_mut() {
        gradwire_collective::broadcast::broadcast(local, buf, 0, seg_bytes)
            .map_err(|e| e.map_ranks(to_job))?;
    }
    divide(buf, h.world);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_transport::local::Local;

    /// The canonical order written naively: the hypercube tree `T(a, m) = T(a, 2m) +
    /// T(a + m, 2m)` on power-of-two worlds, rank order otherwise; then `/ P`.
    fn reference(g: &dyn Fn(usize) -> f32, world: usize) -> f32 {
        fn tree(g: &dyn Fn(usize) -> f32, a: usize, m: usize, p: usize) -> f32 {
            if m == p {
                g(a)
            } else {
                tree(g, a, 2 * m, p) + tree(g, a + m, 2 * m, p)
            }
        }
        let sum = if world.is_power_of_two() {
            tree(g, 0, 1, world)
        } else {
            (1..world).fold(g(0), |s, q| s + g(q))
        };
        if world > 1 {
            sum / world as f32
        } else {
            sum
        }
    }

    #[test]
    fn equals_the_canonical_order_bitwise() {
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
                        let want = reference(&|q| g(q, i), world);
                        assert_eq!(
                            v.to_bits(),
                            want.to_bits(),
                            "world {world} len {len} rank {r} [{i}]"
                        );
                    }
                }
            }
        }
        // The data tells the two orders apart on 4 and 8 ranks (so the test can fail).
        for p in [4usize, 8] {
            assert!((0..100).any(|i| {
                let g = |r: usize| ((r * 31 + i * 7) % 23) as f32 * 0.1 - 1.1;
                let rank_order = (1..p).fold(g(0), |s, q| s + g(q)) / p as f32;
                reference(&g, p).to_bits() != rank_order.to_bits()
            }));
        }
    }
}
