//! The unpartitioned model a split starts from: its tensors (names, shapes, roles, flat
//! order) and its layers, read from the model [`ModelKind::build`] makes, so that every
//! partition slices exactly the parameters that model would have.

use super::layer::{Layer, Op};
use crate::data::DataShape;
use crate::error::{PartitionError, Result};
use crate::model::{Model, ModelKind, ParamTensor};

/// The layers and tensors of the whole model (layer `i` owns tensors `2i` and `2i + 1`).
#[derive(Debug, Clone)]
pub(crate) struct Arch {
    pub(crate) kind: ModelKind,
    pub(crate) tensors: Vec<ParamTensor>,
    pub(crate) layers: Vec<Layer>,
    /// `[channels, height, width]` of the input images.
    pub(crate) image: [usize; 3],
    pub(crate) classes: usize,
}

impl Arch {
    /// Builds the whole model once (parameters from `seed`) and reads its structure.
    /// Returns the model too, for its parameters.
    pub(crate) fn build(
        kind: ModelKind,
        shape: DataShape,
        seed: u64,
    ) -> Result<(Arch, Box<dyn Model>)> {
        let DataShape::Image {
            shape: image,
            classes,
        } = shape
        else {
            return Err(PartitionError::NotImage { model: kind }.into());
        };
        if !matches!(
            kind,
            ModelKind::Mlp | ModelKind::WideMlp(_) | ModelKind::LeNet
        ) {
            return Err(PartitionError::NotSplittable { model: kind }.into());
        }
        let model = kind.build(shape, seed)?;
        let tensors = model.tensors();
        if tensors.len() % 2 != 0 || tensors.is_empty() {
            return Err(PartitionError::NotPairs {
                model: kind,
                tensors: tensors.len(),
            }
            .into());
        }
        let mut layers = Vec::with_capacity(tensors.len() / 2);
        let n_layers = tensors.len() / 2;
        let [c0, h0, w0] = image;
        for (i, pair) in tensors.chunks_exact(2).enumerate() {
            let (w, b) = (&pair[0], &pair[1]);
            let name = w
                .name
                .strip_suffix(".weight")
                .unwrap_or(&w.name)
                .to_string();
            let op = match w.shape[..] {
                [fan_in, fan_out] => Op::Linear {
                    fan_in,
                    fan_out,
                    relu: i + 1 < n_layers,
                },
                [c_out, c_in, 5, 5] if kind == ModelKind::LeNet && i < 2 => {
                    // conv1 (padded, same size) reads the images; conv2 (unpadded) reads
                    // the first block's pooled output and feeds the fully connected layers.
                    let (hw, pad) = if i == 0 {
                        ((h0, w0), 2)
                    } else {
                        ((h0 / 2, w0 / 2), 0)
                    };
                    Op::ConvPool {
                        c_in,
                        c_out,
                        hw,
                        pad,
                        sample_major: i == 0,
                        flatten: i == 1,
                    }
                }
                _ => {
                    return Err(PartitionError::TensorShape {
                        model: kind,
                        tensor: w.name.clone(),
                        shape: w.shape.clone(),
                    }
                    .into())
                }
            };
            if op.weight_len() != w.len() || op.bias_len() != b.len() {
                return Err(PartitionError::LayerTensors {
                    model: kind,
                    layer: name,
                }
                .into());
            }
            layers.push(Layer { name, op });
        }
        // Each layer must read what the one before writes.
        let mut width = c0 * h0 * w0;
        for l in &layers {
            if l.op.in_per_sample() != width {
                return Err(PartitionError::LayerWidths {
                    model: kind,
                    layer: l.name.clone(),
                    reads: l.op.in_per_sample(),
                    writes: width,
                }
                .into());
            }
            width = l.op.out_per_sample();
        }
        if width != classes {
            return Err(PartitionError::Classes {
                model: kind,
                writes: width,
                classes,
            }
            .into());
        }
        Ok((
            Arch {
                kind,
                tensors,
                layers,
                image,
                classes,
            },
            model,
        ))
    }

    /// Input values per sample.
    pub(crate) fn inputs(&self) -> usize {
        self.image.iter().product()
    }
}
