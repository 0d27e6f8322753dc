//! The split across layers ([`Split::Pipeline`](super::Split::Pipeline)): consecutive
//! layers on consecutive partitions; each partition sends its last layer's activations
//! forward to the next and the gradient of its first layer's input back to the one before.
//!
//! Assignment: the layers are cut into `K` contiguous runs (each of at least one layer)
//! that minimize the largest run's forward multiply-adds per sample, so the partitions do
//! about equal work (the DistBelief paper gives no rule; its partitions are chosen by hand
//! per model). A wide MLP's hidden layers or LeNet's blocks (conv1, conv2, fc1, fc2, fc3)
//! are the units; `K` may not exceed the layer count.
//!
//! Schedule (GPipe, Huang et al. 2019, as a named option beyond the paper): the batch of `n`
//! is cut into `M = micro_batches` micro-batches (sizes differing by at most one; empty
//! ones skipped when `n < M`). Every micro-batch goes forward through every partition, then
//! every micro-batch goes backward; each partition keeps its activations of all `M` until
//! then. The last partition computes each micro-batch's loss gradient scaled by `1 / n`
//! (not `1 / size`), so the summed gradients are exactly the whole batch's mean-loss
//! gradient. `M = 1` is DistBelief's plain model-parallel step.
//!
//! The loss: the last partition sends the batch's mean loss (as an `f64`) to every other
//! partition right after its forwards; the others read it after their own forwards, before
//! their backwards. An evaluation runs the forwards only and the last partition sends the
//! sums of its [`Eval`] the same way.

use std::ops::Range;

use super::arch::Arch;
use super::layer::{Op, Scratch};
use super::link::{chunk, Link};
use super::plan::{Direction, Exchange, HeldTensor, Pattern, WholeTensor};
use super::{eval_logits, loss_and_grad, Passes, EVAL_CHUNK};
use crate::data::ImageBatch;
use crate::error::{Error, PartitionError, Result};
use crate::model::Eval;

/// The layers of each partition: contiguous runs minimizing the largest run's cost.
pub(crate) fn assign(arch: &Arch, k: usize) -> Result<Vec<Range<usize>>> {
    let l = arch.layers.len();
    if k == 0 || k > l {
        return Err(PartitionError::PipelineDepth {
            model: arch.kind,
            layers: arch.layers.iter().map(|x| x.name.clone()).collect(),
            partitions: k,
        }
        .into());
    }
    let cost: Vec<u64> = arch.layers.iter().map(|x| x.op.macs() as u64).collect();
    let mut prefix = vec![0u64; l + 1];
    for i in 0..l {
        prefix[i + 1] = prefix[i] + cost[i];
    }
    // best[j][i]: the least largest cost of the first i layers in j runs; cut[j][i] where
    // the last run starts.
    let mut best = vec![vec![u64::MAX; l + 1]; k + 1];
    let mut cut = vec![vec![0usize; l + 1]; k + 1];
    best[0][0] = 0;
    for j in 1..=k {
        for i in j..=l {
            for s in (j - 1)..i {
                if best[j - 1][s] == u64::MAX {
                    continue;
                }
                let c = best[j - 1][s].max(prefix[i] - prefix[s]);
                if c < best[j][i] {
                    best[j][i] = c;
                    cut[j][i] = s;
                }
            }
        }
    }
    let mut runs = vec![0..0; k];
    let mut end = l;
    for j in (1..=k).rev() {
        let s = cut[j][end];
        runs[j - 1] = s..end;
        end = s;
    }
    Ok(runs)
}

/// The tensors partition `p` holds (its layers' weights and biases, whole).
pub(crate) fn held(
    arch: &Arch,
    whole: &[WholeTensor],
    k: usize,
    p: usize,
) -> Result<Vec<HeldTensor>> {
    let run = assign(arch, k)?[p].clone();
    Ok((2 * run.start..2 * run.end)
        .map(|t| {
            let (r, c) = whole[t].matrix();
            HeldTensor::block(t, &whole[t], 0..r, 0..c)
        })
        .collect())
}

/// Micro-batches that are not empty for `n` samples cut `m` ways.
fn non_empty(n: usize, m: usize) -> usize {
    n.min(m)
}

/// The exchanges of one step of `n` samples in `m` micro-batches over `k` partitions.
pub(crate) fn exchanges(arch: &Arch, k: usize, n: usize, m: usize) -> Result<Vec<Exchange>> {
    let runs = assign(arch, k)?;
    let msgs = non_empty(n, m) as u64;
    let mut fwd = Vec::new();
    let mut bwd = Vec::new();
    for (p, run) in runs.iter().enumerate().take(k - 1) {
        let last = &arch.layers[run.end - 1];
        let values = n * last.op.out_per_sample();
        let bytes = 4 * values as u64 + msgs;
        fwd.push(Exchange {
            at: format!("{} output", last.name),
            direction: Direction::Forward,
            pattern: Pattern::Send { from: p, to: p + 1 },
            values,
            bytes,
        });
        bwd.push(Exchange {
            at: format!("{} output gradient", last.name),
            direction: Direction::Backward,
            pattern: Pattern::Send { from: p + 1, to: p },
            values,
            bytes,
        });
    }
    if k > 1 {
        fwd.push(Exchange {
            at: "loss".into(),
            direction: Direction::Forward,
            pattern: Pattern::Broadcast { from: k - 1 },
            values: 1,
            bytes: 9 * (k as u64 - 1),
        });
    }
    bwd.reverse();
    fwd.extend(bwd);
    Ok(fwd)
}

/// What one micro-batch leaves between its forward and backward passes.
#[derive(Debug, Default)]
struct Slot {
    /// `acts[i]`: layer `i`'s input; `acts[L]`: the last layer's output.
    acts: Vec<Vec<f32>>,
    scratch: Vec<Scratch>,
    /// The last partition's gradient of the logits.
    glogits: Vec<f32>,
}

impl Slot {
    fn sized(&mut self, layers: usize) {
        self.acts.resize_with(layers + 1, Vec::new);
        self.scratch.resize_with(layers, Scratch::default);
    }
}

/// One partition of a model split across its layers.
pub(crate) struct Pipeline {
    index: usize,
    parts: usize,
    micro: usize,
    classes: usize,
    inputs: usize,
    ops: Vec<Op>,
    /// Where each layer's weight starts in the partition's parameters (one more: the end).
    offs: Vec<usize>,
    slots: Vec<Slot>,
    gy: Vec<f32>,
    gx: Vec<f32>,
}

impl Pipeline {
    /// Partition `p` of `k` running `micro` micro-batches, whose tensors (from [`held`])
    /// have `params` values in all.
    pub(crate) fn new(
        arch: &Arch,
        params: usize,
        (k, p): (usize, usize),
        micro: usize,
    ) -> Result<Pipeline> {
        let run = assign(arch, k)?[p].clone();
        let ops: Vec<Op> = arch.layers[run].iter().map(|l| l.op.clone()).collect();
        let mut offs = vec![0];
        for op in &ops {
            offs.push(offs[offs.len() - 1] + op.weight_len() + op.bias_len());
        }
        Error::check_len("pipeline partition parameters", offs[ops.len()], params)?;
        Ok(Pipeline {
            index: p,
            parts: k,
            micro,
            classes: arch.classes,
            inputs: arch.inputs(),
            ops,
            offs,
            slots: Vec::new(),
            gy: Vec::new(),
            gx: Vec::new(),
        })
    }

    fn first(&self) -> bool {
        self.index == 0
    }

    fn last(&self) -> bool {
        self.index + 1 == self.parts
    }

    /// Forward pass of the `n` samples of `range` through this partition's layers (with
    /// parameters `params`) into `slot`: the input comes from the images (first partition)
    /// or the partition before; the output goes to the next partition unless this is the
    /// last.
    fn forward(
        &self,
        params: &[f32],
        pixels: &[f32],
        range: Range<usize>,
        slot: &mut Slot,
        link: &mut Link,
    ) -> Result<()> {
        let n = range.len();
        let ops = &self.ops;
        slot.sized(ops.len());
        slot.acts[0].resize(n * ops[0].in_per_sample(), 0.0);
        if self.first() {
            slot.acts[0]
                .copy_from_slice(&pixels[range.start * self.inputs..range.end * self.inputs]);
        } else {
            link.recv(self.index - 1, &mut slot.acts[0])?;
        }
        for (i, op) in ops.iter().enumerate() {
            let (before, after) = slot.acts.split_at_mut(i + 1);
            let y = &mut after[0];
            y.resize(n * op.out_per_sample(), 0.0);
            let p = &params[self.offs[i]..self.offs[i + 1]];
            op.forward(p, &before[i], y, n, &mut slot.scratch[i]);
        }
        if !self.last() {
            link.send(self.index + 1, &slot.acts[ops.len()])?;
        }
        Ok(())
    }
}

impl Passes for Pipeline {
    fn forward_backward(
        &mut self,
        params: &[f32],
        b: &ImageBatch,
        grads: &mut Vec<f32>,
        link: &mut Link,
    ) -> Result<f32> {
        let m = non_empty(b.labels.len(), self.micro);
        let mut slots = std::mem::take(&mut self.slots);
        slots.resize_with(m.max(slots.len()), Slot::default);
        let (mut gy, mut gx) = (std::mem::take(&mut self.gy), std::mem::take(&mut self.gx));
        let got = self.step(params, b, m, &mut slots, (&mut gy, &mut gx), grads, link);
        self.slots = slots;
        (self.gy, self.gx) = (gy, gx);
        got
    }

    fn evaluate(&self, params: &[f32], b: &ImageBatch, link: &mut Link) -> Result<Eval> {
        let mut slot = Slot::default();
        let mut eval = Eval::default();
        let n = b.labels.len();
        let mut start = 0;
        while start < n {
            let end = (start + EVAL_CHUNK).min(n);
            self.forward(params, &b.pixels, start..end, &mut slot, link)?;
            if self.last() {
                let logits = &slot.acts[self.ops.len()];
                eval_logits(logits, &b.labels[start..end], self.classes, &mut eval);
            }
            start = end;
        }
        let mut sums = [eval.loss_sum, eval.correct as f64, eval.n as f64];
        if self.last() {
            for p in 0..self.parts - 1 {
                link.send(p, &sums)?;
            }
        } else {
            link.recv(self.parts - 1, &mut sums)?;
            eval = Eval {
                loss_sum: sums[0],
                correct: sums[1] as u64,
                n: sums[2] as u64,
            };
        }
        Ok(eval)
    }
}

impl Pipeline {
    /// One training step of `m` micro-batches with parameters `params` (see the module doc).
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        params: &[f32],
        b: &ImageBatch,
        m: usize,
        slots: &mut [Slot],
        (gy, gx): (&mut Vec<f32>, &mut Vec<f32>),
        grads: &mut Vec<f32>,
        link: &mut Link,
    ) -> Result<f32> {
        let n = b.labels.len();
        let l = self.ops.len();
        let mut loss_sum = 0.0f64;
        for (j, slot) in slots.iter_mut().enumerate().take(m) {
            let range = chunk(n, m, j);
            self.forward(params, &b.pixels, range.clone(), slot, link)?;
            if self.last() {
                let k = range.len();
                slot.glogits.resize(k * self.classes, 0.0);
                loss_sum += loss_and_grad(
                    &slot.acts[l],
                    &b.labels[range],
                    self.classes,
                    n,
                    &mut slot.glogits,
                );
            }
        }
        let mut loss = [loss_sum / n as f64];
        if self.last() {
            for p in 0..self.parts - 1 {
                link.send(p, &loss)?;
            }
        } else {
            link.recv(self.parts - 1, &mut loss)?;
        }
        grads.clear();
        grads.resize(params.len(), 0.0);
        for (j, slot) in slots.iter_mut().enumerate().take(m) {
            let k = chunk(n, m, j).len();
            gy.resize(k * self.ops[l - 1].out_per_sample(), 0.0);
            if self.last() {
                gy.copy_from_slice(&slot.glogits);
            } else {
                link.recv(self.index + 1, gy)?;
            }
            for (i, op) in self.ops.iter().enumerate().rev() {
                let wants_gx = i > 0 || !self.first();
                gx.resize(k * op.in_per_sample(), 0.0);
                let (lo, hi) = (self.offs[i], self.offs[i + 1]);
                op.backward(
                    &params[lo..hi],
                    &slot.acts[i],
                    &slot.acts[i + 1],
                    gy,
                    &mut grads[lo..hi],
                    wants_gx.then_some(&mut gx[..]),
                    k,
                    &mut slot.scratch[i],
                );
                std::mem::swap(gy, gx);
            }
            if !self.first() {
                link.send(self.index - 1, gy)?;
            }
        }
        Ok(loss[0] as f32)
    }
}
