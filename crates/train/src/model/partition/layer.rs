//! One layer of a split model with its own forward and backward passes on flat buffers: a
//! fully connected layer (optionally followed by ReLU) or LeNet's convolution block (5x5
//! convolution, bias, ReLU, 2x2 max pooling). The kernels are the hand-written LeNet's
//! (im2col + GEMM, `cpu_lenet.rs`); each layer's weight and bias are two consecutive
//! tensors, the weight first, in burn's layouts (Linear `[in, out]`, conv
//! `[out, in, 5, 5]`).
//!
//! Activation layouts: a fully connected layer reads and writes sample-major `[N, F]`; a
//! convolution block reads sample-major `[N, C, H, W]` (the images) or channel-major
//! `[C, N, H, W]` (the block before it) and writes channel-major, or sample-major
//! `[N, C*H*W]` when a fully connected layer follows (`flatten`), as burn flattens.

use super::super::cpu_lenet::{
    conv_backward, conv_pool, linear_backward, linear_forward, relu_mask, relu_pool_backward, KK,
};

/// What a layer computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// `y = x W + b`, then ReLU when `relu`.
    Linear {
        fan_in: usize,
        fan_out: usize,
        relu: bool,
    },
    /// 5x5 convolution (zero padding `pad`), bias, ReLU, 2x2 max pooling.
    ConvPool {
        c_in: usize,
        c_out: usize,
        /// Input height and width.
        hw: (usize, usize),
        pad: usize,
        /// Input is sample-major (`[N, C, H, W]`, the images) rather than channel-major.
        sample_major: bool,
        /// Output is flattened sample-major for a fully connected layer.
        flatten: bool,
    },
}

/// A named layer of the unpartitioned model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layer {
    /// The layer's path (`hidden.0`, `conv1`): its tensors' names without `.weight`/`.bias`.
    pub(crate) name: String,
    pub(crate) op: Op,
}

/// Buffers one layer keeps for one micro-batch between its forward and backward passes,
/// plus its backward temporaries; reused from step to step.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    cols: Vec<f32>,
    z: Vec<f32>,
    p: Vec<f32>,
    arg: Vec<u8>,
    gp: Vec<f32>,
    gz: Vec<f32>,
    gcols: Vec<f32>,
}

impl Op {
    /// The convolution's output size before pooling.
    fn conv_out(hw: (usize, usize), pad: usize) -> (usize, usize) {
        let k = super::super::cpu_lenet::K;
        (
            (hw.0 + 2 * pad).saturating_sub(k - 1),
            (hw.1 + 2 * pad).saturating_sub(k - 1),
        )
    }

    /// Elements of the weight tensor.
    pub(crate) fn weight_len(&self) -> usize {
        match *self {
            Op::Linear {
                fan_in, fan_out, ..
            } => fan_in * fan_out,
            Op::ConvPool { c_in, c_out, .. } => c_out * c_in * KK,
        }
    }

    /// Elements of the bias.
    pub(crate) fn bias_len(&self) -> usize {
        match *self {
            Op::Linear { fan_out, .. } => fan_out,
            Op::ConvPool { c_out, .. } => c_out,
        }
    }

    /// Input values per sample.
    pub(crate) fn in_per_sample(&self) -> usize {
        match *self {
            Op::Linear { fan_in, .. } => fan_in,
            Op::ConvPool { c_in, hw, .. } => c_in * hw.0 * hw.1,
        }
    }

    /// Output values per sample.
    pub(crate) fn out_per_sample(&self) -> usize {
        match *self {
            Op::Linear { fan_out, .. } => fan_out,
            Op::ConvPool { c_out, hw, pad, .. } => {
                let (oh, ow) = Op::conv_out(hw, pad);
                c_out * (oh / 2) * (ow / 2)
            }
        }
    }

    /// Multiply-adds of the forward pass per sample (what the pipeline balances).
    pub(crate) fn macs(&self) -> usize {
        match *self {
            Op::Linear {
                fan_in, fan_out, ..
            } => fan_in * fan_out,
            Op::ConvPool {
                c_in,
                c_out,
                hw,
                pad,
                ..
            } => {
                let (oh, ow) = Op::conv_out(hw, pad);
                c_out * c_in * KK * oh * ow
            }
        }
    }

    /// Forward pass of `n` samples: `x` (`n * in_per_sample`) into `y`
    /// (`n * out_per_sample`); `p` is the weight then the bias.
    pub(crate) fn forward(&self, p: &[f32], x: &[f32], y: &mut [f32], n: usize, s: &mut Scratch) {
        let (w, b) = p.split_at(self.weight_len());
        match *self {
            Op::Linear {
                fan_in,
                fan_out,
                relu,
            } => linear_forward(n, (fan_in, fan_out), x, (w, b), y, relu),
            Op::ConvPool {
                c_in,
                c_out,
                hw: (h, w_in),
                pad,
                sample_major,
                flatten,
            } => {
                let (oh, ow) = Op::conv_out((h, w_in), pad);
                let pl = n * oh * ow;
                let plane = h * w_in;
                let strides = if sample_major {
                    (c_in * plane, plane)
                } else {
                    (plane, n * plane)
                };
                s.cols.resize(c_in * KK * pl, 0.0);
                s.z.resize(c_out * pl, 0.0);
                let pooled = (oh / 2) * (ow / 2);
                s.p.resize(c_out * n * pooled, 0.0);
                s.arg.resize(c_out * n * pooled, 0);
                conv_pool(
                    x,
                    n,
                    c_in,
                    (h, w_in),
                    strides,
                    pad,
                    (oh, ow),
                    (w, b),
                    &mut s.cols,
                    &mut s.z,
                    (&mut s.p, &mut s.arg),
                );
                if flatten {
                    let f = c_out * pooled;
                    for c in 0..c_out {
                        for i in 0..n {
                            y[i * f + c * pooled..][..pooled]
                                .copy_from_slice(&s.p[(c * n + i) * pooled..][..pooled]);
                        }
                    }
                } else {
                    y.copy_from_slice(&s.p);
                }
            }
        }
    }

    /// Backward pass of the `n` samples of the last [`Op::forward`] with the same scratch:
    /// from the input `x`, the output `y` and the output gradient `gy` (overwritten: masked
    /// by the ReLU), adds the weight and bias gradients into `g` (weight then bias) and
    /// writes the input gradient into `gx` when asked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward(
        &self,
        p: &[f32],
        x: &[f32],
        y: &[f32],
        gy: &mut [f32],
        g: &mut [f32],
        gx: Option<&mut [f32]>,
        n: usize,
        s: &mut Scratch,
    ) {
        let w = &p[..self.weight_len()];
        let (gw, gb) = g.split_at_mut(self.weight_len());
        match *self {
            Op::Linear {
                fan_in,
                fan_out,
                relu,
            } => {
                if relu {
                    relu_mask(gy, y);
                }
                linear_backward(n, (fan_in, fan_out), x, gy, w, (gw, gb), true, gx);
            }
            Op::ConvPool {
                c_in,
                c_out,
                hw: (h, w_in),
                pad,
                flatten,
                ..
            } => {
                let (oh, ow) = Op::conv_out((h, w_in), pad);
                let pl = n * oh * ow;
                let pooled = (oh / 2) * (ow / 2);
                s.gp.resize(c_out * n * pooled, 0.0);
                if flatten {
                    let f = c_out * pooled;
                    for c in 0..c_out {
                        for i in 0..n {
                            s.gp[(c * n + i) * pooled..][..pooled]
                                .copy_from_slice(&gy[i * f + c * pooled..][..pooled]);
                        }
                    }
                } else {
                    s.gp.copy_from_slice(gy);
                }
                s.gz.resize(c_out * pl, 0.0);
                relu_pool_backward(&s.gp, &s.p, &s.arg, c_out, n, (oh, ow), &mut s.gz);
                let gx = gx.map(|gx| {
                    // Only an unpadded, channel-major input has an input gradient here (the
                    // first block reads the images, which need none): the layer plan
                    // guarantees it.
                    debug_assert!(pad == 0 && !self.reads_images());
                    s.gcols.resize(c_in * KK * pl, 0.0);
                    (&mut s.gcols[..], gx)
                });
                let hws = ((h, w_in), (oh, ow));
                conv_backward(n, c_in, hws, &s.gz, &s.cols, w, (gw, gb), true, gx);
            }
        }
    }

    /// True for the convolution block that reads the images.
    pub(crate) fn reads_images(&self) -> bool {
        matches!(
            self,
            Op::ConvPool {
                sample_major: true,
                ..
            }
        )
    }
}
