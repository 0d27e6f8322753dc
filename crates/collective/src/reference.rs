//! Naive oracles for the collectives, for tests (feature `test-util`): what every rank
//! should hold afterwards, computed from all ranks' inputs at once.

use crate::{chunks, Element, ReduceOp};

/// The all-reduce of `inputs[r]` (one per rank), reduced in rank order.
pub fn all_reduce<E: Element>(inputs: &[Vec<E>], op: ReduceOp) -> Vec<E> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        assert_eq!(x.len(), acc.len());
        E::reduce(op, &mut acc, x);
    }
    crate::element::finish(op, &mut acc, inputs.len());
    acc
}

/// What rank `rank` owns after a reduce-scatter: its chunk of the all-reduce.
pub fn reduce_scatter<E: Element>(inputs: &[Vec<E>], op: ReduceOp, rank: usize) -> Vec<E> {
    let all = all_reduce(inputs, op);
    all[chunks::range(all.len(), inputs.len(), rank)].to_vec()
}

/// The in-place all-gather: chunk `r` taken from rank `r`'s buffer.
pub fn all_gather<E: Element>(inputs: &[Vec<E>]) -> Vec<E> {
    let n = inputs.len();
    let len = inputs[0].len();
    let mut out = Vec::with_capacity(len);
    for (r, x) in inputs.iter().enumerate() {
        out.extend_from_slice(&x[chunks::range(len, n, r)]);
    }
    out
}

/// The concatenation of every rank's contribution.
pub fn concat<E: Clone>(inputs: &[Vec<E>]) -> Vec<E> {
    inputs.concat()
}
