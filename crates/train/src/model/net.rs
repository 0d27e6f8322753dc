//! The bridge from a burn network to the framework-free [`Model`] trait: any network that
//! turns a batch into logits and targets becomes a [`Model`] with cross-entropy loss, flat
//! parameters and flat gradients. The built-in models cross it, and so does a model of the
//! user's own ([`BurnModel::custom`]).

use burn::module::Module;
use burn::prelude::*;
use burn::tensor::activation::log_softmax;

use super::flat;
use super::init::{init_flat, ParamInit};
use super::{Eval, Model, ModelKind};
use crate::data::Batch;
use crate::error::{Error, Result};

/// A burn network classifying each sample (or each token) into one of `C` outputs: what a
/// model needs to train data-parallel through gradwire. Implement it for your own
/// `#[derive(Module)]` struct and wrap it in [`BurnModel::custom`].
pub trait Net: Module + 'static {
    /// Logits `[N, C]` and integer targets `[N]` for `batch`, built on `device`.
    fn logits(&self, batch: &Batch, device: &Device) -> Result<(Tensor<2>, Tensor<1, Int>)>;

    /// One initialization rule per parameter tensor, in visitor order. Empty (the default)
    /// keeps the values the module was built with; the trainer broadcasts rank 0's at start.
    fn init_plan(&self) -> Vec<ParamInit> {
        Vec::new()
    }
}

/// A [`Net`] on the flex CPU backend with autodiff, behind the [`Model`] trait: mean
/// cross-entropy loss, parameters and gradients as flat `f32` buffers in the module's
/// declaration order, tensor shapes and roles read from the module (a `Linear` or `Conv2d`
/// weight, a bias).
pub struct BurnModel<N: Net> {
    net: Option<N>,
    kind: ModelKind,
    layout: Vec<usize>,
    tensors: Vec<super::ParamTensor>,
    pass_times: Option<[std::time::Instant; 3]>,
    /// The autodiff device the parameters live on.
    device: Device,
}

impl<N: Net> BurnModel<N> {
    /// Wraps `net` (built on `device`) and sets its parameters from `seed`.
    pub(crate) fn new(net: N, kind: ModelKind, device: Device, seed: u64) -> Self {
        let layout = flat::layout(&net);
        let tensors = super::roles(&flat::param_paths(&net));
        debug_assert_eq!(tensors.iter().map(|t| t.len()).collect::<Vec<_>>(), layout);
        let plan = net.init_plan();
        let mut m = BurnModel {
            net: Some(net),
            kind,
            layout,
            tensors,
            pass_times: None,
            device,
        };
        if !plan.is_empty() {
            let init = init_flat(&m.layout, &plan, seed);
            m.set_params(&init);
        }
        m
    }

    /// A model of your own: `net`, built on `device` (an autodiff device,
    /// `Device::flex().autodiff()`), with the initial values it was built with (or those of
    /// its [`Net::init_plan`], drawn from `seed`). Its [`Model::kind`] is
    /// [`ModelKind::Custom`].
    pub fn custom(net: N, device: Device, seed: u64) -> Self {
        BurnModel::new(net, ModelKind::Custom, device, seed)
    }

    fn net(&self) -> &N {
        self.net
            .as_ref()
            .expect("net is only taken inside set_params")
    }
}

/// Mean cross-entropy of `logits` `[N, C]` against `targets` `[N]`, as a one-element tensor.
fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    let picked = log_softmax(logits, 1).gather(1, targets.unsqueeze_dim(1));
    picked.mean().neg()
}

/// An image batch as a `[n, features]` float tensor (each image flattened) and its `[n]`
/// labels, on `device`: the inputs and targets of a fully connected classifier. `None` for a
/// text batch.
pub fn flat_images(batch: &Batch, device: &Device) -> Option<(Tensor<2>, Tensor<1, Int>)> {
    let Batch::Images(b) = batch else {
        return None;
    };
    let n = b.labels.len();
    let d = b.shape.iter().product::<usize>();
    let x = Tensor::<2>::from_data(TensorData::new(b.pixels.clone(), [n, d]), device);
    let y: Vec<i64> = b.labels.iter().map(|&l| i64::from(l)).collect();
    Some((x, int_tensor(&y, [n], device)))
}

/// Converts targets to an integer tensor on `device`.
pub(crate) fn int_tensor<const D: usize>(
    ids: &[i64],
    shape: [usize; D],
    device: &Device,
) -> Tensor<D, Int> {
    Tensor::<D, Int>::from_data(TensorData::new(ids.to_vec(), shape), device)
}

/// Checks that a batch is of the kind a model takes.
pub(crate) fn mismatch(kind: ModelKind, batch: &Batch) -> Error {
    Error::BatchMismatch {
        model: kind.name(),
        batch: batch.kind(),
    }
}

impl<N: Net> Model for BurnModel<N> {
    fn kind(&self) -> ModelKind {
        self.kind
    }

    fn num_params(&self) -> usize {
        self.layout.iter().sum()
    }

    fn layout(&self) -> Vec<usize> {
        self.layout.clone()
    }

    fn tensors(&self) -> Vec<super::ParamTensor> {
        self.tensors.clone()
    }

    fn last_pass_times(&self) -> Option<[std::time::Instant; 3]> {
        self.pass_times
    }

    fn params(&self, out: &mut Vec<f32>) {
        out.clear();
        out.reserve(self.num_params());
        flat::read_params(self.net(), out);
    }

    fn set_params(&mut self, flat: &[f32]) {
        assert_eq!(
            flat.len(),
            self.num_params(),
            "flat parameter buffer length"
        );
        let net = self.net.take().expect("net present");
        self.net = Some(flat::write_params(net, flat, &self.device));
    }

    fn forward_backward(&mut self, batch: &Batch, grads: &mut Vec<f32>) -> Result<f32> {
        let t0 = std::time::Instant::now();
        let net = self.net();
        let (logits, targets) = net.logits(batch, &self.device)?;
        let loss = cross_entropy(logits, targets);
        let value = loss.clone().into_scalar::<f32>();
        let t1 = std::time::Instant::now();
        let mut g = loss.backward();
        flat::take_grads(net, &mut g, grads);
        self.pass_times = Some([t0, t1, std::time::Instant::now()]);
        Ok(value)
    }

    fn evaluate(&self, batch: &Batch) -> Result<Eval> {
        let inner = self.device.clone().inner();
        let net = self.net().valid();
        let (logits, targets) = net.logits(batch, &inner)?;
        let n = targets.dims()[0];
        let logp = log_softmax(logits, 1);
        let pred = logp.clone().argmax(1).squeeze_dim::<1>(1);
        let correct = pred.equal(targets.clone()).int().sum().into_scalar::<i64>();
        let loss_sum = -logp
            .gather(1, targets.unsqueeze_dim(1))
            .sum()
            .into_scalar::<f64>();
        Ok(Eval {
            loss_sum,
            correct: correct as u64,
            n: n as u64,
        })
    }
}
