//! The runtime optimizer: applies one update to a flat parameter buffer from a flat
//! gradient, keeping its state (step count, moment buffers) separate and saveable.

use serde::{Deserialize, Serialize};

use super::config::{OptimizerConfig, OptimizerKind};
use crate::error::{ConfigError, Error, Result};

/// Everything an optimizer remembers between steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OptimizerState {
    /// Steps taken so far.
    pub step: u64,
    /// Momentum buffer (SGD) or first moment (Adam); empty until needed.
    pub m: Vec<f32>,
    /// Second moment (Adam); empty otherwise.
    pub v: Vec<f32>,
}

const MAGIC: &[u8; 8] = b"GWOPTST1";

impl OptimizerState {
    /// A compact little-endian encoding: magic, step, len(m), len(v), then the buffers.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + 4 * (self.m.len() + self.v.len()));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.step.to_le_bytes());
        out.extend_from_slice(&(self.m.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.v.len() as u64).to_le_bytes());
        for x in self.m.iter().chain(&self.v) {
            out.extend_from_slice(&x.to_le_bytes());
        }
        out
    }

    /// Decodes [`OptimizerState::to_bytes`]; malformed input is an error, never a panic.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = |w: &str| Error::State(w.to_string());
        if bytes.len() < 32 || &bytes[..8] != MAGIC {
            return Err(bad("not an optimizer state (bad magic or too short)"));
        }
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let (step, nm, nv) = (word(8), word(16), word(24));
        let body = &bytes[32..];
        let want = nm
            .checked_add(nv)
            .and_then(|n| n.checked_mul(4))
            .filter(|&n| n == body.len() as u64)
            .ok_or_else(|| bad("buffer lengths do not match the data"))?;
        debug_assert_eq!(want as usize, body.len());
        let floats: Vec<f32> = body
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let (m, v) = floats.split_at(nm as usize);
        Ok(OptimizerState {
            step,
            m: m.to_vec(),
            v: v.to_vec(),
        })
    }
}

/// An optimizer over flat buffers of a fixed length.
#[derive(Debug, Clone)]
pub struct Optimizer {
    config: OptimizerConfig,
    len: usize,
    total_steps: Option<u64>,
    state: OptimizerState,
}

impl OptimizerConfig {
    /// The runtime optimizer for `len` parameters; `total_steps` (the run length) feeds a
    /// cosine decay that leaves it open.
    pub fn build(&self, len: usize, total_steps: Option<u64>) -> Result<Optimizer> {
        self.validate()?;
        Ok(Optimizer {
            config: self.clone(),
            len,
            total_steps,
            state: OptimizerState::default(),
        })
    }
}

impl Optimizer {
    /// The settings.
    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> u64 {
        self.state.step
    }

    /// The learning rate the next step will use.
    pub fn current_lr(&self) -> f64 {
        self.config.lr_at(self.state.step, self.total_steps)
    }

    /// The state, for checkpoints.
    pub fn state(&self) -> &OptimizerState {
        &self.state
    }

    /// Restores a saved state; its buffers must be empty or `len` long.
    pub fn set_state(&mut self, state: OptimizerState) -> Result<()> {
        for (name, b) in [("m", &state.m), ("v", &state.v)] {
            if !b.is_empty() && b.len() != self.len {
                return Err(Error::State(format!(
                    "buffer {name} holds {} values, the model has {}",
                    b.len(),
                    self.len
                )));
            }
        }
        self.state = state;
        Ok(())
    }

    /// Applies one update to `params` from `grads` (both `len` long) and returns the
    /// learning rate used.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32]) -> Result<f64> {
        for (what, got) in [("parameters", params.len()), ("gradients", grads.len())] {
            Error::check_len(what, self.len, got)?;
        }
        let lr = self.current_lr();
        let scale = match self.config.clip_norm {
            Some(max) => {
                let norm = l2_norm(grads);
                if norm > max {
                    (max / (norm + 1e-6)) as f32
                } else {
                    1.0
                }
            }
            None => 1.0,
        };
        self.update(params, grads, 0, scale);
        self.state.step += 1;
        Ok(lr)
    }

    /// Whether the update of one part of the parameters needs nothing from the others (no
    /// global-norm clipping), so that [`Optimizer::step_part`] may be used.
    pub fn updates_by_part(&self) -> bool {
        self.config.clip_norm.is_none()
    }

    /// Updates the parameters `offset..offset + params.len()` from their gradients, as part
    /// of the current step; [`Optimizer::finish_step`] ends the step once every part is done.
    /// The parts of one step together give exactly [`Optimizer::step`]'s result. Refused
    /// under global-norm clipping (the norm needs the whole gradient).
    pub fn step_part(&mut self, params: &mut [f32], grads: &[f32], offset: usize) -> Result<()> {
        if !self.updates_by_part() {
            return Err(ConfigError::ClipNeedsWholeGradient.into());
        }
        if params.len() != grads.len() || offset + params.len() > self.len {
            return Err(Error::LengthMismatch {
                what: "parameter part",
                expected: self.len,
                got: offset + params.len().max(grads.len()),
            });
        }
        self.update(params, grads, offset, 1.0);
        Ok(())
    }

    /// Ends a step made of [`Optimizer::step_part`] calls; returns the learning rate used.
    pub fn finish_step(&mut self) -> f64 {
        let lr = self.current_lr();
        self.state.step += 1;
        lr
    }

    /// The update rule on `params`/`grads`, the slice `offset..` of the whole, with the
    /// gradient scaled by `scale`; does not advance the step count.
    fn update(&mut self, params: &mut [f32], grads: &[f32], offset: usize, scale: f32) {
        let lr = self.current_lr();
        let wd = self.config.weight_decay as f32;
        let lr32 = lr as f32;
        let len = self.len;
        let st = &mut self.state;
        let range = offset..offset + params.len();
        match self.config.kind {
            OptimizerKind::Sgd {
                momentum,
                dampening,
                nesterov,
                corrected: true,
            } if momentum > 0.0 && wd > 0.0 => {
                // DGC's reference optimizer: the gradient arrives momentum-corrected; the
                // weight decay term keeps a momentum buffer of its own.
                let mu = momentum as f32;
                let damp = 1.0 - dampening as f32;
                let first = st.step == 0;
                if st.m.is_empty() {
                    st.m = vec![0.0; len];
                }
                for ((p, &g), b) in params.iter_mut().zip(grads).zip(&mut st.m[range]) {
                    let d = wd * *p;
                    *b = if first { d } else { mu * *b + damp * d };
                    let d = if nesterov { d + mu * *b } else { *b };
                    *p -= lr32 * (g * scale + d);
                }
            }
            OptimizerKind::Sgd {
                momentum,
                dampening,
                nesterov,
                corrected,
            } => {
                if momentum == 0.0 || corrected {
                    for (p, &g) in params.iter_mut().zip(grads) {
                        let g = g * scale + wd * *p;
                        *p -= lr32 * g;
                    }
                } else {
                    let mu = momentum as f32;
                    let damp = 1.0 - dampening as f32;
                    // PyTorch's first step takes buf = g.
                    let first = st.step == 0;
                    if st.m.is_empty() {
                        st.m = vec![0.0; len];
                    }
                    for ((p, &g), b) in params.iter_mut().zip(grads).zip(&mut st.m[range]) {
                        let g = g * scale + wd * *p;
                        *b = if first { g } else { mu * *b + damp * g };
                        let d = if nesterov { g + mu * *b } else { *b };
                        *p -= lr32 * d;
                    }
                }
            }
            OptimizerKind::Adam {
                beta1,
                beta2,
                eps,
                decoupled,
            } => {
                if st.m.is_empty() {
                    st.m = vec![0.0; len];
                    st.v = vec![0.0; len];
                }
                let t = (st.step + 1) as i32;
                let bc1 = 1.0 - beta1.powi(t);
                let bc2 = 1.0 - beta2.powi(t);
                let step_size = (lr / bc1) as f32;
                let bc2_sqrt = bc2.sqrt() as f32;
                let (b1, b2, eps) = (beta1 as f32, beta2 as f32, eps as f32);
                let decay = if decoupled { 1.0 - lr32 * wd } else { 1.0 };
                let l2 = if decoupled { 0.0 } else { wd };
                for (((p, &g), m), v) in params
                    .iter_mut()
                    .zip(grads)
                    .zip(&mut st.m[range.clone()])
                    .zip(&mut st.v[range])
                {
                    *p *= decay;
                    let g = g * scale + l2 * *p;
                    *m = b1 * *m + (1.0 - b1) * g;
                    *v = b2 * *v + (1.0 - b2) * g * g;
                    let denom = v.sqrt() / bc2_sqrt + eps;
                    *p -= step_size * *m / denom;
                }
            }
            OptimizerKind::Adagrad {
                eps,
                initial_accumulator,
            } => {
                if st.v.is_empty() {
                    st.v = vec![initial_accumulator as f32; len];
                }
                let eps = eps as f32;
                for ((p, &g), sum) in params.iter_mut().zip(grads).zip(&mut st.v[range]) {
                    let g = g * scale + wd * *p;
                    *sum += g * g;
                    *p -= lr32 * g / (sum.sqrt() + eps);
                }
            }
        }
    }
}

/// The L2 norm of `grads`, accumulated in f64 (gradient clipping's measure, here and in the
/// trainer's local clipping).
pub(crate) fn l2_norm(grads: &[f32]) -> f64 {
    grads
        .iter()
        .map(|&g| f64::from(g) * f64::from(g))
        .sum::<f64>()
        .sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(spec: &str, p0: &[f32], grads: &[[f32; 2]]) -> Vec<f32> {
        let c: OptimizerConfig = spec.parse().unwrap();
        let mut o = c.build(2, None).unwrap();
        let mut p = p0.to_vec();
        for g in grads {
            o.step(&mut p, g).unwrap();
        }
        p
    }

    fn close(a: &[f32], b: &[f64]) {
        for (x, y) in a.iter().zip(b) {
            assert!((f64::from(*x) - y).abs() < 1e-6, "{a:?} vs {b:?}");
        }
    }

    const G: [[f32; 2]; 3] = [[1.0, -2.0], [0.5, 0.5], [-1.0, 4.0]];

    #[test]
    fn sgd_momentum_matches_hand_computation() {
        // lr 0.1, mu 0.9, wd 0: buf1 = g1, buf2 = 0.9 buf1 + g2, buf3 = 0.9 buf2 + g3.
        let p = run("sgd:lr=0.1,momentum=0.9", &[1.0, 1.0], &G);
        let b1 = [1.0, -2.0];
        let b2 = [0.9 * 1.0 + 0.5, 0.9 * -2.0 + 0.5];
        let b3 = [0.9 * b2[0] - 1.0, 0.9 * b2[1] + 4.0];
        close(
            &p,
            &[
                1.0 - 0.1 * (b1[0] + b2[0] + b3[0]),
                1.0 - 0.1 * (b1[1] + b2[1] + b3[1]),
            ],
        );
        // Plain SGD with weight decay: p <- p - lr (g + wd p).
        let p = run("sgd:lr=0.5,wd=0.1", &[2.0, -1.0], &G[..1]);
        close(&p, &[2.0 - 0.5 * (1.0 + 0.2), -1.0 - 0.5 * (-2.0 - 0.1)]);
    }

    #[test]
    fn nesterov_matches_hand_computation() {
        // d_t = g_t + mu * buf_t.
        let p = run("sgd:lr=0.1,momentum=0.5,nesterov", &[0.0, 0.0], &G[..2]);
        let b1 = [1.0, -2.0];
        let b2 = [0.5 * 1.0 + 0.5, 0.5 * -2.0 + 0.5];
        let d1 = [1.0 + 0.5 * b1[0], -2.0 + 0.5 * b1[1]];
        let d2 = [0.5 + 0.5 * b2[0], 0.5 + 0.5 * b2[1]];
        close(&p, &[-0.1 * (d1[0] + d2[0]), -0.1 * (d1[1] + d2[1])]);
    }

    /// A momentum-corrected gradient (`corrected`): the weight decay alone keeps a momentum
    /// buffer, the gradient is added as it is (DGCSGD of the DGC reference code, written
    /// out here step by step in f64).
    #[test]
    fn corrected_sgd_gives_weight_decay_its_own_momentum() {
        for nesterov in [false, true] {
            let spec = format!(
                "sgd:lr=0.1,momentum=0.5,wd=0.2,corrected{}",
                if nesterov { ",nesterov" } else { "" }
            );
            let got = run(&spec, &[1.0, -2.0], &G);
            let (mut p, mut buf) = ([1.0f64, -2.0], [0.0f64; 2]);
            for (step, g) in G.iter().enumerate() {
                for i in 0..2 {
                    let d = 0.2 * p[i];
                    buf[i] = if step == 0 { d } else { 0.5 * buf[i] + d };
                    let d = if nesterov { d + 0.5 * buf[i] } else { buf[i] };
                    p[i] -= 0.1 * (f64::from(g[i]) + d);
                }
            }
            close(&got, &p);
        }
        // Without weight decay the gradient is applied as plain SGD.
        let got = run("sgd:lr=0.1,momentum=0.9,corrected", &[0.0, 0.0], &G);
        let sum = [1.0 + 0.5 - 1.0, -2.0 + 0.5 + 4.0];
        close(&got, &[-0.1 * sum[0], -0.1 * sum[1]]);
    }

    /// Updating by parts (in any order) equals one whole step, for every rule.
    #[test]
    fn parts_equal_the_whole_step() {
        let grads: Vec<Vec<f32>> = (0..4)
            .map(|s| {
                (0..10)
                    .map(|i| ((i * 3 + s * 7) % 11) as f32 - 5.0)
                    .collect()
            })
            .collect();
        for spec in [
            "sgd:lr=0.1,momentum=0.9,wd=0.01",
            "sgd:lr=0.1,momentum=0.9,nesterov",
            "sgd:lr=0.1,momentum=0.9,nesterov,corrected,wd=0.01",
            "adam:lr=0.01",
            "adamw:lr=0.01",
            "adagrad:lr=0.1",
        ] {
            let c: OptimizerConfig = spec.parse().unwrap();
            let (mut whole, mut parts) = (c.build(10, None).unwrap(), c.build(10, None).unwrap());
            let (mut pw, mut pp) = (vec![0.5f32; 10], vec![0.5f32; 10]);
            for g in &grads {
                whole.step(&mut pw, g).unwrap();
                for r in [6..10, 0..3, 3..6] {
                    parts
                        .step_part(&mut pp[r.clone()], &g[r.clone()], r.start)
                        .unwrap();
                }
                parts.finish_step();
            }
            assert_eq!(pw, pp, "{spec}");
        }
        let mut clipped = "sgd:lr=0.1,clip=1"
            .parse::<OptimizerConfig>()
            .unwrap()
            .build(2, None)
            .unwrap();
        assert!(clipped.step_part(&mut [0.0; 2], &[1.0; 2], 0).is_err());
    }

    #[test]
    fn adagrad_matches_hand_computation() {
        // DistBelief / PyTorch Adagrad: sum_t = init + sum g^2; p -= lr g_t / (sqrt(sum_t) + eps).
        let (lr, eps, init) = (0.1f64, 1e-10f64, 0.25f64);
        let mut p = [1.0f64, -1.0];
        let mut sum = [init; 2];
        for g in &G {
            for ((p, s), &g) in p.iter_mut().zip(&mut sum).zip(g) {
                let g = f64::from(g);
                *s += g * g;
                *p -= lr * g / (s.sqrt() + eps);
            }
        }
        close(&run("adagrad:lr=0.1,init=0.25", &[1.0, -1.0], &G), &p);
        let spec: OptimizerConfig = "adagrad:lr=0.1,init=0.25".parse().unwrap();
        assert_eq!(spec.to_string().parse::<OptimizerConfig>().unwrap(), spec);
        assert!("adagrad:eps=0".parse::<OptimizerConfig>().is_err());
        assert!("adagrad:momentum=0.9".parse::<OptimizerConfig>().is_err());
    }

    #[test]
    fn adam_matches_hand_computation() {
        let (lr, b1, b2, eps) = (0.01f64, 0.9f64, 0.999f64, 1e-8f64);
        let mut p = [0.3f64, -0.7];
        let (mut m, mut v) = ([0.0f64; 2], [0.0f64; 2]);
        for (t, g) in G.iter().enumerate() {
            let t = t as i32 + 1;
            for (((p, m), v), &g) in p.iter_mut().zip(&mut m).zip(&mut v).zip(g) {
                let g = f64::from(g);
                *m = b1 * *m + (1.0 - b1) * g;
                *v = b2 * *v + (1.0 - b2) * g * g;
                let mh = *m / (1.0 - b1.powi(t));
                let vh = *v / (1.0 - b2.powi(t));
                *p -= lr * mh / (vh.sqrt() + eps);
            }
        }
        close(&run("adam:lr=0.01", &[0.3, -0.7], &G), &p);
        // AdamW: decay first, then the Adam update (one step, m = 0.1 g, v = 0.001 g^2).
        let w = run("adamw:lr=0.01,wd=0.5", &[1.0, 1.0], &G[..1]);
        close(&w, &[(1.0 - 0.005) - 0.01, (1.0 - 0.005) + 0.01]);
    }

    #[test]
    fn clipping_warmup_and_state_round_trip() {
        // Gradient norm 5 clipped to 1: the step is lr * g / 5 (within 1e-6).
        let p = run("sgd:lr=1,clip=1", &[0.0, 0.0], &[[3.0, 4.0]]);
        close(&p, &[-0.6, -0.8]);
        let c: OptimizerConfig = "adam:lr=0.1,warmup=2".parse().unwrap();
        let mut a = c.build(2, None).unwrap();
        let mut pa = vec![1.0f32, 2.0];
        assert_eq!(a.step(&mut pa, &G[0]).unwrap(), 0.05);
        let saved = OptimizerState::from_bytes(&a.state().to_bytes()).unwrap();
        assert_eq!(&saved, a.state());
        let mut b = c.build(2, None).unwrap();
        b.set_state(saved).unwrap();
        let mut pb = pa.clone();
        for g in &G[1..] {
            a.step(&mut pa, g).unwrap();
            b.step(&mut pb, g).unwrap();
        }
        assert_eq!(pa, pb);
        assert!(OptimizerState::from_bytes(b"GWOPTST1short").is_err());
        let mut bytes = a.state().to_bytes();
        bytes.pop();
        assert!(OptimizerState::from_bytes(&bytes).is_err());
        let mut huge = a.state().to_bytes();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(OptimizerState::from_bytes(&huge).is_err());
        assert!(b
            .set_state(OptimizerState {
                step: 0,
                m: vec![0.0; 3],
                v: vec![]
            })
            .is_err());
        assert!(b.step(&mut [0.0; 3], &[0.0; 3]).is_err());
    }
}
