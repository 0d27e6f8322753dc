//! [`Encoder`] on a GPU: the device codecs of [`crate::codec`], one per tensor, built from
//! the engine's own codec configuration and build context, so each payload is the one the
//! engine's CPU codec would write for the same gradient, seed, rank and step.
//!
//! A tensor whose codec has no device twin (or a configuration the device codec refuses:
//! see the table in [`crate::codec`]) is not accepted and goes through the pinned host copy.
//! The codecs run on a stream of their own, which waits on the GPU (not the host) for the
//! event recorded on the producer's stream.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaSlice, CudaStream};
use gradwire_codec::{BuildContext, CodecConfig, Progress};

use super::cuda::{CudaApi, CudaMark};
use super::{DevicePtr, Encoder};
use crate::codec::{self, DeviceCodec};
use crate::device::Device;
use crate::error::{Error, Result};

/// The device codecs of one GPU's tensors.
pub struct DeviceCodecs {
    dev: Device,
    stream: Arc<CudaStream>,
    codecs: HashMap<String, Box<dyn DeviceCodec>>,
}

impl std::fmt::Debug for DeviceCodecs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCodecs")
            .field("tensors", &self.codecs.len())
            .finish()
    }
}

impl DeviceCodecs {
    /// Codecs on `dev` (opened with its kernels compiled), on a new stream of its own.
    pub fn new(dev: Device) -> Result<Self> {
        let stream = dev.new_stream()?;
        Ok(DeviceCodecs {
            dev,
            stream,
            codecs: HashMap::new(),
        })
    }
}

impl Encoder<CudaApi> for DeviceCodecs {
    fn accepts(
        &mut self,
        name: &str,
        len: usize,
        context: Option<(CodecConfig, BuildContext)>,
    ) -> bool {
        let Some((cfg, ctx)) = context else {
            return false;
        };
        match codec::build(&self.dev, &self.stream, &cfg, &ctx, len) {
            Ok(c) => {
                self.codecs.insert(name.to_string(), c);
                true
            }
            Err(e) => {
                tracing::debug!("tensor {name:?} ({cfg}) is staged through the host: {e}");
                false
            }
        }
    }

    unsafe fn encode(
        &mut self,
        name: &str,
        src: DevicePtr,
        len: usize,
        ready: &CudaMark,
        progress: Progress,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let codec = self
            .codecs
            .get_mut(name)
            .ok_or_else(|| Error::Stager(format!("tensor {name:?} has no device codec")))?;
        self.stream.context().bind_to_thread()?;
        // SAFETY: a live stream and event of this context; the wait is on the GPU.
        unsafe {
            result::stream::wait_event(
                self.stream.cu_stream(),
                ready.raw(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }?;
        codec.set_progress(progress);
        // SAFETY: the caller's contract: `len` floats at `src`, allocated and unwritten
        // until this returns. The slice is leaked below, never freed here: the memory is
        // the caller's.
        let grad: CudaSlice<f32> = unsafe { self.stream.upgrade_device_ptr(src.0, len) };
        let r = codec.encode(&grad.as_view(), out);
        grad.leak();
        r
    }
}
