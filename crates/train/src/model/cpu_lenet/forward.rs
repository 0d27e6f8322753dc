//! The forward pass ([`CpuLeNet`]'s `forward`: conv, pool, linear layers as GEMMs over the
//! batch), the log-softmax of the logits and their evaluation.

use super::geometry::{Geom, Offsets};
use super::layers::{conv_pool, linear_forward};
use super::net::CpuLeNet;
use super::work::Work;
use super::{C1, C2, F1, F2};
use crate::model::Eval;

impl CpuLeNet {
    /// Forward pass of `n` samples of `pixels` (`[N, C, H, W]`) into `work` (logits in
    /// `work.z5`).
    pub(super) fn forward(
        geom: &Geom,
        off: &Offsets,
        params: &[f32],
        pixels: &[f32],
        n: usize,
        work: &mut Work,
    ) {
        let g = *geom;
        work.forward_sized(&g, n);
        let p = params;
        let pl0 = g.h0 * g.w0;
        // conv1 (pad 2, same size) + bias + ReLU + pool.
        conv_pool(
            pixels,
            n,
            g.c0,
            (g.h0, g.w0),
            (g.c0 * pl0, pl0),
            2,
            (g.h0, g.w0),
            (&p[off.w1..off.b1], &p[off.b1..off.w2]),
            &mut work.cols1,
            &mut work.z1,
            (&mut work.p1, &mut work.arg1),
        );
        // conv2 (no pad) + bias + ReLU + pool; p1 is channel-major [C1, N, hp1, wp1].
        let pp1 = g.hp1 * g.wp1;
        conv_pool(
            &work.p1,
            n,
            C1,
            (g.hp1, g.wp1),
            (pp1, n * pp1),
            0,
            (g.h2, g.w2),
            (&p[off.w2..off.b2], &p[off.b2..off.wf1]),
            &mut work.cols2,
            &mut work.z2,
            (&mut work.p2, &mut work.arg2),
        );
        // Flatten as burn does ([N, C, H, W] -> [N, C*H*W]) from channel-major p2.
        let (s2, fin) = (g.hp2 * g.wp2, g.fc_in());
        for c in 0..C2 {
            for s in 0..n {
                work.x3[s * fin + c * s2..][..s2]
                    .copy_from_slice(&work.p2[(c * n + s) * s2..][..s2]);
            }
        }
        // fc1, fc2 (+ ReLU), fc3; Linear weights are [in, out].
        let fc1 = (&p[off.wf1..off.bf1], &p[off.bf1..off.wf2]);
        linear_forward(n, (fin, F1), &work.x3, fc1, &mut work.a3, true);
        let fc2 = (&p[off.wf2..off.bf2], &p[off.bf2..off.wf3]);
        linear_forward(n, (F1, F2), &work.a3, fc2, &mut work.a4, true);
        let fc3 = (&p[off.wf3..off.bf3], &p[off.bf3..off.end]);
        linear_forward(n, (F2, g.classes), &work.a4, fc3, &mut work.z5, false);
    }
}

/// Log-softmax of one row of logits into `out`.
pub(crate) fn log_softmax_row(z: &[f32], out: &mut [f32]) {
    let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: f32 = z.iter().map(|&x| (x - m).exp()).sum();
    let lse = m + s.ln();
    for (o, &x) in out.iter_mut().zip(z) {
        *o = x - lse;
    }
}

/// Cross-entropy of `logits` (`labels.len()` rows of `classes`): returns the sum of the
/// samples' losses and writes into `g` the gradient `softmax - one-hot`, each softmax value
/// and the one-hot's `1` passed through `scale` (the division by the batch size).
pub(crate) fn cross_entropy<F: Fn(f32) -> f32>(
    logits: &[f32],
    labels: &[u8],
    classes: usize,
    g: &mut [f32],
    scale: F,
) -> f64 {
    let mut loss = 0.0f64;
    for (s, &label) in labels.iter().enumerate() {
        let gr = &mut g[s * classes..][..classes];
        log_softmax_row(&logits[s * classes..][..classes], gr);
        loss -= f64::from(gr[usize::from(label)]);
        for x in gr.iter_mut() {
            *x = scale(x.exp());
        }
        gr[usize::from(label)] -= scale(1.0);
    }
    loss
}

/// Adds the loss sum, correct count and sample count of `logits` against `labels` to
/// `eval` (the first maximum wins, as burn's argmax).
pub(crate) fn eval_logits(logits: &[f32], labels: &[u8], classes: usize, eval: &mut Eval) {
    let mut lp = vec![0.0f32; classes];
    for (s, &label) in labels.iter().enumerate() {
        let z = &logits[s * classes..][..classes];
        log_softmax_row(z, &mut lp);
        let mut best = 0;
        for (j, &v) in lp.iter().enumerate() {
            if v > lp[best] {
                best = j;
            }
        }
        eval.correct += u64::from(best == usize::from(label));
        eval.loss_sum -= f64::from(lp[usize::from(label)]);
        eval.n += 1;
    }
}
