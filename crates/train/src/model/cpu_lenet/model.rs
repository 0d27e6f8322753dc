//! [`Model`] for [`CpuLeNet`]: parameters in and out, the training step (forward, loss and
//! the backward pass) and evaluation.

use std::time::Instant;

use super::forward::{cross_entropy, eval_logits};
use super::layers::{conv_backward, linear_backward, relu_mask, relu_pool_backward};
use super::net::CpuLeNet;
use super::work::Work;
use super::{C1, C2, EVAL_CHUNK, F1, F2};
use crate::data::Batch;
use crate::error::{ConfigError, Result};
use crate::model::{copy_params, overwrite_params, Eval, Model, ModelKind, ParamTensor};

impl Model for CpuLeNet {
    fn kind(&self) -> ModelKind {
        ModelKind::LeNet
    }

    fn num_params(&self) -> usize {
        self.params.len()
    }

    fn layout(&self) -> Vec<usize> {
        self.geom.layout().to_vec()
    }

    fn tensors(&self) -> Vec<ParamTensor> {
        self.tensors.clone()
    }

    fn last_pass_times(&self) -> Option<[Instant; 3]> {
        self.pass_times
    }

    fn params(&self, out: &mut Vec<f32>) {
        copy_params(&self.params, out);
    }

    fn set_params(&mut self, flat: &[f32]) {
        overwrite_params(&mut self.params, flat);
    }

    fn forward_backward(&mut self, batch: &Batch, grads: &mut Vec<f32>) -> Result<f32> {
        let t0 = Instant::now();
        let b = self.check(batch)?;
        let n = b.labels.len();
        if n == 0 {
            return Err(ConfigError::EmptyBatch.into());
        }
        let (g, off) = (self.geom, self.off);
        let p = &self.params;
        let w = &mut self.work;
        Self::forward(&g, &off, p, &b.pixels, n, w);
        w.backward_sized(&g, n);
        // Mean cross-entropy and its gradient (softmax - one-hot) / n.
        let nc = g.classes;
        let nf = n as f32;
        let loss = cross_entropy(&w.z5, &b.labels, nc, &mut w.g5, |x| x / nf);
        let loss = (loss / n as f64) as f32;
        let t1 = Instant::now();

        grads.clear();
        grads.resize(off.end, 0.0);
        let (fin, s2) = (g.fc_in(), g.hp2 * g.wp2);
        // fc3, fc2 (+ ReLU), fc1 (+ ReLU), each through `linear_backward`: a layer's weight
        // at `wo..bo`, its bias at `bo..end`.
        let mut fc = |(wo, bo, end), dims, x: &[f32], gy: &[f32], gx: &mut [f32]| {
            let (gw, gb) = grads[wo..end].split_at_mut(bo - wo);
            linear_backward(n, dims, x, gy, &p[wo..bo], (gw, gb), false, Some(gx));
        };
        fc(
            (off.wf3, off.bf3, off.end),
            (F2, nc),
            &w.a4,
            &w.g5,
            &mut w.ga4,
        );
        relu_mask(&mut w.ga4, &w.a4);
        fc(
            (off.wf2, off.bf2, off.wf3),
            (F1, F2),
            &w.a3,
            &w.ga4,
            &mut w.ga3,
        );
        relu_mask(&mut w.ga3, &w.a3);
        fc(
            (off.wf1, off.bf1, off.wf2),
            (fin, F1),
            &w.x3,
            &w.ga3,
            &mut w.gx3,
        );
        // Unflatten into the channel-major pooled gradient.
        for c in 0..C2 {
            for s in 0..n {
                w.gp2[(c * n + s) * s2..][..s2].copy_from_slice(&w.gx3[s * fin + c * s2..][..s2]);
            }
        }
        relu_pool_backward(&w.gp2, &w.p2, &w.arg2, C2, n, (g.h2, g.w2), &mut w.gz2);
        // conv2: weight gradient gz2 · cols2^T, bias = row sums, input gradient via col2im.
        let (gw, gb) = grads[off.w2..off.wf1].split_at_mut(off.b2 - off.w2);
        conv_backward(
            n,
            C1,
            ((g.hp1, g.wp1), (g.h2, g.w2)),
            &w.gz2,
            &w.cols2,
            &p[off.w2..off.b2],
            (gw, gb),
            false,
            Some((&mut w.gcols2, &mut w.gp1)),
        );
        relu_pool_backward(&w.gp1, &w.p1, &w.arg1, C1, n, (g.h0, g.w0), &mut w.gz1);
        // conv1: weight and bias gradients (the input needs none).
        let (gw, gb) = grads[off.w1..off.w2].split_at_mut(off.b1 - off.w1);
        let hws = ((g.h0, g.w0), (g.h0, g.w0));
        let weight = &p[off.w1..off.b1];
        conv_backward(
            n,
            g.c0,
            hws,
            &w.gz1,
            &w.cols1,
            weight,
            (gw, gb),
            false,
            None,
        );
        self.pass_times = Some([t0, t1, Instant::now()]);
        Ok(loss)
    }

    fn evaluate(&self, batch: &Batch) -> Result<Eval> {
        let b = self.check(batch)?;
        let g = self.geom;
        let per = g.c0 * g.h0 * g.w0;
        let mut work = Work::default();
        let mut eval = Eval::default();
        for (px, labels) in b
            .pixels
            .chunks(EVAL_CHUNK * per)
            .zip(b.labels.chunks(EVAL_CHUNK))
        {
            let n = labels.len();
            Self::forward(&g, &self.off, &self.params, px, n, &mut work);
            eval_logits(&work.z5, labels, g.classes, &mut eval);
        }
        Ok(eval)
    }
}
