//! [`CpuLeNet`]: the hand-written LeNet-5's parameters and buffers, its construction (the
//! burn LeNet's layout and initialization) and the batch checks.

use std::time::Instant;

use super::geometry::{Geom, Offsets};
use super::work::Work;
use super::K;
use crate::data::{Batch, ImageBatch};
use crate::error::{Error, ModelError, Result};
use crate::model::init::{init_flat, ParamInit};
use crate::model::{ModelKind, ParamTensor};

/// The hand-written LeNet-5 behind the [`Model`](crate::model::Model) trait.
pub(crate) struct CpuLeNet {
    pub(super) geom: Geom,
    pub(super) off: Offsets,
    pub(super) params: Vec<f32>,
    pub(super) tensors: Vec<ParamTensor>,
    pub(super) work: Work,
    pub(super) pass_times: Option<[Instant; 3]>,
}

impl CpuLeNet {
    /// A LeNet for `[channels, h, w]` images and `classes` outputs, initialized from `seed`
    /// exactly as the burn LeNet (`tensors` and `plan` are that model's, in flat order).
    pub(crate) fn new(
        shape: [usize; 3],
        classes: usize,
        tensors: Vec<ParamTensor>,
        plan: &[ParamInit],
        seed: u64,
    ) -> Result<Self> {
        let [c0, h0, w0] = shape;
        let (hp1, wp1) = (h0 / 2, w0 / 2);
        let (h2, w2) = (hp1.saturating_sub(K - 1), wp1.saturating_sub(K - 1));
        let geom = Geom {
            c0,
            h0,
            w0,
            h2,
            w2,
            hp1,
            wp1,
            hp2: h2 / 2,
            wp2: w2 / 2,
            classes,
        };
        if geom.hp2 == 0 || geom.wp2 == 0 || c0 == 0 || classes == 0 {
            return Err(ModelError::LeNetShape {
                c: c0,
                h: h0,
                w: w0,
                classes,
            }
            .into());
        }
        let layout = geom.layout();
        let theirs: Vec<usize> = tensors.iter().map(ParamTensor::len).collect();
        if theirs != layout {
            return Err(ModelError::LeNetLayout {
                ours: layout.to_vec(),
                theirs,
            }
            .into());
        }
        let params = init_flat(&layout, plan, seed);
        Ok(CpuLeNet {
            geom,
            off: Offsets::new(&layout),
            params,
            tensors,
            work: Work::default(),
            pass_times: None,
        })
    }

    /// Checks a batch against the model's input shape and classes.
    pub(super) fn check<'a>(&self, batch: &'a Batch) -> Result<&'a ImageBatch> {
        let Batch::Images(b) = batch else {
            return Err(Error::BatchMismatch {
                model: ModelKind::LeNet.name(),
                batch: batch.kind(),
            });
        };
        let g = &self.geom;
        if b.shape != [g.c0, g.h0, g.w0] {
            return Err(ModelError::LeNetBatch {
                c: g.c0,
                h: g.h0,
                w: g.w0,
                got: b.shape,
            }
            .into());
        }
        let want = b.labels.len() * g.c0 * g.h0 * g.w0;
        Error::check_len("LeNet input pixels", want, b.pixels.len())?;
        if let Some(&l) = b.labels.iter().find(|&&l| usize::from(l) >= g.classes) {
            return Err(ModelError::Label {
                label: l,
                classes: g.classes,
            }
            .into());
        }
        Ok(b)
    }
}
