//! Multi-layer perceptron: flatten -> 256 -> ReLU -> 128 -> ReLU -> classes.

use burn::nn::{Initializer, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::relu;

use super::init::ParamInit;
use super::net::{flat_images, mismatch, Net};
use super::ModelKind;
use crate::data::Batch;
use crate::error::Result;

/// The MLP 784-256-128-10 (input size follows the image shape).
#[derive(Module, Debug)]
pub(crate) struct Mlp {
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
}

fn linear(d_in: usize, d_out: usize, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out)
        .with_initializer(Initializer::Zeros)
        .init(device)
}

impl Mlp {
    /// An MLP for `inputs` features and `classes` outputs (parameters set later).
    pub(crate) fn new(inputs: usize, classes: usize, device: &Device) -> Self {
        Mlp {
            fc1: linear(inputs, 256, device),
            fc2: linear(256, 128, device),
            fc3: linear(128, classes, device),
        }
    }
}

impl Net for Mlp {
    fn logits(&self, batch: &Batch, device: &Device) -> Result<(Tensor<2>, Tensor<1, Int>)> {
        let (x, y) = flat_images(batch, device).ok_or_else(|| mismatch(ModelKind::Mlp, batch))?;
        let x = relu(self.fc1.forward(x));
        let x = relu(self.fc2.forward(x));
        Ok((self.fc3.forward(x), y))
    }

    fn init_plan(&self) -> Vec<ParamInit> {
        let fan = |l: &Linear| l.weight.lazy_shape()[0];
        let (a, b, c) = (fan(&self.fc1), fan(&self.fc2), fan(&self.fc3));
        vec![
            ParamInit::he(a),
            ParamInit::fan_in(a),
            ParamInit::he(b),
            ParamInit::fan_in(b),
            ParamInit::fan_in(c),
            ParamInit::fan_in(c),
        ]
    }
}

/// An MLP with any hidden widths: `inputs -> h1 -> ReLU -> ... -> hk -> ReLU -> classes`
/// (`mlp:hidden=2048x3`: the wide fully-connected networks of Seide et al. 2014 and Strom
/// 2015, where the gradient is large next to the compute). Tensors are `hidden.I.weight` /
/// `hidden.I.bias` for each hidden layer, then `out.weight` / `out.bias` (the output layer).
#[derive(Module, Debug)]
pub(crate) struct WideMlp {
    hidden: Vec<Linear>,
    out: Linear,
}

impl WideMlp {
    /// An MLP for `inputs` features, the given hidden widths and `classes` outputs
    /// (parameters set later).
    pub(crate) fn new(inputs: usize, hidden: &[usize], classes: usize, device: &Device) -> Self {
        let mut layers = Vec::with_capacity(hidden.len());
        let mut d_in = inputs;
        for &h in hidden {
            layers.push(linear(d_in, h, device));
            d_in = h;
        }
        WideMlp {
            hidden: layers,
            out: linear(d_in, classes, device),
        }
    }
}

impl Net for WideMlp {
    fn logits(&self, batch: &Batch, device: &Device) -> Result<(Tensor<2>, Tensor<1, Int>)> {
        let (mut x, y) =
            flat_images(batch, device).ok_or_else(|| mismatch(ModelKind::Mlp, batch))?;
        for layer in &self.hidden {
            x = relu(layer.forward(x));
        }
        Ok((self.out.forward(x), y))
    }

    fn init_plan(&self) -> Vec<ParamInit> {
        let fan = |l: &Linear| l.weight.lazy_shape()[0];
        let mut plan = Vec::with_capacity(2 * self.hidden.len() + 2);
        for l in &self.hidden {
            plan.push(ParamInit::he(fan(l)));
            plan.push(ParamInit::fan_in(fan(l)));
        }
        let f = fan(&self.out);
        plan.extend([ParamInit::fan_in(f), ParamInit::fan_in(f)]);
        plan
    }
}
