//! DistBelief's model parallelism: one model replica split over `K` partitions (ranks),
//! activations and their gradients crossing the partition boundaries as messages over the
//! replica's [`Transport`] (rank `p` holds partition `p`). Each partition is a [`Model`]
//! for its own tensors only; a data-parallel layer above it (the trainer, a parameter
//! server) sees `K` models that together are one.
//!
//! Dean et al. 2012 ("Large Scale Distributed Deep Networks", section 3) partition a network
//! by its units: each machine computes some of the units of some layers, and only the
//! edges that cross a partition carry messages. Two ways to cut, chosen by [`Split`]:
//!
//! - **Within layers** ([`Split::Tensor`], the paper's vertical split, for MLPs): every
//!   partition holds a slice of the units of every fully connected layer. Beyond the paper:
//!   the slices are paired as Megatron-LM pairs them (a column-split layer, then a row-split
//!   layer), so one all-reduce per pair of layers suffices forward and one backward, where a
//!   split by units alone would exchange at every layer; an odd layer count puts the first
//!   layer alone, row-split over the input features, and the output layer always ends the
//!   last pair, so the loss is computed on every partition alike. The paper says nothing of
//!   this pairing. Details in `tensor.rs`.
//! - **Across layers** ([`Split::Pipeline`], for the MLPs and LeNet): consecutive layers on
//!   consecutive partitions. With `micro_batches = 1` this is the paper's plain split, one
//!   partition busy at a time; more micro-batches is GPipe's schedule (Huang et al. 2019), a
//!   named option beyond the paper: all micro-batch forwards then all backwards, the
//!   gradients summed to exactly the whole batch's mean-loss gradient. Details in
//!   `pipeline.rs`.
//!
//! Every partition is given the whole batch (the first reads the images, the last the
//! labels; under the tensor split all read both) and returns the batch's loss: the last
//! partition of a pipeline computes it and sends it back. Parameters are the unpartitioned
//! model's: [`PartitionSpec::build`] builds the whole model once with [`ModelKind::build`]
//! (same seed, same initialization) and keeps its partition's slices, so the partitions
//! together are exactly that model. [`PartitionPlan`] says which partition holds what and
//! what crosses the boundaries per step.
//!
//! Failures: a partition whose peer dies or stalls gets the transport's error within the
//! transport's deadline and tells the other partitions (`link.rs`), so every partition
//! returns [`Error::PartitionLost`] naming the failed one, never hangs. Anything received is
//! checked (tag, length) and refused with a typed error.
//!
//! ```
//! use gradwire_train::data::DataShape;
//! use gradwire_train::model::partition::{PartitionSpec, Split};
//! use gradwire_transport::{local::Local, Transport};
//!
//! let spec = PartitionSpec {
//!     kind: "mlp:hidden=16x2".parse().unwrap(),
//!     shape: DataShape::Image { shape: [1, 4, 4], classes: 3 },
//!     seed: 7,
//!     split: Split::Tensor,
//!     partitions: 2,
//! };
//! println!("{}", spec.plan(32).unwrap());
//! for t in Local::world(2) {
//!     let rank = t.rank();
//!     let part = spec.build(rank, Box::new(t)).unwrap();
//!     assert_eq!(part.index(), rank);
//! }
//! ```

mod arch;
mod layer;
mod link;
mod message;
mod pipeline;
mod plan;
mod split;
mod tensor;
#[cfg(test)]
mod tests;

pub use plan::{Direction, Exchange, HeldTensor, PartPlan, PartitionPlan, Pattern, WholeTensor};
pub use split::{Split, MAX_MICRO_BATCHES};

use std::sync::Mutex;

use gradwire_transport::Transport;

use self::arch::Arch;
use self::link::Link;
use super::cpu_lenet::{cross_entropy, eval_logits};
use super::{copy_params, overwrite_params, Eval, Model, ModelKind, ParamTensor};
use crate::data::{Batch, DataShape, ImageBatch};
use crate::error::{ConfigError, Error, ModelError, PartitionError, Result};

/// Samples per chunk of an evaluation (bounds its buffers).
const EVAL_CHUNK: usize = 128;

/// A model to split and how: everything [`PartitionSpec::build`] needs but the partition's
/// index and transport, the same on every partition of the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionSpec {
    /// The whole model (`mlp`, `mlp:hidden=2048x3`, `lenet`).
    pub kind: ModelKind,
    /// Its data.
    pub shape: DataShape,
    /// The seed of the whole model's parameters (as [`ModelKind::build`] takes it).
    pub seed: u64,
    /// Within layers or across them.
    pub split: Split,
    /// Partitions of the replica (`K`, at least 1).
    pub partitions: usize,
}

impl PartitionSpec {
    fn check(&self) -> Result<()> {
        self.split.validate()?;
        if self.partitions == 0 {
            return Err(PartitionError::NoPartitions.into());
        }
        Ok(())
    }

    /// The plan for steps of `batch` samples: who holds what, what crosses the boundaries.
    /// Builds the whole model once to read its tensors.
    pub fn plan(&self, batch: usize) -> Result<PartitionPlan> {
        self.check()?;
        let (arch, _) = Arch::build(self.kind, self.shape, self.seed)?;
        self.plan_of(&arch, batch)
    }

    fn plan_of(&self, arch: &Arch, batch: usize) -> Result<PartitionPlan> {
        let k = self.partitions;
        let tensors: Vec<WholeTensor> = arch
            .tensors
            .iter()
            .map(|t| WholeTensor {
                name: t.name.clone(),
                shape: t.shape.clone(),
                elements: t.len(),
            })
            .collect();
        let mut parts = Vec::with_capacity(k);
        let runs = match self.split {
            Split::Tensor => None,
            Split::Pipeline { .. } => Some(pipeline::assign(arch, k)?),
        };
        for p in 0..k {
            let (held, layers) = match &runs {
                None => (
                    tensor::held(arch, &tensors, k, p)?,
                    arch.layers.iter().map(|l| l.name.clone()).collect(),
                ),
                Some(runs) => (
                    pipeline::held(arch, &tensors, k, p)?,
                    arch.layers[runs[p].clone()]
                        .iter()
                        .map(|l| l.name.clone())
                        .collect(),
                ),
            };
            let elements = held.iter().map(|h| h.elements).sum::<usize>();
            parts.push(PartPlan {
                index: p,
                layers,
                tensors: held,
                elements,
                bytes: 4 * elements,
            });
        }
        let exchanges = match self.split {
            Split::Tensor => tensor::exchanges(arch, k, batch)?,
            Split::Pipeline { micro_batches } => {
                pipeline::exchanges(arch, k, batch, micro_batches)?
            }
        };
        Ok(PartitionPlan {
            model: self.kind.to_string(),
            split: self.split,
            partitions: k,
            batch,
            tensors,
            parts,
            bytes_per_step: exchanges.iter().map(|e| e.bytes).sum(),
            exchanges,
        })
    }

    /// Partition `index` of the replica, talking to the others over `transport` (whose
    /// ranks are the `K` partitions: rank `index` of a world of `K`, or a
    /// [`PartitionError`]).
    pub fn build(&self, index: usize, transport: Box<dyn Transport>) -> Result<PartitionedModel> {
        self.check()?;
        if index >= self.partitions {
            return Err(PartitionError::Index {
                index,
                partitions: self.partitions,
            }
            .into());
        }
        let link = link::Link::new(transport, index, self.partitions)?;
        let (arch, whole) = Arch::build(self.kind, self.shape, self.seed)?;
        let plan = self.plan_of(&arch, 0)?;
        let mut flat = Vec::new();
        whole.params(&mut flat);
        drop(whole);
        let params = plan.slice(index, &flat)?;
        drop(flat);
        let tensors = plan.parts[index]
            .tensors
            .iter()
            .map(|h| ParamTensor {
                name: h.name.clone(),
                shape: h.shape.clone(),
                role: arch.tensors[h.tensor].role,
            })
            .collect();
        let k = self.partitions;
        let passes: Box<dyn Passes> = match self.split {
            Split::Tensor => Box::new(tensor::TensorMlp::new(&arch, params.len(), k, index)?),
            Split::Pipeline { micro_batches } => Box::new(pipeline::Pipeline::new(
                &arch,
                params.len(),
                (k, index),
                micro_batches,
            )?),
        };
        Ok(PartitionedModel {
            spec: *self,
            index,
            inputs: arch.inputs(),
            classes: arch.classes,
            params,
            tensors,
            link: Mutex::new(link),
            passes,
        })
    }
}

/// The forward and backward passes of one partition (its run of layers, or its share of
/// every layer's units) over the parameters and the link its [`PartitionedModel`] holds.
trait Passes: Send {
    /// [`Model::forward_backward`] on a checked batch of at least one sample.
    fn forward_backward(
        &mut self,
        params: &[f32],
        batch: &ImageBatch,
        grads: &mut Vec<f32>,
        link: &mut Link,
    ) -> Result<f32>;

    /// [`Model::evaluate`] on a checked batch.
    fn evaluate(&self, params: &[f32], batch: &ImageBatch, link: &mut Link) -> Result<Eval>;
}

/// One partition of a split model: a [`Model`] of its own tensors (named after the whole
/// model's, with their slices: `hidden.0.weight[cols 0..1024]`). Its forward and backward
/// passes exchange messages with the other partitions, which must run theirs on the same
/// batch at the same time.
pub struct PartitionedModel {
    spec: PartitionSpec,
    index: usize,
    /// Values per image and classes of the data.
    inputs: usize,
    classes: usize,
    /// This partition's parameters, in the flat order of `tensors`.
    params: Vec<f32>,
    tensors: Vec<ParamTensor>,
    /// Locked by evaluations, which see the model shared.
    link: Mutex<Link>,
    passes: Box<dyn Passes>,
}

impl PartitionedModel {
    /// This partition's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// What it was built from.
    pub fn spec(&self) -> &PartitionSpec {
        &self.spec
    }

    /// The replica's plan for steps of `batch` samples.
    pub fn plan(&self, batch: usize) -> Result<PartitionPlan> {
        self.spec.plan(batch)
    }

    /// The batch as this model's images (see [`check_images`]).
    fn images<'b>(&self, batch: &'b Batch) -> Result<&'b ImageBatch> {
        check_images(self.spec.kind, batch, self.inputs, self.classes)
    }
}

impl Model for PartitionedModel {
    fn kind(&self) -> ModelKind {
        self.spec.kind
    }

    fn num_params(&self) -> usize {
        self.params.len()
    }

    fn layout(&self) -> Vec<usize> {
        self.tensors.iter().map(ParamTensor::len).collect()
    }

    fn tensors(&self) -> Vec<ParamTensor> {
        self.tensors.clone()
    }

    fn params(&self, out: &mut Vec<f32>) {
        copy_params(&self.params, out);
    }

    fn set_params(&mut self, flat: &[f32]) {
        overwrite_params(&mut self.params, flat);
    }

    fn forward_backward(&mut self, batch: &Batch, grads: &mut Vec<f32>) -> Result<f32> {
        let b = self.images(batch)?;
        if b.labels.is_empty() {
            return Err(ConfigError::EmptyBatch.into());
        }
        let link = self
            .link
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.passes.forward_backward(&self.params, b, grads, link)
    }

    fn evaluate(&self, batch: &Batch) -> Result<Eval> {
        let b = self.images(batch)?;
        let mut link = self
            .link
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.passes.evaluate(&self.params, b, &mut link)
    }
}

/// The batch as images of `inputs` values each with labels below `classes`.
fn check_images(
    kind: ModelKind,
    batch: &Batch,
    inputs: usize,
    classes: usize,
) -> Result<&ImageBatch> {
    let Batch::Images(b) = batch else {
        return Err(Error::BatchMismatch {
            model: kind.name(),
            batch: batch.kind(),
        });
    };
    if b.shape.iter().product::<usize>() != inputs {
        return Err(ModelError::ImageSize {
            model: kind,
            inputs,
            got: b.shape,
        }
        .into());
    }
    let want = b.labels.len() * inputs;
    Error::check_len("input pixels", want, b.pixels.len())?;
    if let Some(&l) = b.labels.iter().find(|&&l| usize::from(l) >= classes) {
        return Err(ModelError::Label { label: l, classes }.into());
    }
    Ok(b)
}

/// Cross-entropy of `logits` (`labels.len()` rows of `classes`): returns the sum of the
/// samples' losses and writes the gradient of that sum divided by `scale` into `g`
/// (`(softmax - one-hot) / scale`).
fn loss_and_grad(
    logits: &[f32],
    labels: &[u8],
    classes: usize,
    scale: usize,
    g: &mut [f32],
) -> f64 {
    let inv = 1.0 / scale as f32;
    cross_entropy(logits, labels, classes, g, |x| x * inv)
}
