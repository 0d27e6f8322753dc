//! Recursive-doubling all-reduce: `log2 P` full-buffer exchanges, for latency-bound
//! (small) messages. Any world size, through the [`fold`](crate::fold).
//!
//! Both partners of an exchange compute `mine + theirs` with a commutative operation, so
//! every rank ends with bit-identical results.

use gradwire_transport::Transport;

use crate::exchange::{folded, reduce_steps, seg_elems, Step};
use crate::fold::{doubling_partners, Fold};
use crate::scratch::Scratch;
use crate::{chunks, element, Element, ReduceOp, Result};

/// Recursive-doubling all-reduce of `buf` in place.
pub fn all_reduce<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    seg_bytes: usize,
) -> Result<()> {
    let world = t.world_size();
    let nseg = chunks::segments(buf.len(), seg_elems::<E>(seg_bytes));
    folded(t, buf, op, nseg, |t, fold, vrank, buf, scratch| {
        core(t, fold, vrank, buf, op, nseg, scratch)?;
        element::finish(op, buf, world);
        Ok(())
    })
}

fn core<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    fold: &Fold,
    vrank: usize,
    buf: &mut [E],
    op: ReduceOp,
    nseg: usize,
    scratch: &mut Scratch,
) -> Result<()> {
    let len = buf.len();
    let partners: Vec<usize> = doubling_partners(vrank, fold.p2)
        .map(|pv| fold.real(pv))
        .collect();
    reduce_steps(t, buf, op, partners.len() * nseg, scratch, |i| {
        let partner = partners[i / nseg];
        let r = chunks::range(len, nseg, i % nseg);
        Step {
            to: partner,
            from: partner,
            send: r.clone(),
            recv: r,
        }
    })
}
