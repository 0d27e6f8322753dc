//! A small multilayer perceptron as a Sandblaster objective: one tanh hidden layer and a
//! logistic output, on synthetic data no linear model can fit (the label is the sign of
//! `x0 * x1`, an XOR). It shows L-BFGS through the shards training a non-convex model, next
//! to [`super::LogisticRegression`].
//!
//! Parameter layout (flat, f32): `W1` (`hidden x dim`, row-major), `b1` (`hidden`), `w2`
//! (`hidden`), `b2` (1).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Objective;

/// A one-hidden-layer tanh network with a logistic output, on synthetic XOR data.
#[derive(Debug, Clone)]
pub struct Mlp {
    x: Vec<f32>,
    y: Vec<f32>,
    dim: usize,
    hidden: usize,
    unit_size: usize,
    l2: f64,
}

impl Mlp {
    /// `n` examples of `dim >= 2` features uniform in [-1, 1] (the label is the sign of the
    /// first two features' product; the others are noise), `hidden` units, units of
    /// `unit_size` examples, seeded.
    pub fn synthetic_xor(
        n: usize,
        dim: usize,
        hidden: usize,
        unit_size: usize,
        l2: f64,
        seed: u64,
    ) -> Self {
        assert!(dim >= 2, "the XOR label needs two features");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut x = Vec::with_capacity(n * dim);
        let mut y = Vec::with_capacity(n);
        for _ in 0..n {
            let row: Vec<f32> = (0..dim).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            y.push(if row[0] * row[1] >= 0.0 { 1.0 } else { -1.0 });
            x.extend_from_slice(&row);
        }
        Mlp {
            x,
            y,
            dim,
            hidden: hidden.max(1),
            unit_size: unit_size.max(1),
            l2,
        }
    }

    /// Small random starting parameters (zero is a saddle point of a tanh network).
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let scale = 1.0 / (self.dim as f32).sqrt();
        (0..self.dim())
            .map(|_| rng.gen_range(-scale..scale))
            .collect()
    }

    /// The share of examples whose sign the network gets right at `w`.
    pub fn accuracy(&self, w: &[f32]) -> f64 {
        let right = (0..self.y.len())
            .filter(|&i| self.forward(i, w).0 * self.y[i] as f64 > 0.0)
            .count();
        right as f64 / self.y.len() as f64
    }

    /// Output and hidden activations for example `i`.
    fn forward(&self, i: usize, w: &[f32]) -> (f64, Vec<f64>) {
        let (d, h) = (self.dim, self.hidden);
        let row = &self.x[i * d..(i + 1) * d];
        let (w1, rest) = w.split_at(h * d);
        let (b1, rest) = rest.split_at(h);
        let (w2, b2) = rest.split_at(h);
        let z: Vec<f64> = (0..h)
            .map(|j| {
                let a = b1[j] as f64
                    + w1[j * d..(j + 1) * d]
                        .iter()
                        .zip(row)
                        .map(|(p, v)| *p as f64 * *v as f64)
                        .sum::<f64>();
                a.tanh()
            })
            .collect();
        let f = b2[0] as f64 + z.iter().zip(w2).map(|(a, b)| a * *b as f64).sum::<f64>();
        (f, z)
    }
}

impl Objective for Mlp {
    fn dim(&self) -> usize {
        self.hidden * self.dim + 2 * self.hidden + 1
    }
    fn units(&self) -> usize {
        self.y.len().div_ceil(self.unit_size)
    }
    fn examples(&self) -> usize {
        self.y.len()
    }
    fn l2(&self) -> f64 {
        self.l2
    }
    fn unit_loss_grad(&self, u: usize, w: &[f32], grad: &mut [f64]) -> f64 {
        let (d, h) = (self.dim, self.hidden);
        let lo = u * self.unit_size;
        let hi = (lo + self.unit_size).min(self.y.len());
        let mut loss = 0.0;
        for i in lo..hi {
            let (f, z) = self.forward(i, w);
            let y = self.y[i] as f64;
            let m = y * f;
            // log(1 + exp(-m)), stably.
            loss += if m > 0.0 {
                (-m).exp().ln_1p()
            } else {
                -m + m.exp().ln_1p()
            };
            let coef = -y / (1.0 + m.exp());
            let row = &self.x[i * d..(i + 1) * d];
            let w2 = &w[h * d + h..h * d + 2 * h];
            let (g_w1, rest) = grad.split_at_mut(h * d);
            let (g_b1, rest) = rest.split_at_mut(h);
            let (g_w2, g_b2) = rest.split_at_mut(h);
            g_b2[0] += coef;
            for j in 0..h {
                g_w2[j] += coef * z[j];
                let da = coef * w2[j] as f64 * (1.0 - z[j] * z[j]);
                g_b1[j] += da;
                for (g, v) in g_w1[j * d..(j + 1) * d].iter_mut().zip(row) {
                    *g += da * *v as f64;
                }
            }
        }
        loss
    }
}
