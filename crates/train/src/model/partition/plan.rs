//! The partition plan: which partition holds which slice of which tensor, and what crosses
//! the partition boundaries per step; printed at start ([`Display`](std::fmt::Display)) and
//! recorded in JSON (serde). It is also the map between the whole model's flat parameters
//! and each partition's ([`PartitionPlan::slice`], [`PartitionPlan::assemble`]).
//!
//! A tensor is seen as a matrix of `shape[0]` rows (1 for a bias) by the product of the rest
//! of its shape; a partition holds a block of rows and columns of it. Byte counts are
//! payload as this module's messages carry it: 4 bytes per value, plus a 1-byte tag per
//! message.

use std::ops::Range;

use super::split::Split;
use crate::error::{Error, PartitionError, Result};

/// One tensor of the whole (unpartitioned) model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WholeTensor {
    /// Its name in the whole model (`hidden.0.weight`).
    pub name: String,
    /// Its shape in burn's layout.
    pub shape: Vec<usize>,
    /// Element count.
    pub elements: usize,
}

impl WholeTensor {
    /// Rows and columns of its matrix view.
    pub fn matrix(&self) -> (usize, usize) {
        let rows = if self.shape.len() >= 2 {
            self.shape[0]
        } else {
            1
        };
        (rows, self.elements.checked_div(rows).unwrap_or(0))
    }
}

/// A block of one whole tensor held by one partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeldTensor {
    /// The block's name: the tensor's, with the block when it is not the whole tensor
    /// (`hidden.0.weight[cols 0..1024]`, `out.weight[rows 1024..2048]`).
    pub name: String,
    /// Index of the tensor in [`PartitionPlan::tensors`].
    pub tensor: usize,
    /// Rows of the tensor's matrix view held, `[start, end)`.
    pub rows: [usize; 2],
    /// Columns held, `[start, end)`.
    pub cols: [usize; 2],
    /// The block's shape (the tensor's own shape when held whole).
    pub shape: Vec<usize>,
    /// Element count.
    pub elements: usize,
    /// Bytes as `f32`.
    pub bytes: usize,
}

impl HeldTensor {
    /// The block `rows x cols` of tensor `index` (`whole`).
    pub(crate) fn block(
        index: usize,
        whole: &WholeTensor,
        rows: Range<usize>,
        cols: Range<usize>,
    ) -> HeldTensor {
        let (r, c) = whole.matrix();
        let (name, shape) = if rows == (0..r) && cols == (0..c) {
            (whole.name.clone(), whole.shape.clone())
        } else if rows == (0..r) {
            let shape = if whole.shape.len() >= 2 {
                vec![r, cols.len()]
            } else {
                vec![cols.len()]
            };
            (
                format!("{}[cols {}..{}]", whole.name, cols.start, cols.end),
                shape,
            )
        } else {
            let mut shape = whole.shape.clone();
            shape[0] = rows.len();
            (
                format!("{}[rows {}..{}]", whole.name, rows.start, rows.end),
                shape,
            )
        };
        let elements = rows.len() * cols.len();
        HeldTensor {
            name,
            tensor: index,
            rows: [rows.start, rows.end],
            cols: [cols.start, cols.end],
            shape,
            elements,
            bytes: 4 * elements,
        }
    }
}

/// What one partition holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartPlan {
    /// The partition's index (its rank in the replica's transport).
    pub index: usize,
    /// The layers it computes (all of them, in part, under [`Split::Tensor`]).
    pub layers: Vec<String>,
    /// Its tensors, in its flat order.
    pub tensors: Vec<HeldTensor>,
    /// Parameters it holds.
    pub elements: usize,
    /// Their bytes as `f32`.
    pub bytes: usize,
}

/// Which way an exchange goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// In the forward pass (activations, the loss).
    Forward,
    /// In the backward pass (gradients of activations).
    Backward,
}

/// Who talks to whom in an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// A ring all-reduce over every partition.
    AllReduce,
    /// Point to point, `from` to `to`.
    Send {
        /// The sending partition.
        from: usize,
        /// The receiving partition.
        to: usize,
    },
    /// From one partition to each of the others.
    Broadcast {
        /// The sending partition.
        from: usize,
    },
}

/// What crosses partition boundaries at one point of a step.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Exchange {
    /// Where in the model (`hidden.1 output`, `loss`).
    pub at: String,
    /// Forward or backward.
    pub direction: Direction,
    /// Its pattern.
    pub pattern: Pattern,
    /// Values exchanged per step (the tensor all-reduced, or sent).
    pub values: usize,
    /// Bytes sent over all partitions together per step, tags included.
    pub bytes: u64,
}

/// Which partition holds which tensors, and what crosses the boundaries per step at one
/// batch size.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PartitionPlan {
    /// The model (`mlp:hidden=2048x3`).
    pub model: String,
    /// The split.
    pub split: Split,
    /// Partitions of the replica (`K`).
    pub partitions: usize,
    /// The batch size the exchanges are counted for.
    pub batch: usize,
    /// The whole model's tensors, in its flat order.
    pub tensors: Vec<WholeTensor>,
    /// What each partition holds, by index.
    pub parts: Vec<PartPlan>,
    /// What crosses the boundaries per step, in the order it happens.
    pub exchanges: Vec<Exchange>,
    /// Bytes sent between partitions per step, over all of them.
    pub bytes_per_step: u64,
}

/// Bytes a ring all-reduce of `values` sends over `k` partitions together: `2 (k - 1)`
/// steps, each of `k` messages carrying one chunk and a tag.
pub(crate) fn all_reduce_bytes(values: usize, k: usize) -> u64 {
    let steps = 2 * (k as u64).saturating_sub(1);
    steps * (4 * values as u64 + k as u64)
}

impl PartitionPlan {
    /// Offsets of the whole tensors in the whole flat buffer (one more: the end).
    fn offsets(&self) -> Vec<usize> {
        let mut o = Vec::with_capacity(self.tensors.len() + 1);
        o.push(0);
        for t in &self.tensors {
            o.push(o[o.len() - 1] + t.elements);
        }
        o
    }

    /// Partition `index`'s flat parameters cut from the whole model's `whole`.
    pub fn slice(&self, index: usize, whole: &[f32]) -> Result<Vec<f32>> {
        let off = self.offsets();
        let total = off[off.len() - 1];
        Error::check_len("whole model parameters", total, whole.len())?;
        let part = self.parts.get(index).ok_or_else(|| {
            Error::from(PartitionError::PlanIndex {
                index,
                partitions: self.partitions,
            })
        })?;
        let mut out = Vec::with_capacity(part.elements);
        for h in &part.tensors {
            let cols = self.tensors[h.tensor].matrix().1;
            let base = off[h.tensor];
            for r in h.rows[0]..h.rows[1] {
                out.extend_from_slice(
                    &whole[base + r * cols + h.cols[0]..base + r * cols + h.cols[1]],
                );
            }
        }
        Ok(out)
    }

    /// The whole model's flat parameters (or gradients) put together from every
    /// partition's, `parts[i]` being partition `i`'s. Every whole element must be held
    /// exactly once.
    pub fn assemble(&self, parts: &[Vec<f32>]) -> Result<Vec<f32>> {
        Error::check_len("partitions", self.parts.len(), parts.len())?;
        let off = self.offsets();
        let total = off[off.len() - 1];
        let mut whole = vec![0.0f32; total];
        let mut seen = vec![false; total];
        for (part, flat) in self.parts.iter().zip(parts) {
            Error::check_len("partition parameters", part.elements, flat.len())?;
            let mut at = 0;
            for h in &part.tensors {
                let cols = self.tensors[h.tensor].matrix().1;
                let base = off[h.tensor];
                let width = h.cols[1] - h.cols[0];
                for r in h.rows[0]..h.rows[1] {
                    let dst = base + r * cols + h.cols[0];
                    whole[dst..dst + width].copy_from_slice(&flat[at..at + width]);
                    seen[dst..dst + width].iter_mut().for_each(|s| *s = true);
                    at += width;
                }
            }
        }
        match seen.iter().position(|s| !s) {
            Some(i) => Err(PartitionError::NoCopy { element: i }.into()),
            None => Ok(whole),
        }
    }
}

/// Writes `n` bytes with a binary unit.
fn human(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl std::fmt::Display for PartitionPlan {
    /// One block per partition (layers, tensors with their elements and bytes), then the
    /// exchanges of one step.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "model {} split {} over {} partitions (batch {}):",
            self.model, self.split, self.partitions, self.batch
        )?;
        for p in &self.parts {
            writeln!(
                f,
                "  partition {}: {} parameters ({}), layers {}",
                p.index,
                p.elements,
                human(p.bytes as u64),
                p.layers.join(", ")
            )?;
            for t in &p.tensors {
                writeln!(
                    f,
                    "    {:<40} {:>10} elements {:>10}",
                    t.name,
                    t.elements,
                    human(t.bytes as u64)
                )?;
            }
        }
        writeln!(f, "  per step:")?;
        for e in &self.exchanges {
            let dir = match e.direction {
                Direction::Forward => "forward",
                Direction::Backward => "backward",
            };
            let who = match e.pattern {
                Pattern::AllReduce => "all-reduce".to_string(),
                Pattern::Send { from, to } => format!("{from} -> {to}"),
                Pattern::Broadcast { from } => format!("{from} -> all"),
            };
            writeln!(
                f,
                "    {dir:<8} {:<24} {who:<12} {:>10} values {:>10}",
                e.at,
                e.values,
                human(e.bytes)
            )?;
        }
        write!(f, "  total {} per step", human(self.bytes_per_step))
    }
}
