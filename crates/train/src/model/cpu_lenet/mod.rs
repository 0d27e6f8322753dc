//! LeNet-5 written out by hand for the CPU: the same network, parameters, flat layout and
//! initialization as the burn [`LeNet`](super::lenet::LeNet) (its reference, kept for the
//! tests and `ModelKind::build_burn`), with the forward and backward passes as im2col + GEMM
//! (the `gemm` crate burn's flex backend also uses) on buffers reused from step to step.
//!
//! Why: at LeNet's shapes (batch 64, 5x5 kernels, 1-16 channels) burn's autodiff graph, its
//! generic convolution backward and per-op allocations cost several times the arithmetic;
//! measured with `examples/lenet_step.rs` the hand-written step is several times faster at
//! one thread. The mathematics is unchanged: convolutions, ReLU, 2x2 max pooling, linear
//! layers and mean cross-entropy are the same functions, summed in a different order (the
//! tests hold the gradients to burn's within float rounding).
//!
//! Layout: activations are kept channel-major (`[C, N, H, W]`), so each convolution is one
//! GEMM over the whole batch: `z[c_out, n*h*w] = W[c_out, c_in*25] · cols[c_in*25, n*h*w]`.
//! ReLU and max pooling are fused (`max(0, max4(z) + b)`, as ReLU is monotone); the pooled
//! position is kept for the backward pass.
//!
//! Files: `geometry` (sizes and the flat layout), `work` (the reused activation buffers),
//! `matmul` (the GEMM wrapper), `layers` (im2col, pooling, ReLU and the layers' backward
//! pieces, shared with the partitioned model), `net` (the [`CpuLeNet`] value and its checks),
//! `forward` (the forward pass and log-softmax), `model` (the [`Model`](super::Model) impl:
//! training step with its backward pass, and evaluation).

mod forward;
mod geometry;
mod layers;
mod matmul;
mod model;
mod net;
mod work;

pub(crate) use forward::{cross_entropy, eval_logits};
pub(crate) use layers::{
    add_bias, add_col_sums, conv_backward, conv_pool, linear_backward, linear_forward, relu_mask,
    relu_pool_backward,
};
pub(crate) use matmul::{mat, matmul};
pub(crate) use net::CpuLeNet;

/// Kernel side of both convolutions.
pub(crate) const K: usize = 5;
/// `K * K`.
pub(crate) const KK: usize = K * K;
/// Output channels of conv1 and conv2.
const C1: usize = 6;
const C2: usize = 16;
/// Widths of fc1 and fc2.
const F1: usize = 120;
const F2: usize = 84;
/// Samples per internal chunk of an evaluation batch (bounds the im2col buffers).
const EVAL_CHUNK: usize = 128;
