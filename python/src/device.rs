//! CUDA tensors: the stager that submits them to the engine as device pointers on the
//! caller's stream (`gradwire_gpu::staged`, Aluminum's host-transfer path), one per engine.
//!
//! The Python side passes a contiguous `float32` CUDA tensor as `(data_ptr, numel, stream,
//! device index)`, `stream` being `torch.cuda.current_stream(device).cuda_stream`; no copy is
//! made in Python. The copy down is queued on that stream (after the backward kernels that
//! produce the gradient), the stager's thread hands the host copy to the engine, and the
//! wait queues the copy up on the stream current at the wait, without the host waiting for
//! the GPU. One process drives one GPU: a tensor on another GPU than the first one seen is
//! refused.
//!
//! Tensors whose policy's codec has a device twin (DGC, top-k, QSGD, TernGrad, 1-bit SGD,
//! fp16: `gradwire_gpu::codec`) are encoded on the GPU and only their payloads come to the
//! host, bytes identical to the CPU codec's. That needs the kernels compiled by NVRTC when
//! the first CUDA tensor arrives; without NVRTC (or with `GRADWIRE_DEVICE_CODECS=off`) every
//! tensor goes through the pinned host copy instead, and a warning says why.

use std::sync::{Arc, Mutex, MutexGuard};

use gradwire_engine::Engine;
use gradwire_gpu::device::Device;
use gradwire_gpu::staged::cuda::CudaApi;
use gradwire_gpu::staged::device_codecs::DeviceCodecs;
use gradwire_gpu::staged::{Staged, Stager, StagerStats};
use pyo3::exceptions::PyValueError;
use pyo3::PyResult;

use crate::error::{raise_in, GradwireError};
use crate::handle::Handle;

/// The stager of the running engine, made when the first CUDA tensor arrives.
#[derive(Default)]
pub struct Devices {
    current: Mutex<Option<Current>>,
}

struct Current {
    /// The engine it submits to (compared by address: a restarted engine needs a new one).
    engine: usize,
    ordinal: usize,
    stager: Arc<Stager<CudaApi>>,
}

impl Devices {
    fn lock(&self) -> MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stager for `engine` on GPU `ordinal`, made on first use.
    fn stager(&self, engine: &Arc<Engine>, ordinal: usize) -> PyResult<Arc<Stager<CudaApi>>> {
        let key = Arc::as_ptr(engine) as usize;
        let mut cur = self.lock();
        if let Some(c) = &*cur {
            if c.ordinal != ordinal {
                return Err(PyValueError::new_err(format!(
                    "this process reduces tensors of cuda:{}; this one is on cuda:{ordinal} \
                     (one GPU per process: set CUDA_VISIBLE_DEVICES or torch.cuda.set_device)",
                    c.ordinal
                )));
            }
            if c.engine == key {
                return Ok(c.stager.clone());
            }
        }
        let api = CudaApi::primary(ordinal)
            .map_err(|e| GradwireError::new_err(format!("opening cuda:{ordinal}: {e}")))?;
        let made = match device_codecs(ordinal) {
            Some(enc) => Stager::with_encoder(api, engine.clone(), Box::new(enc)),
            None => Stager::new(api, engine.clone()),
        };
        let stager =
            Arc::new(made.map_err(|e| GradwireError::new_err(format!("cuda:{ordinal}: {e}")))?);
        *cur = Some(Current {
            engine: key,
            ordinal,
            stager: stager.clone(),
        });
        Ok(stager)
    }

    /// Submits CUDA tensor `name` of GPU `device` to `engine` with `submit` (the stager's
    /// all-reduce or broadcast), as a handle; errors name the tensor.
    pub fn submit(
        &self,
        engine: &Arc<Engine>,
        name: &str,
        device: usize,
        submit: impl FnOnce(&Stager<CudaApi>) -> gradwire_gpu::Result<Staged<CudaApi>>,
    ) -> PyResult<Handle> {
        let stager = self.stager(engine, device)?;
        let staged = submit(&stager).map_err(|e| raise_in(&format!("tensor {name:?}"), &e))?;
        Ok(Handle::device(staged))
    }

    /// What the stager moved to the host so far (zeros before the first CUDA tensor).
    pub fn stats(&self) -> StagerStats {
        self.lock()
            .as_ref()
            .map(|c| c.stager.stats())
            .unwrap_or_default()
    }

    /// Flushes the stager (after the submissions it has queued), if one runs.
    pub fn flush(&self) {
        if let Some(c) = &*self.lock() {
            c.stager.flush();
        }
    }

    /// Stops the stager (its queued submissions reach the engine first), so the engine can
    /// shut down.
    pub fn reset(&self) {
        let cur = self.lock().take();
        drop(cur);
    }
}

/// The device codecs of GPU `ordinal`, unless turned off (`GRADWIRE_DEVICE_CODECS=off`) or
/// the kernels cannot be compiled here (then with a warning saying why).
fn device_codecs(ordinal: usize) -> Option<DeviceCodecs> {
    let setting = std::env::var("GRADWIRE_DEVICE_CODECS").unwrap_or_default();
    if matches!(setting.as_str(), "off" | "0" | "false") {
        return None;
    }
    match Device::open(ordinal).and_then(DeviceCodecs::new) {
        Ok(enc) => Some(enc),
        Err(e) => {
            tracing::warn!(
                "cuda:{ordinal}: codecs run on the host, each gradient copied down whole \
                 ({e})"
            );
            None
        }
    }
}
