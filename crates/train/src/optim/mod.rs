//! Optimizers on flat `f32` buffers (our own, no framework optimizer): SGD with momentum
//! or Nesterov (PyTorch semantics), Adam / AdamW, weight decay, gradient-norm clipping, and
//! a learning-rate schedule (linear warm-up, then constant, step or cosine decay).

mod config;
mod optimizer;
pub(crate) use optimizer::l2_norm;
mod schedule;

pub use config::{LrDecay, OptimizerConfig, OptimizerKind};
pub use optimizer::{Optimizer, OptimizerState};
