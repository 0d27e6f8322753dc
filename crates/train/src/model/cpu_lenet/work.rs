//! The activations and gradients of one batch ([`Work`]), reused from step to step.

use super::geometry::Geom;
use super::{C1, C2, F1, F2, KK};

/// Activations (and their gradients) of one batch of `n` samples, reused across steps.
#[derive(Debug, Default)]
pub(super) struct Work {
    pub(super) n: usize,
    pub(super) cols1: Vec<f32>,
    pub(super) z1: Vec<f32>,
    pub(super) p1: Vec<f32>,
    pub(super) arg1: Vec<u8>,
    pub(super) cols2: Vec<f32>,
    pub(super) z2: Vec<f32>,
    pub(super) p2: Vec<f32>,
    pub(super) arg2: Vec<u8>,
    pub(super) x3: Vec<f32>,
    pub(super) a3: Vec<f32>,
    pub(super) a4: Vec<f32>,
    pub(super) z5: Vec<f32>,
    // Gradients.
    pub(super) g5: Vec<f32>,
    pub(super) ga4: Vec<f32>,
    pub(super) ga3: Vec<f32>,
    pub(super) gx3: Vec<f32>,
    pub(super) gp2: Vec<f32>,
    pub(super) gz2: Vec<f32>,
    pub(super) gcols2: Vec<f32>,
    pub(super) gp1: Vec<f32>,
    pub(super) gz1: Vec<f32>,
}

/// Resizes `v` to `len` (contents unspecified until written).
fn size(v: &mut Vec<f32>, len: usize) {
    v.resize(len, 0.0);
}

impl Work {
    /// Sizes the forward buffers for `n` samples.
    pub(super) fn forward_sized(&mut self, g: &Geom, n: usize) {
        let p1 = n * g.h0 * g.w0;
        let p2 = n * g.h2 * g.w2;
        size(&mut self.cols1, g.c0 * KK * p1);
        size(&mut self.z1, C1 * p1);
        size(&mut self.p1, C1 * n * g.hp1 * g.wp1);
        self.arg1.resize(C1 * n * g.hp1 * g.wp1, 0);
        size(&mut self.cols2, C1 * KK * p2);
        size(&mut self.z2, C2 * p2);
        size(&mut self.p2, C2 * n * g.hp2 * g.wp2);
        self.arg2.resize(C2 * n * g.hp2 * g.wp2, 0);
        size(&mut self.x3, n * g.fc_in());
        size(&mut self.a3, n * F1);
        size(&mut self.a4, n * F2);
        size(&mut self.z5, n * g.classes);
        self.n = n;
    }

    /// Sizes the backward buffers for `n` samples.
    pub(super) fn backward_sized(&mut self, g: &Geom, n: usize) {
        size(&mut self.g5, n * g.classes);
        size(&mut self.ga4, n * F2);
        size(&mut self.ga3, n * F1);
        size(&mut self.gx3, n * g.fc_in());
        size(&mut self.gp2, C2 * n * g.hp2 * g.wp2);
        size(&mut self.gz2, C2 * n * g.h2 * g.w2);
        size(&mut self.gcols2, C1 * KK * n * g.h2 * g.w2);
        size(&mut self.gp1, C1 * n * g.hp1 * g.wp1);
        size(&mut self.gz1, C1 * n * g.h0 * g.w0);
    }
}
