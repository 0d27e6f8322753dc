//! Packing and unpacking: tensors laid end to end and back (fusion, unfusion), fused payloads
//! split per tensor, and the mean written back into the items.

use gradwire_codec::SparseGrad;
use gradwire_collective::compressed::{SparseAllReduce, SparseSum};
use gradwire_transport::Transport;

use super::{Clock, Item};
use crate::error::Result;
use crate::timeline::Phase;
use crate::wire::Reader;

pub(super) fn mean(buf: &mut [f32], world: usize) {
    if world > 1 {
        let n = world as f32;
        buf.iter_mut().for_each(|x| *x /= n);
    }
}

/// Writes the mean of a sparse all-reduce's sum (`sum / world`, as [`mean`] computes it) into
/// the items, laid out as [`fuse_into`] lays them: one pass per item, with no dense
/// intermediate (a dense sum is divided as it is copied; sparse pairs are scattered into the
/// zeroed item).
pub(super) fn write_mean(sum: SparseSum<'_>, items: &mut [Item<'_>], world: usize) {
    let n = world as f32;
    let div = |x: f32| if world > 1 { x / n } else { x };
    match sum {
        SparseSum::Dense(d) => {
            let mut off = 0;
            for it in items.iter_mut() {
                let len = it.data.len();
                for (a, &x) in it.data.iter_mut().zip(&d[off..off + len]) {
                    *a = div(x);
                }
                off += len;
            }
        }
        SparseSum::Sparse(s) => {
            let (mut off, mut j) = (0usize, 0usize);
            for it in items.iter_mut() {
                it.data.fill(0.0);
                let end = off + it.data.len();
                while j < s.indices.len() && (s.indices[j] as usize) < end {
                    // `0.0 + v` as the dense path's zeroed buffer plus a scatter gives it.
                    it.data[s.indices[j] as usize - off] = div(0.0 + s.values[j]);
                    j += 1;
                }
                off = end;
            }
        }
    }
}

/// Sums every rank's `pairs` (indices into the items' concatenation) with the sparse
/// all-reduce and writes the mean straight into the items ([`write_mean`]: no dense
/// accumulator to zero and copy).
pub(super) fn sum_pairs_into(
    sparse: &mut SparseAllReduce,
    t: &mut dyn Transport,
    pairs: &SparseGrad,
    items: &mut [Item<'_>],
    clock: &mut Clock,
) -> Result<()> {
    let len = items.iter().map(|it| it.data.len()).sum();
    let world = t.world_size();
    let res = sparse.all_reduce_pairs_sum(t, pairs, len);
    clock.mark(Phase::Wire);
    let res = res.map(|sum| write_mean(sum, items, world));
    clock.mark(Phase::Unfuse);
    Ok(res?)
}

/// Splits each rank's message (`n` times u32 length + bytes) into its `n` parts.
pub(super) fn split_all(gathered: &[Vec<u8>], n: usize) -> Result<Vec<Vec<&[u8]>>> {
    gathered
        .iter()
        .enumerate()
        .map(|(peer, msg)| {
            let mut r = Reader::new(peer, msg);
            let parts = (0..n)
                .map(|_| {
                    let len = r.u32()? as usize;
                    r.bytes(len)
                })
                .collect::<Result<Vec<_>>>()?;
            if r.remaining() != 0 {
                return Err(r.err("trailing bytes after the fused payloads"));
            }
            Ok(parts)
        })
        .collect()
}

/// `buf` becomes the items' data laid end to end (fusion).
pub(super) fn fuse_into(items: &[Item<'_>], buf: &mut Vec<f32>) {
    buf.clear();
    for it in items {
        buf.extend_from_slice(it.data);
    }
}

/// Each item's data takes its slice of `buf`, laid out as [`fuse_into`] laid it (unfusion).
pub(super) fn unfuse_from(items: &mut [Item<'_>], buf: &[f32]) {
    let mut off = 0;
    for it in items.iter_mut() {
        let n = it.data.len();
        it.data.copy_from_slice(&buf[off..off + n]);
        off += n;
    }
}
