//! `gradwire._gradwire`: the native half of the Python package. It joins the job through
//! `gradwire-run` (the launcher variables and transports the CLI reads), runs one
//! `gradwire-engine` per process, and hands Python the engine's non-blocking collectives,
//! the codecs and the training rules. The Python modules in `gradwire/` build Horovod's API
//! and DDP's comm hooks on top of it; nothing here knows torch.
//!
//! Buffers cross as `(address, element count)` of contiguous `float32` memory that the
//! Python side checked and keeps alive until the operation completes (`gradwire/_buffers.py`):
//! no Python-side copy, one copy in Rust into the engine's buffer and one back into the
//! tensor. CUDA tensors cross as `(device address, element count, stream, device)` and go
//! through pinned host buffers, the copies queued on the caller's stream ([`device`]). The
//! GIL is released while the engine works or waits.

mod buffer;
mod codec;
mod device;
mod elastic;
mod error;
mod handle;
mod rules;
mod runtime;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _gradwire(m: &Bound<'_, PyModule>) -> PyResult<()> {
    error::register(m)?;
    m.add_class::<runtime::Runtime>()?;
    m.add_class::<handle::Handle>()?;
    m.add_function(wrap_pyfunction!(rules::resolve_rules, m)?)?;
    m.add_function(wrap_pyfunction!(codec::codec_examples, m)?)?;
    m.add_function(wrap_pyfunction!(codec::codec_normalize, m)?)?;
    m.add_function(wrap_pyfunction!(codec::codec_encode, m)?)?;
    m.add_function(wrap_pyfunction!(codec::codec_decode, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::now_us, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::init_logging, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MPI_BUILT", gradwire_run::join::MPI_BUILT)?;
    Ok(())
}
