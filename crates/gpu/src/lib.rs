//! gradwire-gpu: gradients that live on an NVIDIA GPU, compressed there, and all-reduced
//! through the host (Aluminum's host-transfer algorithm).
//!
//! This crate owns the device side of gradwire: the kernels' CUDA C source
//! ([`kernels`]), the launch plans they read ([`plan`]), and, behind the `cuda` feature,
//! the device itself ([`device::Device`]: cudarc with dynamic loading, kernels compiled at
//! run time by NVRTC), codecs whose input stays on the device and whose payloads are
//! byte-identical to `gradwire-codec`'s ([`codec`]), and the host-transfer all-reduce
//! ([`allreduce::HostTransfer`]) whose chunk schedule is [`pipeline`]; and [`staged`], which
//! submits device tensors to `gradwire-engine` on their producer's stream (copied down
//! whole, or encoded on the device by those codecs so only payloads come to the host).
//!
//! Without the feature the crate builds its CPU-side logic only (plans, schedule, kernel
//! source), so the default build never needs CUDA. With it, `cargo build --features cuda`
//! still needs no CUDA toolkit: libcuda and libnvrtc are opened when a [`device::Device`] is
//! opened, and their absence is a typed error.
//!
//! ```no_run
//! # #[cfg(feature = "cuda")]
//! # fn main() -> Result<(), gradwire_gpu::Error> {
//! use gradwire_codec::{BuildContext, CodecConfig};
//! use gradwire_gpu::{codec, device::Device};
//!
//! let dev = Device::open(0)?;
//! let stream = dev.new_stream()?;
//! let grad = stream.clone_htod(&vec![0.5f32; 1 << 20])?; // a gradient on the GPU
//! let cfg: CodecConfig = "dgc:ratio=0.001".parse().unwrap();
//! let mut dgc = codec::build(&dev, &stream, &cfg, &BuildContext::single(1), grad.len())?;
//! let mut payload = Vec::new();
//! dgc.encode(&grad.as_view(), &mut payload)?; // the CPU codec's bytes, ~0.1% of the gradient
//! # Ok(()) }
//! # #[cfg(not(feature = "cuda"))]
//! # fn main() {}
//! ```
#![deny(missing_docs)]

mod error;
pub mod kernels;
pub mod pipeline;
pub mod plan;
pub mod staged;

#[cfg(feature = "cuda")]
pub mod allreduce;
#[cfg(feature = "cuda")]
pub mod codec;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod mlp;

pub use error::{Error, Result};
