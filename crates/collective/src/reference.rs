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

/// One all-reduce of the quantized ring (Dryden; [`crate::compressed::QuantizedAllReduce`])
/// written out with independent codec instances: `bufs[r]` is rank `r`'s input; at each of
/// the `P-1` reduce-scatter hops every rank compresses the chunk it forwards with its codec
/// for that chunk (`rs[r][chunk]`), and the receiver adds the decoded payload in full
/// precision; then each owner compresses its reduced chunk once (`ag[owner]`) and the
/// decoded chunks are laid end to end. Returns that sum (not yet divided); the codecs keep
/// their state (residuals) for the next step.
pub fn quantized_ring(
    rs: &mut [Vec<Box<dyn gradwire_codec::Codec>>],
    ag: &mut [Box<dyn gradwire_codec::Codec>],
    mut bufs: Vec<Vec<f32>>,
) -> Vec<f32> {
    use crate::ring::{left, reduce_scatter_step};
    let (world, len) = (bufs.len(), bufs.first().map_or(0, Vec::len));
    let range = |c| chunks::range(len, world, c);
    for s in 0..world.saturating_sub(1) {
        let payloads: Vec<Vec<u8>> = (0..world)
            .map(|r| {
                let (sc, _) = reduce_scatter_step(r, world, s);
                let mut p = Vec::new();
                rs[r][sc].encode(&bufs[r][range(sc)], &mut p);
                p
            })
            .collect();
        for r in 0..world {
            let (_, rc) = reduce_scatter_step(r, world, s);
            rs[r][rc]
                .decode_add(&payloads[left(r, world)], &mut bufs[r][range(rc)])
                .expect("the reference decodes its own payloads");
        }
    }
    let mut out = vec![0.0f32; len];
    for c in 0..world {
        let mut p = Vec::new();
        ag[c].encode(&bufs[c][range(c)], &mut p);
        ag[0]
            .decode_add(&p, &mut out[range(c)])
            .expect("the reference decodes its own payloads");
    }
    out
}

/// Gather-decode ([`crate::compressed::GatherDecode`]) written out: the codecs' shared scalars
/// (if any) agreed as the element-wise max over ranks, every rank's gradient (`grads[r]`)
/// encoded with its codec (`codecs[r]`), and every payload decoded in rank order into one sum.
/// Returns that sum (not yet divided); the codecs keep their state for the next step.
pub fn gather_decode(
    codecs: &mut [Box<dyn gradwire_codec::Codec>],
    grads: &[Vec<f32>],
) -> Vec<f32> {
    let shared = codecs
        .iter_mut()
        .zip(grads)
        .filter_map(|(c, g)| c.shared_scalars().map(|s| s.local_scalars(g)))
        .reduce(|a, b| a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect());
    let mut payloads = Vec::new();
    for (c, g) in codecs.iter_mut().zip(grads) {
        if let (Some(s), Some(c)) = (&shared, c.shared_scalars()) {
            c.set_shared_scalars(s);
        }
        let mut p = Vec::new();
        c.encode(g, &mut p);
        payloads.push(p);
    }
    let mut sum = vec![0.0f32; grads.first().map_or(0, Vec::len)];
    for p in &payloads {
        codecs[0]
            .decode_add(p, &mut sum)
            .expect("the reference decodes its own payloads");
    }
    sum
}

/// The sparse all-reduce ([`crate::compressed::SparseAllReduce`]) written out: every rank's
/// (index, value) pairs (`codecs[r]`'s [`gradwire_codec::SparseEncode`] of `grads[r]`) added
/// into one dense sum, in rank order. The codecs keep their state for the next step; panics
/// on a codec that does not sparsify.
pub fn sparse_sum(codecs: &mut [Box<dyn gradwire_codec::Codec>], grads: &[Vec<f32>]) -> Vec<f32> {
    let mut sum = vec![0.0f32; grads.first().map_or(0, Vec::len)];
    let mut s = gradwire_codec::SparseGrad::default();
    for (c, g) in codecs.iter_mut().zip(grads) {
        let c = c.sparse_encode().expect("a sparsifier");
        c.encode_sparse(g, &mut s);
        for (&i, &v) in s.indices.iter().zip(&s.values) {
            sum[i as usize] += v;
        }
    }
    sum
}
