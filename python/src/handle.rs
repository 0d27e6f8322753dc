//! `Handle`: one submitted collective, waited on from Python with the GIL released.

use std::sync::{Mutex, MutexGuard};

use gradwire_gpu::staged::cuda::CudaApi;
use gradwire_gpu::staged::{DevicePtr, RawStream, Staged};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::buffer;
use crate::error::raise_in;

/// What a handle waits on: an engine handle (a CPU tensor), or a staged CUDA tensor.
enum Inner {
    Host(gradwire_engine::Handle),
    Device(Staged<CudaApi>),
}

/// A collective in flight: `test()` never blocks; `wait_into` / `wait_into_device` /
/// `wait_bytes` block (without the GIL) until it completes and raise `GradwireError` if it
/// failed. A handle is waited on once.
#[pyclass(module = "gradwire._gradwire", frozen)]
pub struct Handle {
    name: String,
    inner: Mutex<Option<Inner>>,
}

impl Handle {
    /// Wraps an engine handle.
    pub fn new(h: gradwire_engine::Handle) -> Handle {
        Handle {
            name: h.name().to_string(),
            inner: Mutex::new(Some(Inner::Host(h))),
        }
    }

    /// Wraps a staged CUDA tensor.
    pub fn device(s: Staged<CudaApi>) -> Handle {
        Handle {
            name: s.name().to_string(),
            inner: Mutex::new(Some(Inner::Device(s))),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Inner>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self) -> PyResult<Inner> {
        self.lock().take().ok_or_else(|| {
            PyValueError::new_err(format!("{}: this handle was already waited on", self.name))
        })
    }

    fn wait(&self, py: Python<'_>) -> PyResult<Vec<f32>> {
        let inner = self.take()?;
        py.detach(move || match inner {
            Inner::Host(h) => h.wait().map_err(|e| raise_in(&self.context(), &e)),
            Inner::Device(s) => s.wait_host().map_err(|e| raise_in(&self.context(), &e)),
        })
    }

    fn context(&self) -> String {
        format!("tensor {:?}", self.name)
    }
}

#[pymethods]
impl Handle {
    /// The tensor's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Whether the operation has completed (or was already waited on); never blocks.
    fn test(&self) -> bool {
        match &mut *self.lock() {
            None => true,
            Some(Inner::Host(h)) => h.test(),
            Some(Inner::Device(s)) => s.test(),
        }
    }

    /// Waits, then writes the result, multiplied by `scale`, to the `numel` floats at `out`
    /// (a result of another length raises).
    #[pyo3(signature = (out, numel, scale = 1.0))]
    fn wait_into(&self, py: Python<'_>, out: usize, numel: usize, scale: f32) -> PyResult<()> {
        let data = self.wait(py)?;
        if data.len() != numel {
            return Err(PyValueError::new_err(format!(
                "tensor {:?}: the result has {} elements, the output {numel}",
                self.name,
                data.len()
            )));
        }
        // SAFETY: the Python side passes a live contiguous float32 buffer of `numel`
        // elements that nothing else touches until this returns (`gradwire/_buffers.py`).
        py.detach(|| unsafe { buffer::write(out, &data, scale) })
    }

    /// Waits for the result, then queues its copy, multiplied by `scale`, to the `numel`
    /// floats at device address `out` on `stream` (a `CUstream`), and returns without
    /// waiting for the GPU: work queued on `stream` afterwards reads the result. For a handle
    /// of a CPU tensor, or a result of another length, raises.
    fn wait_into_device(
        &self,
        py: Python<'_>,
        out: usize,
        numel: usize,
        stream: usize,
        scale: f32,
    ) -> PyResult<()> {
        let staged = match self.take()? {
            Inner::Device(s) => s,
            Inner::Host(_) => {
                return Err(PyValueError::new_err(format!(
                    "tensor {:?} was submitted from host memory: use wait_into",
                    self.name
                )))
            }
        };
        // SAFETY: the Python side passes a live contiguous float32 CUDA tensor of `numel`
        // that nothing else writes until the copy, ordered on `stream`, is done.
        py.detach(move || unsafe {
            staged.wait_into(
                DevicePtr(out as u64),
                numel,
                RawStream(stream as u64),
                scale,
            )
        })
        .map_err(|e| raise_in(&self.context(), &e))
    }

    /// Waits, then returns the result as little-endian float32 bytes (for results whose
    /// length the caller does not know in advance: all-gather).
    fn wait_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let data = self.wait(py)?;
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &bytes))
    }
}
