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
//!
//! Deviations, refused with [`crate::Error::Unsupported`] rather than run differently: QSGD's
//! Elias coding and error feedback, TernGrad's error feedback, DGC's local clipping
//! (`clip>0`), and the other codecs.

pub mod dgc;
pub mod fp16;
pub mod onebit;
pub mod qsgd;
pub mod terngrad;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView};
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

    /// TernGrad's per-tensor scales to agree on (see `Codec::local_scalars`); empty for the
    /// others.
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
        other => return Err(Error::Unsupported(format!("{other}"))),
    })
}

/// The payload body on the device and its host copy.
pub(crate) struct Body {
    pub(crate) dev: CudaSlice<u32>,
    host: Vec<u32>,
}

impl Body {
    pub(crate) fn new(stream: &Arc<CudaStream>, words: usize) -> Result<Body> {
        Ok(Body {
            dev: stream.alloc_zeros::<u32>(words.max(1))?,
            host: vec![0; words],
        })
    }

    /// Copies the body to the host (waits for the stream) and writes header + body to `out`.
    pub(crate) fn finish(
        &mut self,
        stream: &Arc<CudaStream>,
        codec: CodecId,
        n: usize,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let words = self.host.len();
        if words > 0 {
            stream.memcpy_dtoh(&self.dev.slice(..words), &mut self.host[..])?;
        }
        Header::write(out, codec, n);
        out.reserve(words * 4);
        for w in &self.host {
            out.extend_from_slice(&w.to_le_bytes());
        }
        debug_assert_eq!(out.len(), HEADER_LEN + words * 4);
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
