//! The Python exception every gradwire failure raises: `gradwire.GradwireError`, a
//! `RuntimeError` carrying the Rust error's whole chain of causes (a dead rank named, a
//! mismatched tensor named).

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

create_exception!(
    _gradwire,
    GradwireError,
    PyRuntimeError,
    "A gradwire failure: the text is the Rust error with its causes (which rank, which tensor)."
);

/// Adds the exception to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("GradwireError", m.py().get_type::<GradwireError>())
}

/// `err` and its sources, joined by `: ` (each source once, even when a message already
/// quotes it).
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    text
}

/// A [`GradwireError`] with `err`'s whole chain.
pub fn raise(err: &(dyn std::error::Error + 'static)) -> PyErr {
    GradwireError::new_err(chain(err))
}

/// A [`GradwireError`] with `context: ` before `err`'s chain.
pub fn raise_in(context: &str, err: &(dyn std::error::Error + 'static)) -> PyErr {
    GradwireError::new_err(format!("{context}: {}", chain(err)))
}
