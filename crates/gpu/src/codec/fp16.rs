//! `fp16` on the device: round to nearest even (`cvt.rn.f16.f32`), the bytes of the CPU
//! codec (the `half` crate's conversion): the header, then `n` little-endian binary16 words.

use std::sync::Arc;

use cudarc::driver::{CudaStream, CudaView, PushKernelArg};
use gradwire_codec::CodecId;

use super::{check_len, Body, DeviceCodec};
use crate::device::{elementwise, Device};
use crate::error::Result;

/// IEEE half precision on the device.
pub struct DeviceFp16 {
    dev: Device,
    stream: Arc<CudaStream>,
    n: usize,
    body: Body<u16>,
}

impl DeviceFp16 {
    /// A caster for gradients of `n` elements.
    pub fn new(dev: &Device, stream: &Arc<CudaStream>, n: usize) -> Result<Self> {
        Ok(DeviceFp16 {
            dev: dev.clone(),
            stream: stream.clone(),
            n,
            body: Body::new(stream, n)?,
        })
    }
}

impl DeviceCodec for DeviceFp16 {
    fn id(&self) -> CodecId {
        CodecId::Fp16
    }

    fn encode(&mut self, grad: &CudaView<'_, f32>, out: &mut Vec<u8>) -> Result<()> {
        check_len(self.n, grad)?;
        let n = self.n as u64;
        if n > 0 {
            let mut b = self.stream.launch_builder(self.dev.func("gw_fp16"));
            b.arg(grad).arg(&mut self.body.dev).arg(&n);
            // SAFETY: the kernel reads n floats of grad and writes n halves of the body.
            unsafe { b.launch(elementwise(n)) }?;
        }
        self.body.finish(&self.stream, CodecId::Fp16, self.n, out)
    }
}
