//! LeNet-5 for 28x28 inputs: conv 5x5 (6, padded) -> ReLU -> max-pool 2 -> conv 5x5 (16)
//! -> ReLU -> max-pool 2 -> 120 -> ReLU -> 84 -> ReLU -> classes.

use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Initializer, Linear, LinearConfig, PaddingConfig2d};
use burn::prelude::*;
use burn::tensor::activation::relu;

use super::init::ParamInit;
use super::net::{int_tensor, mismatch, Net};
use super::ModelKind;
use crate::data::Batch;
use crate::error::{ModelError, Result};

/// LeNet-5 with ReLU and max pooling (61,706 parameters on 1x28x28, 10 classes).
#[derive(Module, Debug)]
pub(crate) struct LeNet {
    conv1: Conv2d,
    conv2: Conv2d,
    pool: MaxPool2d,
    fc1: Linear,
    fc2: Linear,
    fc3: Linear,
}

pub(crate) fn conv(
    c_in: usize,
    c_out: usize,
    k: usize,
    stride: usize,
    pad: usize,
    device: &Device,
) -> Conv2d {
    Conv2dConfig::new([c_in, c_out], [k, k])
        .with_stride([stride, stride])
        .with_padding(PaddingConfig2d::Explicit(pad, pad, pad, pad))
        .with_initializer(Initializer::Zeros)
        .init(device)
}

pub(crate) fn linear(d_in: usize, d_out: usize, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out)
        .with_initializer(Initializer::Zeros)
        .init(device)
}

/// Input features (`in * k * k`) of a conv weight `[out, in, k, k]`.
pub(crate) fn conv_fan_in(c: &Conv2d) -> usize {
    let s = c.weight.lazy_shape();
    s[1] * s[2] * s[3]
}

impl LeNet {
    /// A LeNet for `[channels, h, w]` images (h, w >= 12) and `classes` outputs.
    pub(crate) fn new(shape: [usize; 3], classes: usize, device: &Device) -> Result<Self> {
        let [c, h, w] = shape;
        // conv1 keeps h x w, pool halves, conv2 (5x5, no pad) takes 4, pool halves.
        let (h2, w2) = ((h / 2).saturating_sub(4) / 2, (w / 2).saturating_sub(4) / 2);
        if h2 == 0 || w2 == 0 {
            return Err(ModelError::LeNetImages { h, w }.into());
        }
        Ok(LeNet {
            conv1: conv(c, 6, 5, 1, 2, device),
            conv2: conv(6, 16, 5, 1, 0, device),
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            fc1: linear(16 * h2 * w2, 120, device),
            fc2: linear(120, 84, device),
            fc3: linear(84, classes, device),
        })
    }
}

impl Net for LeNet {
    fn logits(&self, batch: &Batch, device: &Device) -> Result<(Tensor<2>, Tensor<1, Int>)> {
        let Batch::Images(b) = batch else {
            return Err(mismatch(ModelKind::LeNet, batch));
        };
        let n = b.labels.len();
        let [c, h, w] = b.shape;
        let x = Tensor::<4>::from_data(TensorData::new(b.pixels.clone(), [n, c, h, w]), device);
        let x = self.pool.forward(relu(self.conv1.forward(x)));
        let x = self.pool.forward(relu(self.conv2.forward(x)));
        let x: Tensor<2> = x.flatten(1, 3);
        let x = relu(self.fc1.forward(x));
        let x = relu(self.fc2.forward(x));
        let y: Vec<i64> = b.labels.iter().map(|&l| i64::from(l)).collect();
        Ok((self.fc3.forward(x), int_tensor(&y, [n], device)))
    }

    fn init_plan(&self) -> Vec<ParamInit> {
        let (c1, c2) = (conv_fan_in(&self.conv1), conv_fan_in(&self.conv2));
        let fan = |l: &Linear| l.weight.lazy_shape()[0];
        let (f1, f2, f3) = (fan(&self.fc1), fan(&self.fc2), fan(&self.fc3));
        vec![
            ParamInit::he(c1),
            ParamInit::fan_in(c1),
            ParamInit::he(c2),
            ParamInit::fan_in(c2),
            ParamInit::he(f1),
            ParamInit::fan_in(f1),
            ParamInit::he(f2),
            ParamInit::fan_in(f2),
            ParamInit::fan_in(f3),
            ParamInit::fan_in(f3),
        ]
    }
}
