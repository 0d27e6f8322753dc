//! A small residual network (ResNet-8 layout): a 3x3 stem, three basic blocks of two 3x3
//! convs at widths w, 2w, 4w, each block opening with stride 2 (28x28 -> 14 -> 7 -> 4) and a
//! 1x1 projection shortcut, global average pooling and a linear classifier. Downsampling in
//! every block keeps it cheap (about 2.7 M multiply-adds per 28x28 image).
//!
//! There is no batch norm, so there is no running state outside the flat parameters (every
//! rank's model is exactly its parameters). Training stays stable the Fixup way: the second
//! conv of each residual branch starts at zero, so each block starts as its shortcut.

use burn::nn::conv::Conv2d;
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::activation::relu;
use burn::tensor::module::adaptive_avg_pool2d;

use super::init::ParamInit;
use super::lenet::{conv, conv_fan_in, linear};
use super::net::{int_tensor, mismatch, Net};
use super::ModelKind;
use crate::data::Batch;
use crate::error::Result;

/// Base width (channels of the first stage).
pub(crate) const WIDTH: usize = 16;

/// conv3x3 -> ReLU -> conv3x3, plus the shortcut (identity or 1x1 projection), then ReLU.
#[derive(Module, Debug)]
pub(crate) struct BasicBlock {
    conv1: Conv2d,
    conv2: Conv2d,
    proj: Option<Conv2d>,
}

impl BasicBlock {
    fn new(c_in: usize, c_out: usize, stride: usize, device: &Device) -> Self {
        BasicBlock {
            conv1: conv(c_in, c_out, 3, stride, 1, device),
            conv2: conv(c_out, c_out, 3, 1, 1, device),
            proj: (stride != 1 || c_in != c_out).then(|| conv(c_in, c_out, 1, stride, 0, device)),
        }
    }

    fn forward(&self, x: Tensor<4>) -> Tensor<4> {
        let short = match &self.proj {
            Some(p) => p.forward(x.clone()),
            None => x.clone(),
        };
        let y = self.conv2.forward(relu(self.conv1.forward(x)));
        relu(y + short)
    }

    fn init_plan(&self, plan: &mut Vec<ParamInit>) {
        let f1 = conv_fan_in(&self.conv1);
        plan.extend([ParamInit::he(f1), ParamInit::Const(0.0)]);
        plan.extend([ParamInit::Const(0.0), ParamInit::Const(0.0)]);
        if let Some(p) = &self.proj {
            let fp = conv_fan_in(p);
            plan.extend([ParamInit::fan_in(fp), ParamInit::Const(0.0)]);
        }
    }
}

/// The ResNet-8.
#[derive(Module, Debug)]
pub(crate) struct ResNet {
    stem: Conv2d,
    blocks: Vec<BasicBlock>,
    fc: Linear,
}

impl ResNet {
    /// A ResNet for `[channels, h, w]` images and `classes` outputs.
    pub(crate) fn new(shape: [usize; 3], classes: usize, device: &Device) -> Self {
        let w = WIDTH;
        ResNet {
            stem: conv(shape[0], w, 3, 1, 1, device),
            blocks: vec![
                BasicBlock::new(w, w, 2, device),
                BasicBlock::new(w, 2 * w, 2, device),
                BasicBlock::new(2 * w, 4 * w, 2, device),
            ],
            fc: linear(4 * w, classes, device),
        }
    }
}

impl Net for ResNet {
    fn logits(&self, batch: &Batch, device: &Device) -> Result<(Tensor<2>, Tensor<1, Int>)> {
        let Batch::Images(b) = batch else {
            return Err(mismatch(ModelKind::ResNet8, batch));
        };
        let n = b.labels.len();
        let [c, h, w] = b.shape;
        let x = Tensor::<4>::from_data(TensorData::new(b.pixels.clone(), [n, c, h, w]), device);
        let mut x = relu(self.stem.forward(x));
        for block in &self.blocks {
            x = block.forward(x);
        }
        let x: Tensor<2> = adaptive_avg_pool2d(x, [1, 1]).flatten(1, 3);
        let y: Vec<i64> = b.labels.iter().map(|&l| i64::from(l)).collect();
        Ok((self.fc.forward(x), int_tensor(&y, [n], device)))
    }

    fn init_plan(&self) -> Vec<ParamInit> {
        let fs = conv_fan_in(&self.stem);
        let mut plan = vec![ParamInit::he(fs), ParamInit::Const(0.0)];
        for b in &self.blocks {
            b.init_plan(&mut plan);
        }
        let ff = self.fc.weight.lazy_shape()[0];
        plan.extend([ParamInit::fan_in(ff), ParamInit::fan_in(ff)]);
        plan
    }
}
