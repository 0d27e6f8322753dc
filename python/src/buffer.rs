//! Raw `float32` buffers handed over from Python as `(address, element count)`.
//!
//! The Python side (`gradwire/_buffers.py`) passes only the memory of a contiguous CPU
//! `float32` tensor it holds a reference to until the operation that uses it completes; that
//! is the contract these functions rely on. A null address is refused.

use pyo3::exceptions::PyValueError;
use pyo3::PyResult;

/// Copies `numel` floats from `addr`, each multiplied by `scale` (skipped when 1).
///
/// # Safety
/// `addr` must point to `numel` readable, initialised, aligned `f32` that no one writes
/// during the call.
pub unsafe fn read(addr: usize, numel: usize, scale: f32) -> PyResult<Vec<f32>> {
    if numel == 0 {
        return Ok(Vec::new());
    }
    check(addr)?;
    // SAFETY: the caller's contract.
    let src = unsafe { std::slice::from_raw_parts(addr as *const f32, numel) };
    Ok(if scale == 1.0 {
        src.to_vec()
    } else {
        src.iter().map(|v| v * scale).collect()
    })
}

/// Writes `data`, each value multiplied by `scale` (skipped when 1), to `addr`.
///
/// # Safety
/// `addr` must point to `data.len()` writable, aligned `f32` that no one else reads or
/// writes during the call.
pub unsafe fn write(addr: usize, data: &[f32], scale: f32) -> PyResult<()> {
    if data.is_empty() {
        return Ok(());
    }
    check(addr)?;
    // SAFETY: the caller's contract.
    let dst = unsafe { std::slice::from_raw_parts_mut(addr as *mut f32, data.len()) };
    if scale == 1.0 {
        dst.copy_from_slice(data);
    } else {
        for (d, s) in dst.iter_mut().zip(data) {
            *d = s * scale;
        }
    }
    Ok(())
}

fn check(addr: usize) -> PyResult<()> {
    if addr == 0 || !addr.is_multiple_of(std::mem::align_of::<f32>()) {
        return Err(PyValueError::new_err(format!(
            "buffer address {addr:#x} is not a float32 buffer"
        )));
    }
    Ok(())
}
