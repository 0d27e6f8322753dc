//! Codecs on the device: the gradient stays on the GPU, only the payload comes to the host.
//!
//! Each one writes the bytes its CPU twin in `gradwire-codec` writes for the same gradient,
//! configuration, seed, rank and step (checked on the device by `gradwire-gpu-check`), so a
//! GPU rank and a CPU rank decode each other's payloads and can share a job. Decoding stays
//! on the CPU codecs (`Codec::decode_add`): the payloads are what travels.
//!
//! | spec | device codec | what runs on the host |
//! |---|---|---|
//! | `fp16` | [`fp16::DeviceFp16`] | the header |
//! | `onebit` (`ef=true`, `ef=false`) | [`onebit::DeviceOneBit`] | the column plan, once |
//! | `qsgd` (`coding=fixed`, both norms, `ef=false`) | [`qsgd::DeviceQsgd`] | the step's 32-bit key |
//! | `terngrad` (`ef=false`) | [`terngrad::DeviceTernGrad`] | the key; the shared scales |
//! | `dgc` (`clip=0`) | [`dgc::DeviceDgc`] | the threshold from a 0.1-1% sample, the exact cut among the candidates |
//! | `topk` (both scopes, `values=fp32\|fp16`, `ef`, `warmup_epochs`) | [`topk::DeviceTopK`] | the same selection as DGC's |
//!
//! Deviations, refused with [`crate::Error::Unsupported`] rather than run differently: QSGD's
//! Elias coding and error feedback, TernGrad's error feedback, DGC's local clipping
//! (`clip>0`), and the other codecs.

pub mod dgc;
pub mod fp16;
pub mod onebit;
pub mod qsgd;
pub mod terngrad;
pub mod topk;

mod select;

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};
use gradwire_codec::{BuildContext, CodecConfig, CodecId, Header, Progress, HEADER_LEN};

use crate::device::Device;
use crate::error::{Error, Result};

/// A gradient compressor whose input lives on the GPU.
pub trait DeviceCodec: Send {
    /// Which codec this is.
    fn id(&self) -> CodecId;

    /// Encodes `grad` (ordered after the work already on the codec's stream) into `out`:
    /// the bytes the CPU codec writes. Returns when `out` is filled.
    fn encode(&mut self, grad: &CudaView<'_, f32>, out: &mut Vec<u8>) -> Result<()>;

    /// Tells the codec where training is (the step keys the random streams; DGC's warm-up
    /// reads the epoch).
    fn set_progress(&mut self, _progress: Progress) {}

    /// TernGrad's per-tensor scales to agree on (see
    /// `gradwire_codec::SharedScalars::local_scalars`); empty for the others.
    fn local_scalars(&mut self, _grad: &CudaView<'_, f32>) -> Result<Vec<f32>> {
        Ok(Vec::new())
    }

    /// The agreed scales for the next encode (TernGrad); ignored by the others.
    fn set_shared_scalars(&mut self, _values: &[f32]) {}
}

/// The device codec for `cfg` over gradients of `n` elements laid out as `ctx` says, working
/// on `stream`.
pub fn build(
    dev: &Device,
    stream: &Arc<CudaStream>,
    cfg: &CodecConfig,
    ctx: &BuildContext,
    n: usize,
) -> Result<Box<dyn DeviceCodec>> {
    Ok(match cfg {
        CodecConfig::Fp16(c) if !c.ef => Box::new(fp16::DeviceFp16::new(dev, stream, n)?),
        CodecConfig::OneBit(c) => Box::new(onebit::DeviceOneBit::new(dev, stream, c, ctx, n)?),
        CodecConfig::Qsgd(c) => Box::new(qsgd::DeviceQsgd::new(dev, stream, c, ctx, n)?),
        CodecConfig::TernGrad(c) => {
            Box::new(terngrad::DeviceTernGrad::new(dev, stream, c, ctx, n)?)
        }
        CodecConfig::Dgc(c) => Box::new(dgc::DeviceDgc::new(dev, stream, c, ctx, n)?),
        CodecConfig::TopK(c) => Box::new(topk::DeviceTopK::new(dev, stream, c, ctx, n)?),
        other => return Err(Error::Unsupported(format!("{other}"))),
    })
}

/// The payload body on the device and its pinned host copy.
pub(crate) struct Body<T = u32> {
    pub(crate) dev: CudaSlice<T>,
    host: Option<PinnedHostSlice<T>>,
    len: usize,
}

impl<T: DeviceRepr + ValidAsZeroBits + bytemuck::Pod> Body<T> {
    pub(crate) fn new(stream: &Arc<CudaStream>, len: usize) -> Result<Body<T>> {
        let host = if len > 0 {
            // SAFETY: written by the copy down before it is read.
            Some(unsafe { stream.context().alloc_pinned_with_flags::<T>(len, 0) }?)
        } else {
            None
        };
        Ok(Body {
            dev: stream.alloc_zeros::<T>(len.max(1))?,
            host,
            len,
        })
    }

    /// Copies the body to pinned host memory (waits for the stream) and writes header + body
    /// to `out` (little-endian words: the hosts this runs on are little-endian).
    pub(crate) fn finish(
        &mut self,
        stream: &Arc<CudaStream>,
        codec: CodecId,
        n: usize,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        Header::write(out, codec, n);
        if let Some(host) = &mut self.host {
            stream.memcpy_dtoh(&self.dev.slice(..self.len), host)?;
            let words = host.as_slice()?;
            out.extend_from_slice(bytemuck::cast_slice(words));
        }
        debug_assert_eq!(out.len(), HEADER_LEN + self.len * std::mem::size_of::<T>());
        Ok(())
    }
}

/// Checks a gradient's length against the codec's.
pub(crate) fn check_len(want: usize, grad: &CudaView<'_, f32>) -> Result<()> {
    if grad.len() != want {
        return Err(Error::Length {
            want,
            got: grad.len(),
        });
    }
    Ok(())
}
