//! `Handle`: one submitted collective, waited on from Python with the GIL released.

use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::buffer;
use crate::error::raise_in;

/// A collective in flight: `test()` never blocks; `wait_into` / `wait_bytes` block (without
/// the GIL) until it completes and raise `GradwireError` if it failed. A handle is waited on
/// once.
#[pyclass(module = "gradwire._gradwire", frozen)]
pub struct Handle {
    name: String,
    inner: Mutex<Option<gradwire_engine::Handle>>,
}

impl Handle {
    /// Wraps an engine handle.
    pub fn new(h: gradwire_engine::Handle) -> Handle {
        Handle {
            name: h.name().to_string(),
            inner: Mutex::new(Some(h)),
        }
    }

    fn take(&self) -> PyResult<gradwire_engine::Handle> {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| {
                PyValueError::new_err(format!("{}: this handle was already waited on", self.name))
            })
    }

    fn wait(&self, py: Python<'_>) -> PyResult<Vec<f32>> {
        let h = self.take()?;
        py.detach(move || h.wait())
            .map_err(|e| raise_in(&format!("tensor {:?}", self.name), &e))
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
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_none_or(|h| h.test())
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

    /// Waits, then returns the result as little-endian float32 bytes (for results whose
    /// length the caller does not know in advance: all-gather).
    fn wait_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let data = self.wait(py)?;
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &bytes))
    }
}
