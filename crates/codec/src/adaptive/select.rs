//! The quantization itself: per column, thresholds estimated from a sample, the entries
//! beyond them sent as their mean magnitude, the rest kept in the residual.

use rand::Rng;

use super::Adaptive;
use crate::sparse::{cut_to_k, fit, k_for};
use crate::SparseGrad;

/// The `ceil(pi * len)`-th largest of `v` (sorted descending in place), or +inf if `v` is empty.
fn quantile_desc(v: &mut [f32], pi: f64) -> f32 {
    if v.is_empty() {
        return f32::INFINITY;
    }
    let m = k_for(pi, v.len());
    let (_, kth, _) = v.select_nth_unstable_by(m - 1, |a, b| b.total_cmp(a));
    *kth
}

impl Adaptive {
    /// Quantizes `grad + residual`: fills `self.cols`, and `out` with the sent (index, +-mu).
    pub(super) fn select(&mut self, grad: &[f32], out: &mut SparseGrad) {
        let n = grad.len();
        out.start(n, "adaptive");
        self.cols.clear();
        fit(&mut self.residual, n);
        for (x, &y) in self.residual.iter_mut().zip(grad) {
            *x += y;
        }
        let cols = self.columns(n);
        let mut stream = self.rng.next_stream();
        let pi = self.cfg.pi;
        for col in cols {
            let x = &mut self.residual[col.clone()];
            let len = x.len();
            let want = ((64.0 / pi).ceil() as usize).max(128);
            self.sample.clear();
            if len <= want {
                self.sample.extend_from_slice(x);
            } else {
                self.sample
                    .extend((0..want).map(|_| x[stream.gen_range(0..len)]));
            }
            let (mut pos, mut neg): (Vec<f32>, Vec<f32>) = self
                .sample
                .iter()
                .filter(|v| **v != 0.0 && !v.is_nan())
                .partition(|v| **v > 0.0);
            for v in &mut neg {
                *v = -*v;
            }
            let tp = quantile_desc(&mut pos, pi);
            let tn = quantile_desc(&mut neg, pi);
            self.cand.clear();
            for (i, &v) in x.iter().enumerate() {
                if (v > 0.0 && v >= tp) || (v < 0.0 && -v >= tn) {
                    self.cand.push(i as u32);
                }
            }
            // The quantiles send at least one entry of each sign: the cap never cuts below 2.
            let cap = k_for(self.cfg.max_excess * pi, len).max(2).min(len);
            cut_to_k(x, cap, &mut self.cand, &mut self.scratch);
            let (mut sp, mut np, mut sn, mut nn) = (0f64, 0u64, 0f64, 0u64);
            for &i in &self.cand {
                let v = x[i as usize];
                if v > 0.0 {
                    sp += v as f64;
                    np += 1;
                } else {
                    sn -= v as f64;
                    nn += 1;
                }
            }
            let mu_p = if np > 0 { (sp / np as f64) as f32 } else { 0.0 };
            let mu_n = if nn > 0 { (sn / nn as f64) as f32 } else { 0.0 };
            let unsent = len - self.cand.len();
            let mu_0 = if self.cfg.ternary && unsent > 0 {
                let all: f64 = x.iter().map(|&v| f64::from(v)).sum();
                let mean = ((all - (sp - sn)) / unsent as f64) as f32;
                // Every unsent entry keeps x - mu0 (the candidates are sorted).
                let mut next = self.cand.iter().peekable();
                for (i, r) in x.iter_mut().enumerate() {
                    if next.peek().is_some_and(|&&c| c as usize == i) {
                        next.next();
                    } else {
                        *r -= mean;
                    }
                }
                mean
            } else {
                0.0
            };
            for &i in &self.cand {
                let r = &mut x[i as usize];
                let s = if *r > 0.0 { mu_p } else { -mu_n };
                *r -= s;
                out.indices.push(col.start as u32 + i);
                out.values.push(s);
            }
            self.cols.push((self.cand.len() as u64, mu_p, mu_n, mu_0));
        }
    }
}
