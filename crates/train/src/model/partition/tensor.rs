//! The split within layers ([`Split::Tensor`](super::Split::Tensor)) of an MLP: every
//! partition holds a slice of the units of every fully connected layer, paired as Megatron-LM
//! pairs them (Shoeybi et al. 2019) so one all-reduce per pair of layers suffices forward and
//! one backward.
//!
//! A pair is a *column* layer then a *row* layer. The column layer `y = relu(x A + a)` keeps
//! the columns (output units) `c_p` of `A` and `a`: with the input `x` on every partition,
//! each computes its own `y[:, c_p]`, no message. The row layer `z = y B + b` keeps the rows
//! `c_p` of `B`, so `y[:, c_p] B[c_p, :]` is a partial sum of `z`; one all-reduce of the
//! partial sums gives every partition the whole `z` (the bias `b` is held by partition 0,
//! which adds it to its partial sum before the all-reduce), then each applies the ReLU.
//! Backward mirrors it: the gradient of `z` is on every partition, each computes the
//! gradients of its own rows of `B` and of its own columns of `y`, then of `A`, `a`, and a
//! partial sum of the gradient of `x`, all-reduced once (not at all for the first pair,
//! whose input is the data).
//!
//! Odd layer counts: the *first* layer is then a row layer alone, its rows being input
//! features. The images are on every partition, so each reads its own features in place
//! (no message); its output is all-reduced forward, and backward it needs nothing (no
//! gradient flows into the data). The output layer is always the last row layer, so the
//! logits, the loss and its gradient are on every partition and computed there alike: the
//! loss needs no message. A layer split over `K` partitions needs at least `K` units (input
//! features for a lone first layer).
//!
//! Exchanges per step: forward one all-reduce per pair (plus one for a lone first layer),
//! backward one per pair but the first (plus one when the first layer is alone). The ring
//! all-reduce gives every partition the same bits, so the replicated activations never drift.

use std::ops::Range;

use super::arch::Arch;
use super::layer::Op;
use super::link::{chunk, Link};
use super::plan::{all_reduce_bytes, Direction, Exchange, HeldTensor, Pattern, WholeTensor};
use super::{eval_logits, loss_and_grad, Passes, EVAL_CHUNK};
use crate::data::ImageBatch;
use crate::error::{Error, PartitionError, Result};
use crate::model::cpu_lenet::{add_bias, add_col_sums, linear_forward, mat, matmul, relu_mask};
use crate::model::Eval;

/// How the layers group: a lone first row layer when the count is odd, then pairs.
fn groups(layers: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    if layers % 2 == 1 {
        out.push(0..1);
        i = 1;
    }
    while i + 1 < layers {
        out.push(i..i + 2);
        i += 2;
    }
    out
}

/// A fully connected layer's `(fan_in, fan_out)`, or an error for any other.
fn dims(arch: &Arch, i: usize) -> Result<(usize, usize)> {
    match arch.layers[i].op {
        Op::Linear {
            fan_in, fan_out, ..
        } => Ok((fan_in, fan_out)),
        _ => Err(PartitionError::NotLinear {
            model: arch.kind,
            layer: arch.layers[i].name.clone(),
        }
        .into()),
    }
}

/// The tensors partition `p` of `k` holds, in flat order.
pub(crate) fn held(
    arch: &Arch,
    whole: &[WholeTensor],
    k: usize,
    p: usize,
) -> Result<Vec<HeldTensor>> {
    let mut out = Vec::new();
    for g in groups(arch.layers.len()) {
        for (pos, i) in g.clone().enumerate() {
            let (fan_in, fan_out) = dims(arch, i)?;
            let (w, b) = (2 * i, 2 * i + 1);
            let column = g.len() == 2 && pos == 0;
            let split = if column { fan_out } else { fan_in };
            if split < k {
                return Err(PartitionError::TooNarrow {
                    model: arch.kind,
                    layer: arch.layers[i].name.clone(),
                    count: split,
                    what: if column { "units" } else { "inputs" },
                    partitions: k,
                }
                .into());
            }
            let c = chunk(split, k, p);
            if column {
                out.push(HeldTensor::block(w, &whole[w], 0..fan_in, c.clone()));
                out.push(HeldTensor::block(b, &whole[b], 0..1, c));
            } else {
                out.push(HeldTensor::block(w, &whole[w], c, 0..fan_out));
                if p == 0 {
                    out.push(HeldTensor::block(b, &whole[b], 0..1, 0..fan_out));
                }
            }
        }
    }
    Ok(out)
}

/// The exchanges of one step of `n` samples over `k` partitions.
pub(crate) fn exchanges(arch: &Arch, k: usize, n: usize) -> Result<Vec<Exchange>> {
    let gs = groups(arch.layers.len());
    let mut fwd = Vec::new();
    let mut bwd = Vec::new();
    for (gi, g) in gs.iter().enumerate() {
        let last = g.end - 1;
        let (_, out) = dims(arch, last)?;
        let values = n * out;
        fwd.push(Exchange {
            at: format!("{} output", arch.layers[last].name),
            direction: Direction::Forward,
            pattern: Pattern::AllReduce,
            values,
            bytes: all_reduce_bytes(values, k),
        });
        if gi > 0 {
            let (fan_in, _) = dims(arch, g.start)?;
            let values = n * fan_in;
            bwd.push(Exchange {
                at: format!("{} input gradient", arch.layers[g.start].name),
                direction: Direction::Backward,
                pattern: Pattern::AllReduce,
                values,
                bytes: all_reduce_bytes(values, k),
            });
        }
    }
    bwd.reverse();
    fwd.extend(bwd);
    Ok(fwd)
}

/// A column layer's slice: `units` output units of `fan_in` inputs; weight at `w`, bias
/// at `b` in the partition's flat buffer.
#[derive(Debug, Clone)]
struct Column {
    fan_in: usize,
    units: usize,
    w: usize,
    b: usize,
}

/// A row layer's slice: input rows `rows` of `fan_in` (in the input's full width
/// `stride`), `fan_out` outputs; the bias on partition 0 only.
#[derive(Debug, Clone)]
struct Row {
    rows: Range<usize>,
    stride: usize,
    fan_out: usize,
    relu: bool,
    w: usize,
    b: Option<usize>,
}

#[derive(Debug, Clone)]
struct Group {
    column: Option<Column>,
    row: Row,
}

/// Buffers of one step, reused.
#[derive(Debug, Default)]
struct Work {
    /// `acts[g]`: group `g`'s input (every partition has the whole of it); `acts[G]`: the
    /// logits.
    acts: Vec<Vec<f32>>,
    /// The column layers' outputs (this partition's units).
    ys: Vec<Vec<f32>>,
    ga: Vec<f32>,
    gx: Vec<f32>,
    gy: Vec<f32>,
    scratch: Vec<f32>,
}

/// One partition of an MLP split within its layers.
pub(crate) struct TensorMlp {
    classes: usize,
    inputs: usize,
    groups: Vec<Group>,
    work: Work,
}

impl TensorMlp {
    /// Partition `p` of `k`, whose tensors (from [`held`]) have `params` values in all.
    pub(crate) fn new(arch: &Arch, params: usize, k: usize, p: usize) -> Result<TensorMlp> {
        let mut groups_out = Vec::new();
        let mut at = 0;
        let mut take = |len: usize| {
            let o = at;
            at += len;
            o
        };
        for g in groups(arch.layers.len()) {
            let column = if g.len() == 2 {
                let (fan_in, fan_out) = dims(arch, g.start)?;
                let units = chunk(fan_out, k, p).len();
                let w = take(fan_in * units);
                let b = take(units);
                Some(Column {
                    fan_in,
                    units,
                    w,
                    b,
                })
            } else {
                None
            };
            let i = g.end - 1;
            let (fan_in, fan_out) = dims(arch, i)?;
            let rows = chunk(fan_in, k, p);
            let w = take(rows.len() * fan_out);
            let b = (p == 0).then(|| take(fan_out));
            let relu = matches!(arch.layers[i].op, Op::Linear { relu: true, .. });
            let stride = if column.is_some() { rows.len() } else { fan_in };
            groups_out.push(Group {
                column,
                row: Row {
                    rows: if g.len() == 2 { 0..rows.len() } else { rows },
                    stride,
                    fan_out,
                    relu,
                    w,
                    b,
                },
            });
        }
        Error::check_len("tensor-split partition parameters", at, params)?;
        Ok(TensorMlp {
            classes: arch.classes,
            inputs: arch.inputs(),
            groups: groups_out,
            work: Work::default(),
        })
    }

    /// The forward pass of `n` samples whose images are in `work.acts[0]`; the logits end
    /// in `work.acts[G]`.
    fn forward(groups: &[Group], p: &[f32], n: usize, w: &mut Work, link: &mut Link) -> Result<()> {
        for (g, grp) in groups.iter().enumerate() {
            let (before, after) = w.acts.split_at_mut(g + 1);
            let x = &before[g];
            let z = &mut after[0];
            let r = &grp.row;
            z.resize(n * r.fan_out, 0.0);
            let k_rows = r.rows.len();
            let w_row = &p[r.w..r.w + k_rows * r.fan_out];
            match &grp.column {
                Some(c) => {
                    let y = &mut w.ys[g];
                    y.resize(n * c.units, 0.0);
                    let a = (&p[c.w..c.w + c.fan_in * c.units], &p[c.b..c.b + c.units]);
                    linear_forward(n, (c.fan_in, c.units), x, a, y, true);
                    matmul(
                        n,
                        r.fan_out,
                        k_rows,
                        z,
                        r.fan_out,
                        false,
                        mat(y, c.units, 1),
                        mat(w_row, r.fan_out, 1),
                    );
                }
                None => matmul(
                    n,
                    r.fan_out,
                    k_rows,
                    z,
                    r.fan_out,
                    false,
                    mat(&x[r.rows.start..], r.stride, 1),
                    mat(w_row, r.fan_out, 1),
                ),
            }
            if let Some(b) = r.b {
                add_bias(z, &p[b..b + r.fan_out]);
            }
            link.all_reduce(z, &mut w.scratch)?;
            if r.relu {
                for v in z.iter_mut() {
                    *v = v.max(0.0);
                }
            }
        }
        Ok(())
    }

    /// Sizes the buffers for the groups and copies `n` images into `acts[0]`.
    fn load(&self, w: &mut Work, pixels: &[f32]) {
        w.acts.resize_with(self.groups.len() + 1, Vec::new);
        w.ys.resize_with(self.groups.len(), Vec::new);
        w.acts[0].clear();
        w.acts[0].extend_from_slice(pixels);
    }
}

impl Passes for TensorMlp {
    fn forward_backward(
        &mut self,
        p: &[f32],
        b: &ImageBatch,
        grads: &mut Vec<f32>,
        link: &mut Link,
    ) -> Result<f32> {
        let n = b.labels.len();
        let mut w = std::mem::take(&mut self.work);
        self.load(&mut w, &b.pixels);
        let got = (|| {
            Self::forward(&self.groups, p, n, &mut w, link)?;
            let nc = self.classes;
            let gcount = self.groups.len();
            w.ga.resize(n * nc, 0.0);
            let loss =
                (loss_and_grad(&w.acts[gcount], &b.labels, nc, n, &mut w.ga) / n as f64) as f32;
            grads.clear();
            grads.resize(p.len(), 0.0);
            for (g, grp) in self.groups.iter().enumerate().rev() {
                let r = &grp.row;
                let k_rows = r.rows.len();
                if r.relu {
                    relu_mask(&mut w.ga, &w.acts[g + 1]);
                }
                let x_row: (&[f32], usize) = match &grp.column {
                    Some(c) => (&w.ys[g], c.units),
                    None => (&w.acts[g][r.rows.start..], r.stride),
                };
                matmul(
                    k_rows,
                    r.fan_out,
                    n,
                    &mut grads[r.w..r.w + k_rows * r.fan_out],
                    r.fan_out,
                    false,
                    mat(x_row.0, 1, x_row.1),
                    mat(&w.ga, r.fan_out, 1),
                );
                if let Some(bo) = r.b {
                    add_col_sums(&w.ga, &mut grads[bo..bo + r.fan_out]);
                }
                let Some(c) = &grp.column else {
                    // A lone row layer is the first: no gradient flows into the images.
                    continue;
                };
                w.gy.resize(n * c.units, 0.0);
                matmul(
                    n,
                    c.units,
                    r.fan_out,
                    &mut w.gy,
                    c.units,
                    false,
                    mat(&w.ga, r.fan_out, 1),
                    mat(&p[r.w..r.w + k_rows * r.fan_out], 1, r.fan_out),
                );
                relu_mask(&mut w.gy, &w.ys[g]);
                matmul(
                    c.fan_in,
                    c.units,
                    n,
                    &mut grads[c.w..c.w + c.fan_in * c.units],
                    c.units,
                    false,
                    mat(&w.acts[g], 1, c.fan_in),
                    mat(&w.gy, c.units, 1),
                );
                add_col_sums(&w.gy, &mut grads[c.b..c.b + c.units]);
                if g > 0 {
                    w.gx.resize(n * c.fan_in, 0.0);
                    matmul(
                        n,
                        c.fan_in,
                        c.units,
                        &mut w.gx,
                        c.fan_in,
                        false,
                        mat(&w.gy, c.units, 1),
                        mat(&p[c.w..c.w + c.fan_in * c.units], 1, c.units),
                    );
                    link.all_reduce(&mut w.gx, &mut w.scratch)?;
                    std::mem::swap(&mut w.ga, &mut w.gx);
                }
            }
            Ok(loss)
        })();
        self.work = w;
        got
    }

    fn evaluate(&self, p: &[f32], b: &ImageBatch, link: &mut Link) -> Result<Eval> {
        let mut w = Work::default();
        let mut eval = Eval::default();
        let per = self.inputs;
        for (px, labels) in b
            .pixels
            .chunks(EVAL_CHUNK * per)
            .zip(b.labels.chunks(EVAL_CHUNK))
        {
            self.load(&mut w, px);
            Self::forward(&self.groups, p, labels.len(), &mut w, link)?;
            eval_logits(&w.acts[self.groups.len()], labels, self.classes, &mut eval);
        }
        Ok(eval)
    }
}
