//! An all-reduce of a known pattern, verified exactly: rank `r` contributes
//! `(r + 1) * (i % 7 + iter)` at element `i` of iteration `iter`; integer-valued inputs make
//! the sum exact whatever the reduction order, so every element must equal
//! `P(P+1)/2 * (i % 7 + iter)`.

use std::time::{Duration, Instant};

use gradwire_transport::Transport;

use super::{BenchError, HierarchicalAllReduce};
use crate::{Algorithm, Collectives, ReduceOp};

/// Fills `buf` with this rank's pattern for `iter`, all-reduces it (through `hier` when
/// given, else flat with `algo`) and checks every element. Returns the all-reduce's time.
/// Every rank calls it with the same length and iteration.
pub fn check_iteration(
    t: &mut dyn Transport,
    hier: Option<&mut dyn HierarchicalAllReduce>,
    algo: Algorithm,
    buf: &mut [f32],
    iter: usize,
) -> Result<Duration, BenchError> {
    let (rank, world) = (t.rank(), t.world_size());
    let total = (world * (world + 1) / 2) as f32;
    for (i, x) in buf.iter_mut().enumerate() {
        *x = ((rank + 1) * (i % 7 + iter)) as f32;
    }
    let start = Instant::now();
    match hier {
        Some(h) => h.all_reduce_f32(t, buf, ReduceOp::Sum)?,
        None => t.all_reduce_with(buf, ReduceOp::Sum, algo)?,
    }
    let elapsed = start.elapsed();
    let expected = |i: usize| total * (i % 7 + iter) as f32;
    if let Some((index, &got)) = buf.iter().enumerate().find(|&(i, &x)| x != expected(i)) {
        return Err(BenchError::Mismatch {
            rank,
            index,
            got,
            expected: expected(index),
        });
    }
    Ok(elapsed)
}
