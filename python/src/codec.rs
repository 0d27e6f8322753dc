//! The codecs themselves, outside the engine: parse a spec, and encode / decode one
//! gradient the way a rank's codec does, so Python can check or use a codec directly.

use gradwire_codec::{BuildContext, CodecConfig, Progress, TensorInfo, TensorRole};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::error::raise_in;

fn parse(spec: &str) -> PyResult<CodecConfig> {
    spec.parse()
        .map_err(|e| PyValueError::new_err(format!("codec {spec:?}: {e}")))
}

fn floats(bytes: &[u8]) -> PyResult<Vec<f32>> {
    if !bytes.len().is_multiple_of(4) {
        return Err(PyValueError::new_err(format!(
            "{} bytes are not whole float32 values",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn info(shape: Vec<usize>) -> TensorInfo {
    let role = if shape.len() == 1 {
        TensorRole::Bias
    } else {
        TensorRole::Other
    };
    TensorInfo::new(shape, role)
}

/// The codec specs of the reference set (one per codec and notable option), as strings.
#[pyfunction]
pub fn codec_examples() -> Vec<String> {
    CodecConfig::examples()
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// `spec` parsed and written back in full (every parameter, its paper's defaults filled in).
#[pyfunction]
pub fn codec_normalize(spec: &str) -> PyResult<String> {
    Ok(parse(spec)?.to_string())
}

/// Encodes the float32 gradient `grad` (little-endian bytes) of `shape` with a codec built
/// for rank `rank` of `world` with `seed`, `steps` times in a row (step `s` at progress
/// `(s, s * epochs_per_step)`; stateful codecs carry residuals and momentum from one to the
/// next). Returns each step's payload.
#[pyfunction]
#[pyo3(signature = (spec, grad, shape, steps = 1, seed = 0, rank = 0, world = 1,
    epochs_per_step = 0.0))]
#[allow(clippy::too_many_arguments)]
pub fn codec_encode<'py>(
    py: Python<'py>,
    spec: &str,
    grad: &[u8],
    shape: Vec<usize>,
    steps: usize,
    seed: u64,
    rank: usize,
    world: usize,
    epochs_per_step: f32,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let cfg = parse(spec)?;
    let g = floats(grad)?;
    let t = info(shape);
    if t.numel() != g.len() {
        return Err(PyValueError::new_err(format!(
            "shape {:?} holds {} elements, the gradient {}",
            t.shape,
            t.numel(),
            g.len()
        )));
    }
    if world == 0 || rank >= world {
        return Err(PyValueError::new_err(format!(
            "rank {rank} is out of range for {world} ranks"
        )));
    }
    let ctx = BuildContext::new(seed, rank, world, Vec::new()).with_tensors(vec![t]);
    let mut codec = cfg.build(&ctx);
    let mut out = Vec::new();
    let mut payloads = Vec::with_capacity(steps);
    for s in 0..steps {
        codec.set_progress(Progress {
            step: s as u64,
            epoch: s as f32 * epochs_per_step,
        });
        codec.encode(&g, &mut out);
        payloads.push(PyBytes::new(py, &out));
    }
    Ok(payloads)
}

/// Decodes `payload` (a gradient of `shape`) with the codec `spec` and returns the values
/// as little-endian float32 bytes.
#[pyfunction]
pub fn codec_decode<'py>(
    py: Python<'py>,
    spec: &str,
    payload: &[u8],
    shape: Vec<usize>,
) -> PyResult<Bound<'py, PyBytes>> {
    let cfg = parse(spec)?;
    let t = info(shape);
    let mut acc = vec![0.0f32; t.numel()];
    let ctx = BuildContext::default().with_tensors(vec![t]);
    cfg.build(&ctx)
        .decode_add(payload, &mut acc)
        .map_err(|e| raise_in(&format!("decoding a {spec} payload"), &e))?;
    let bytes: Vec<u8> = acc.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(PyBytes::new(py, &bytes))
}
