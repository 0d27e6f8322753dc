//! The training rules between codec and optimizer (`gradwire_run::rules`), for Python:
//! the same outcome `gradwire train` reaches for the same codec and optimizer.

use gradwire_run::{ClipScope, MomentumMode, OptimizerMomentum, OptimizerView, RuleChoices};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::error::raise;

/// Applies the rules to `codec` and an optimizer described by `optimizer` (its name for
/// messages), `is_sgd`, SGD's `momentum` and `nesterov`, and a global-norm `clip`; with the
/// choices `momentum_correction` (auto, on, off), `clip_scope` (global, local) and
/// `allow_dgc_adaptive`. Returns a dict: `codec` (the spec to run), `optimizer_momentum`
/// (`None`: keep; `(factor, nesterov)` or `()`: the gradient arrives momentum-corrected, the
/// optimizer keeps momentum for weight decay alone, with that factor or its own),
/// `optimizer_clip`, `momentum_correction` (`(beta, nesterov)` for the engine, or `None`) and
/// `local_clip`.
#[pyfunction]
#[pyo3(signature = (codec, optimizer, is_sgd, momentum = 0.0, nesterov = false, clip = None,
    momentum_correction = "auto", clip_scope = "global", allow_dgc_adaptive = false))]
#[allow(clippy::too_many_arguments)]
pub fn resolve_rules<'py>(
    py: Python<'py>,
    codec: &str,
    optimizer: &str,
    is_sgd: bool,
    momentum: f64,
    nesterov: bool,
    clip: Option<f64>,
    momentum_correction: &str,
    clip_scope: &str,
    allow_dgc_adaptive: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let codec_cfg: gradwire_codec::CodecConfig = codec
        .parse()
        .map_err(|e| PyValueError::new_err(format!("codec {codec:?}: {e}")))?;
    let momentum_mode = match momentum_correction {
        "auto" => MomentumMode::Auto,
        "on" => MomentumMode::On,
        "off" => MomentumMode::Off,
        other => {
            return Err(PyValueError::new_err(format!(
                "momentum_correction={other:?}: expected auto, on or off"
            )))
        }
    };
    let clip_scope = match clip_scope {
        "global" => ClipScope::Global,
        "local" => ClipScope::Local,
        other => {
            return Err(PyValueError::new_err(format!(
                "clip_scope={other:?}: expected global or local"
            )))
        }
    };
    let view = OptimizerView {
        name: optimizer.to_string(),
        is_sgd,
        sgd_momentum: (is_sgd && momentum > 0.0).then_some((momentum, nesterov)),
        clip_norm: clip,
    };
    let r = gradwire_run::resolve(
        &codec_cfg,
        &view,
        RuleChoices {
            momentum: momentum_mode,
            clip_scope,
            allow_dgc_adaptive,
        },
    )
    .map_err(|e| raise(&e))?;
    let d = PyDict::new(py);
    d.set_item("codec", r.codec.to_string())?;
    match r.optimizer_momentum {
        OptimizerMomentum::Keep => d.set_item("optimizer_momentum", py.None())?,
        OptimizerMomentum::Corrected(Some(m)) => d.set_item("optimizer_momentum", m)?,
        OptimizerMomentum::Corrected(None) => d.set_item("optimizer_momentum", ())?,
    }
    d.set_item("optimizer_clip", r.optimizer_clip)?;
    d.set_item("momentum_correction", r.momentum_correction)?;
    d.set_item("local_clip", r.local_clip)?;
    Ok(d)
}
