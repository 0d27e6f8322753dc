//! The negotiation round ([`Worker::negotiate`]): the small all-gather of every rank's
//! message, or, when the registered dense tensors qualify, the speculative round that
//! carries their reduce-scatter along (pairwise exchange on worlds that are not a power of
//! two, recursive halving on those that are) and then all-gathers them in place.
//!
//! `Worker::speculate_tree` is longer than the project's 120-line guideline (about 145):
//! each step of the halving reads and writes state the next step uses (the partial sums'
//! place, the flags of which ranks attached, the first and last steps' special cases), and
//! the comments walk through it in order; split, those would become a struct of loop state
//! passed between pieces that each make sense only in that loop.

use gradwire_transport::Transport;

use crate::error::Result;
use crate::pending::Pending;

use super::pieces::{byte_pieces, carve, copy_range, floats_in_place, for_pieces, grow};
use super::{stamp, Spares, Worker};

/// The speculative batch, reduced and all-gathered in the negotiation round.
pub(crate) struct SpecDone {
    /// Bytes this rank sent for it (its parts and the all-gather).
    pub(super) bytes: u64,
    /// When the all-gather began and ended, µs.
    pub(super) gather_us: (u64, u64),
}

/// Rounds per submission of the speculative batch in which a rank attaches its parts: the
/// first (the one a rank that submitted early waits in) and one more (in case another
/// rank's stall check took that round); after that the batch goes the normal way, so a rank
/// waiting on a slow one does not resend it every cycle.
const SPEC_TRIES: u32 = 2;

/// The speculative batch's size limit: larger batches are bandwidth-bound, where saving a
/// round does not matter and a failed speculation would waste a real transfer.
pub(super) const SPEC_MAX_BYTES: usize = 256 << 10;

/// The speculative batch's buffers as submitted (empty unless `attach`, which means the
/// whole batch is pending), in `spec` order: parts are sent straight from them (vectored),
/// nothing is fused before the round.
fn spec_batch<'a>(
    pending: &'a Pending,
    spec: &[usize],
    attach: bool,
    mut out: Vec<&'a [f32]>,
) -> Vec<&'a [f32]> {
    out.clear();
    if attach {
        out.extend(
            spec.iter()
                .map(|&id| pending.data(id).expect("the whole batch is pending")),
        );
    }
    out
}

/// The speculative batch's buffers (the pending submissions of `spec`'s ids, ascending),
/// mutable, in `spec` order (in `out`, a kept allocation); every one must be pending.
fn batch_mut<'a>(
    pending: &'a mut Pending,
    spec: &[usize],
    out: Vec<&'a mut [f32]>,
) -> Vec<&'a mut [f32]> {
    pending
        .data_mut(spec, out)
        .expect("the whole batch is pending")
}

/// All-gathers the batch (`len` elements; chunk `r` owned by rank `r`, already reduced
/// there) in the tensors' own buffers: recursive doubling on power-of-two worlds (`log2 P`
/// exchanges), the ring otherwise (`P-1`), each exchange sent from and received into the
/// pieces of the tensors it touches. A copy, no arithmetic: any schedule gives the same
/// bits. Returns the bytes sent.
fn gather_in_place(
    t: &mut dyn Transport,
    batch: &mut [&mut [f32]],
    len: usize,
    spares: &mut Spares,
) -> Result<u64> {
    use gradwire_collective::chunks::span;
    let (rank, world) = (t.rank(), t.world_size());
    let mut sent = 0u64;
    let mut step = |t: &mut dyn Transport,
                    batch: &mut [&mut [f32]],
                    to: usize,
                    from: usize,
                    send: std::ops::Range<usize>,
                    recv: std::ops::Range<usize>|
     -> Result<()> {
        let (a, b) = carve(batch, send, recv, spares);
        // Same-sized elements: both collects reuse carve's allocations, which go back to
        // `spares` after.
        let out: Vec<&[u8]> = a
            .into_iter()
            .map(|p| &*bytemuck::cast_slice_mut::<f32, u8>(p))
            .collect();
        let mut into: Vec<&mut [u8]> = b.into_iter().map(bytemuck::cast_slice_mut).collect();
        sent += out.iter().map(|p| p.len() as u64).sum::<u64>();
        let res = t.send_recv_parts_into(to, &out, from, &mut into);
        spares.put(out);
        spares.put(into);
        res.map_err(gradwire_collective::Error::from)?;
        Ok(())
    };
    if world.is_power_of_two() {
        let mut d = 1;
        while d < world {
            let partner = rank ^ d;
            let (mine, theirs) = ((rank / d) * d, (partner / d) * d);
            let (send, recv) = (
                span(len, world, mine, mine + d),
                span(len, world, theirs, theirs + d),
            );
            step(t, batch, partner, partner, send, recv)?;
            d *= 2;
        }
    } else {
        let (to, from) = ((rank + 1) % world, (rank + world - 1) % world);
        for s in 0..world - 1 {
            let send = (rank + world - s) % world;
            let recv = (rank + world - s - 1) % world;
            let (send, recv) = (
                span(len, world, send, send + 1),
                span(len, world, recv, recv + 1),
            );
            step(t, batch, to, from, send, recv)?;
        }
    }
    Ok(sent)
}

/// The tree round's partial sums of elements `base + r`: in `buf` from byte `at` when
/// `at` is set, else in `acc` (see `Worker::tree_acc`).
fn acc_of<'a>(
    buf: &'a [u8],
    at: Option<usize>,
    acc: &'a [f32],
    r: std::ops::Range<usize>,
) -> &'a [f32] {
    match at {
        Some(at) => bytemuck::cast_slice(&buf[at + 4 * r.start..at + 4 * r.end]),
        None => &acc[r],
    }
}

/// [`acc_of`], mutable.
fn acc_of_mut<'a>(
    buf: &'a mut [u8],
    at: Option<usize>,
    acc: &'a mut [f32],
    r: std::ops::Range<usize>,
) -> &'a mut [f32] {
    match at {
        Some(at) => bytemuck::cast_slice_mut(&mut buf[at + 4 * r.start..at + 4 * r.end]),
        None => &mut acc[r],
    }
}

impl Worker {
    /// The negotiation round: every rank's message reaches every rank (`self.gathered`).
    ///
    /// Steady state without a second round (the speculative batch): when the registered dense
    /// tensors qualify (`self.spec`, the same on every rank), the round is the canonical
    /// reduce-scatter's pairwise exchange (`P-1` steps, rank `r` sends to `r+s` and receives
    /// from `r-s`, so every rank hears from every other) and each message carries the
    /// negotiation message, plus, when this rank has the whole batch pending (in at most
    /// [`SPEC_TRIES`] rounds per submission: the round a rank that submitted early waits in
    /// until the last rank submits, and one more), its part of the fused batch for the
    /// receiver's chunk. If every rank sent its parts, every rank had the whole batch pending, so it is
    /// ready everywhere, and each owner sums its chunk in rank order exactly as
    /// [`crate::dense`] does: the result is bit for bit the normal path's, one negotiation
    /// round (`log2 P` steps on power-of-two worlds) earlier. Otherwise the parts are dropped
    /// (every rank sees the same flags) and the cycle goes on as usual. Without a speculative
    /// batch: the small all-gather of `rd_gather`.
    ///
    /// Copies: the parts go out straight from the submissions' buffers (one vectored send per
    /// step, header first: `wire::encode_exchange_header`), each peer's part is summed where
    /// it landed in that peer's receive buffer, and only this rank's own part is copied (into
    /// `own_part`); nothing is fused (the version of `e8e5690` fused the batch, assembled every
    /// send, copied each received part out, all-gathered the fusion buffer and unfused it:
    /// 5x the batch in copies per step, against 0.25x here, and flat's 2x).
    ///
    /// When the batch was reduced, every rank then all-gathers the chunks in place
    /// ([`gather_in_place`]): the submissions hold the results, and nothing is fused or
    /// unfused. Returns the bytes that took and when the all-gather ran.
    pub(super) fn negotiate(&mut self) -> Result<Option<SpecDone>> {
        let (rank, world) = (self.rank, self.world);
        if self.spec.is_empty() {
            crate::rd_gather::all_gather_small(
                &mut *self.t,
                &self.msg_buf,
                &mut self.gathered,
                &mut self.rd_send,
                &mut self.rd_recv,
            )?;
            return Ok(None);
        }
        let attach =
            self.spec_tries < SPEC_TRIES && self.spec.iter().all(|&id| self.pending.has_id(id));
        self.spec_tries += u32::from(attach);
        let len: usize = self.spec.iter().map(|&id| self.entries[id].len).sum();
        self.gathered.resize_with(world, Vec::new);
        self.gathered[rank].clear();
        self.gathered[rank].extend_from_slice(&self.msg_buf);
        let reduced = if world.is_power_of_two() {
            self.speculate_tree(attach, len)?
        } else {
            self.speculate_pairwise(attach, len)?
        };
        let Some(part_bytes) = reduced else {
            return Ok(None);
        };
        // Then every chunk to every rank, received straight into the submissions.
        let mut outs = batch_mut(&mut self.pending, &self.spec, self.spares.take());
        let gather_start = stamp(self.shared.timeline);
        let gathered = gather_in_place(&mut *self.t, &mut outs, len, &mut self.spares);
        self.spares.put(outs);
        let gathered = gathered?;
        Ok(Some(SpecDone {
            bytes: part_bytes + gathered,
            gather_us: (gather_start, stamp(self.shared.timeline)),
        }))
    }

    /// The speculative round on worlds that are not a power of two: the pairwise exchange
    /// (`P-1` steps), each peer's part summed in rank order where it arrived. Returns the
    /// part bytes sent when every rank attached (this rank's chunk of the submissions then
    /// holds its mean), else `None` (the submissions untouched).
    fn speculate_pairwise(&mut self, attach: bool, len: usize) -> Result<Option<u64>> {
        let (rank, world) = (self.rank, self.world);
        let batch = spec_batch(&self.pending, &self.spec, attach, self.spares.take());
        let mine = gradwire_collective::chunks::range(len, world, rank);
        let m = mine.len();
        if attach {
            self.own_part.resize(m, 0.0); // every element overwritten here
            copy_range(&batch, mine.clone(), &mut self.own_part);
        }
        self.rd_recvs.resize_with(world, Vec::new);
        // Where each peer's part starts in its receive buffer.
        let mut part_at = vec![None; world];
        let mut part_bytes = 0u64;
        for s in 1..world {
            let (to, from) = ((rank + s) % world, (rank + world - s) % world);
            crate::wire::encode_exchange_header(&self.msg_buf, attach, &mut self.rd_send);
            let mut pieces: Vec<&[u8]> = vec![&self.rd_send];
            if attach {
                let r = gradwire_collective::chunks::range(len, world, to);
                part_bytes += 4 * r.len() as u64;
                byte_pieces(&batch, r, &mut pieces);
            }
            let recv = &mut self.rd_recvs[from];
            self.t
                .send_recv_parts(to, &pieces, from, recv)
                .map_err(gradwire_collective::Error::from)?;
            let (msg, part) = crate::wire::decode_exchange(from, recv, m)?;
            self.gathered[from].clear();
            self.gathered[from].extend_from_slice(msg);
            part_at[from] = part.map(|p| p.as_ptr() as usize - recv.as_ptr() as usize);
        }
        if !attach
            || part_at
                .iter()
                .enumerate()
                .any(|(r, p)| r != rank && p.is_none())
        {
            return Ok(None);
        }
        // Each peer's part is summed where it arrived (a part off a 4-byte boundary, which
        // the padding makes rare, is copied out first).
        grow(&mut self.spec_parts, world * m);
        let mut spare = self.spec_parts[..world * m].chunks_mut(m.max(1));
        let mut parts: Vec<&[f32]> = Vec::with_capacity(world);
        for (r, at) in part_at.iter().enumerate() {
            let sp: &mut [f32] = if m == 0 {
                &mut []
            } else {
                spare.next().expect("one spare chunk per rank")
            };
            parts.push(match *at {
                None => &self.own_part,
                Some(at) => floats_in_place(&self.rd_recvs[r][at..at + 4 * m], sp),
            });
        }
        // This rank's chunk: the rank-order mean written straight into the submissions.
        self.spares.put(batch);
        let mut outs = batch_mut(&mut self.pending, &self.spec, self.spares.take());
        let (own, _) = carve(&mut outs, mine, 0..0, &mut self.spares);
        let mut at = 0;
        for piece in own {
            let n = piece.len();
            let sub: Vec<&[f32]> = parts.iter().map(|p| &p[at..at + n]).collect();
            crate::dense::rank_order_mean(&sub, piece);
            at += n;
        }
        Ok(Some(part_bytes))
    }

    /// The speculative round on power-of-two worlds, along recursive halving: the hypercube
    /// tree of [`crate::dense`] (and of the collective layer's Rabenseifner), so the result
    /// is bit for bit the normal path's. At the step with partner distance `mask` (`P/2`
    /// down to 1) rank `r` and `r ^ mask` exchange every negotiation message each knows
    /// (`P / 2 mask` of them: the all-gather of messages rides the halving) and, while the
    /// sender and every rank it carries attached, its partial sums of the half the receiver
    /// keeps (`wire::encode_tree_header`). The first step sends straight from the
    /// submissions and writes `own + partner` over the partner's part where it arrived in
    /// the receive buffer, which then holds the partial sums of the kept half (`tree_buf`;
    /// `tree_acc` when the part lay off a 4-byte boundary); later steps send from and add
    /// into those, except the last (partner distance 1): it knows every flag, and when all
    /// attached it writes `(acc + partner) / P` (on two ranks `(own + partner) / P`) in one
    /// pass straight into this rank's chunk of the submissions. Returns the part bytes sent
    /// then, else `None` (the submissions untouched).
    ///
    /// Summing where the part arrived, rather than into a third buffer, is what brought the engine
    /// level with flat on LeNet (`38ac0c7`, `docs/results/engine`): the received part is warm from
    /// the socket copy, and the adder reads two streams and writes one it just read, as flat's
    /// in-place add does.
    ///
    /// Longer than 120 lines on purpose: that fused path (the tree's sends, receives and
    /// in-place sums over the ranks' submissions, with the fallback when a rank's batch
    /// differs) is one hot loop, kept whole for the reason above.
    fn speculate_tree(&mut self, attach: bool, len: usize) -> Result<Option<u64>> {
        use gradwire_collective::chunks::span;
        let (rank, world) = (self.rank, self.world);
        let batch = spec_batch(&self.pending, &self.spec, attach, self.spares.take());
        let mut all = attach;
        let mut part_bytes = 0u64;
        let (mut lo, mut hi) = (0, world);
        let mut mask = world / 2;
        // `tree_acc[i - base]`: partial sum of element `i` of the first step's kept half.
        let mut base = 0;
        let mut first = true;
        while mask > 0 {
            let partner = rank ^ mask;
            let mid = lo + mask;
            let (keep, give) = if rank & mask == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            let kr = span(len, world, keep.0, keep.1);
            let gr = span(len, world, give.0, give.1);
            // Before this step a rank knows the ranks that differ from it above `mask`.
            let known = |of: usize, r: usize| (r ^ of) & (2 * mask - 1) == 0;
            let gathered = &self.gathered;
            let carried = (0..world)
                .filter(|&r| known(rank, r))
                .map(|r| (r, &gathered[r][..]));
            crate::wire::encode_tree_header(carried, all, &mut self.rd_send);
            let mut pieces: Vec<&[u8]> = self.spares.take();
            pieces.push(&self.rd_send);
            if all {
                part_bytes += 4 * gr.len() as u64;
                if first {
                    byte_pieces(&batch, gr.clone(), &mut pieces);
                } else {
                    pieces.push(bytemuck::cast_slice(acc_of(
                        &self.tree_buf,
                        self.acc_at,
                        &self.tree_acc,
                        gr.start - base..gr.end - base,
                    )));
                }
            }
            let res = self
                .t
                .send_recv_parts(partner, &pieces, partner, &mut self.rd_recv);
            self.spares.put(pieces);
            res.map_err(gradwire_collective::Error::from)?;
            let step = crate::wire::decode_tree_exchange(
                partner,
                &self.rd_recv,
                world,
                world / (2 * mask),
                |r| known(partner, r),
                kr.len(),
            )?;
            for (r, m) in step.msgs {
                self.gathered[r].clear();
                self.gathered[r].extend_from_slice(m);
            }
            if mask == 1 {
                // The last step: `kr` is this rank's chunk. When every rank attached, the sum
                // goes straight into the submissions and is divided there: the additions and
                // the division of summing into `tree_acc` first, without the copy out of it.
                self.spares.put(batch);
                let Some(part) = step.part.filter(|_| all) else {
                    return Ok(None);
                };
                grow(&mut self.spec_parts, kr.len());
                let other = floats_in_place(part, &mut self.spec_parts[..kr.len()]);
                let mut outs = batch_mut(&mut self.pending, &self.spec, self.spares.take());
                let (mut own, rest) = carve(&mut outs, kr.clone(), 0..0, &mut self.spares);
                self.spares.put(rest);
                let mut at = 0;
                for piece in own.iter_mut() {
                    let (n, theirs) = (piece.len(), &other[at..at + piece.len()]);
                    // The sum and the division in one pass; `first`: own + theirs in place
                    // (a world of two: no partial sums yet).
                    let r = kr.start - base + at..kr.start - base + at + n;
                    let acc =
                        (!first).then(|| acc_of(&self.tree_buf, self.acc_at, &self.tree_acc, r));
                    crate::dense::add_divide_into(piece, acc, theirs, world);
                    at += n;
                }
                self.spares.put(own);
                self.spares.put(outs);
                return Ok(Some(part_bytes));
            }
            let got = step.part.is_some();
            if let (true, Some(part)) = (all, step.part) {
                let n = kr.len();
                if first && part.as_ptr().align_offset(4) == 0 {
                    // own + theirs written where theirs arrived (warm from the socket, so
                    // no third buffer is read or written); that buffer then holds the
                    // partial sums, and the next step receives into the other one.
                    base = kr.start;
                    let at = part.as_ptr() as usize - self.rd_recv.as_ptr() as usize;
                    let acc: &mut [f32] =
                        bytemuck::cast_slice_mut(&mut self.rd_recv[at..at + 4 * n]);
                    let mut k = 0;
                    for_pieces(&batch, kr.clone(), |i, p| {
                        let m = p.len();
                        crate::dense::add_before(&mut acc[k..k + m], &batch[i][p]);
                        k += m;
                    });
                    std::mem::swap(&mut self.rd_recv, &mut self.tree_buf);
                    self.acc_at = Some(at);
                } else if first {
                    // Off a 4-byte boundary (the padding makes it rare): into `tree_acc`.
                    base = kr.start;
                    grow(&mut self.spec_parts, n);
                    let other = floats_in_place(part, &mut self.spec_parts[..n]);
                    self.tree_acc.resize(n, 0.0); // every element written below
                    let acc = &mut self.tree_acc;
                    let mut k = 0;
                    for_pieces(&batch, kr.clone(), |i, p| {
                        let (own, m) = (&batch[i][p.clone()], p.len());
                        crate::dense::add_into(&mut acc[k..k + m], own, &other[k..k + m]);
                        k += m;
                    });
                    self.acc_at = None;
                } else {
                    grow(&mut self.spec_parts, n);
                    let other = floats_in_place(part, &mut self.spec_parts[..n]);
                    <f32 as gradwire_collective::Element>::reduce(
                        gradwire_collective::ReduceOp::Sum,
                        acc_of_mut(
                            &mut self.tree_buf,
                            self.acc_at,
                            &mut self.tree_acc,
                            kr.start - base..kr.end - base,
                        ),
                        other,
                    );
                }
            }
            all &= got;
            (lo, hi) = keep;
            mask /= 2;
            first = false;
        }
        // The last step (mask 1) returned; only a world of one gets here, and it never
        // speculates (nothing to exchange): the normal path then runs.
        Ok(None)
    }
}
