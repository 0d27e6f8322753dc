//! Server-side updaters, chosen by a declarative spec (never code on the wire, unlike
//! MXNet's pickled optimizer). Spec grammar as the codecs': `name[:key=value,...]`.
//!
//! | spec | state | update for gradient `g` |
//! |---|---|---|
//! | `sum` | none | `w += g` (a summation service) |
//! | `sgd:lr=L` | none | `w -= L·g` |
//! | `momentum:lr=L,mu=M` | `v` | `v = M·v + g; w -= L·v` |
//! | `adagrad:lr=L,eps=E` | `G` | `G += g²; w -= L·g / (sqrt(G) + E)` (DistBelief) |
//! | `adam:lr=L,beta1=B1,beta2=B2,eps=E` | `m, v, t` | bias-corrected Adam |
//!
//! The state lives next to the parameters on the shard and is checkpointed with them.

use std::fmt;
use std::str::FromStr;

use gradwire_codec::Params;

use crate::{Error, Result};

/// A server-side optimizer and its hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UpdaterSpec {
    /// `w += g`.
    Sum,
    /// `w = g`: the table holds the last value pushed (under `sync`, the round's mean), so
    /// one table can carry a fresh average every round.
    Assign,
    /// Plain SGD.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// Heavy-ball momentum.
    Momentum {
        /// Learning rate.
        lr: f32,
        /// Momentum coefficient.
        mu: f32,
    },
    /// Adagrad (Duchi et al.; DistBelief's per-parameter rates).
    Adagrad {
        /// Learning rate (γ, typically about 10× the best fixed SGD rate).
        lr: f32,
        /// Added to the root of the accumulator.
        eps: f32,
    },
    /// Adam (Kingma & Ba).
    Adam {
        /// Learning rate.
        lr: f32,
        /// First-moment decay.
        beta1: f32,
        /// Second-moment decay.
        beta2: f32,
        /// Added to the root of the second moment.
        eps: f32,
    },
}

impl UpdaterSpec {
    /// How many state vectors of the parameter's length the updater keeps.
    pub fn state_vectors(&self) -> usize {
        match self {
            UpdaterSpec::Sum | UpdaterSpec::Assign | UpdaterSpec::Sgd { .. } => 0,
            UpdaterSpec::Momentum { .. } | UpdaterSpec::Adagrad { .. } => 1,
            UpdaterSpec::Adam { .. } => 2,
        }
    }
}

impl FromStr for UpdaterSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: String| Error::Spec {
            what: "updater",
            spec: s.into(),
            reason,
        };
        let mut p = Params::parse(s).map_err(|e| bad(e.to_string()))?;
        let f = |p: &mut Params, k: &'static str, d: Option<f64>, lo: f64, hi: f64| {
            p.f64_in(k, d, lo, hi)
                .map(|v| v as f32)
                .map_err(|e| bad(e.to_string()))
        };
        let u = match p.codec() {
            "sum" | "none" => UpdaterSpec::Sum,
            "assign" => UpdaterSpec::Assign,
            "sgd" => UpdaterSpec::Sgd {
                lr: f(&mut p, "lr", None, 0.0, 1e6)?,
            },
            "momentum" => UpdaterSpec::Momentum {
                lr: f(&mut p, "lr", None, 0.0, 1e6)?,
                mu: f(&mut p, "mu", Some(0.9), 0.0, 1.0)?,
            },
            "adagrad" => UpdaterSpec::Adagrad {
                lr: f(&mut p, "lr", None, 0.0, 1e6)?,
                eps: f(&mut p, "eps", Some(1e-8), 0.0, 1.0)?,
            },
            "adam" => UpdaterSpec::Adam {
                lr: f(&mut p, "lr", Some(1e-3), 0.0, 1e6)?,
                beta1: f(&mut p, "beta1", Some(0.9), 0.0, 0.999_999)?,
                beta2: f(&mut p, "beta2", Some(0.999), 0.0, 0.999_999_9)?,
                eps: f(&mut p, "eps", Some(1e-8), 0.0, 1.0)?,
            },
            other => {
                return Err(bad(format!(
                    "unknown updater '{other}' (known: sum, assign, sgd, momentum, adagrad, adam)"
                )))
            }
        };
        p.finish().map_err(|e| bad(e.to_string()))?;
        Ok(u)
    }
}

impl fmt::Display for UpdaterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpdaterSpec::Sum => f.write_str("sum"),
            UpdaterSpec::Assign => f.write_str("assign"),
            UpdaterSpec::Sgd { lr } => write!(f, "sgd:lr={lr}"),
            UpdaterSpec::Momentum { lr, mu } => write!(f, "momentum:lr={lr},mu={mu}"),
            UpdaterSpec::Adagrad { lr, eps } => write!(f, "adagrad:lr={lr},eps={eps}"),
            UpdaterSpec::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => write!(f, "adam:lr={lr},beta1={beta1},beta2={beta2},eps={eps}"),
        }
    }
}

/// An updater's state for one chunk: a step count and up to two vectors.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct OptState {
    /// Updates applied (Adam's `t`).
    pub step: u64,
    /// First state vector (momentum `v`, Adagrad `G`, Adam `m`); empty until needed.
    pub a: Vec<f32>,
    /// Second state vector (Adam `v`); empty until needed.
    pub b: Vec<f32>,
}

/// Applies gradient `g` to `w` with `spec`, advancing `st`.
pub fn apply(spec: &UpdaterSpec, st: &mut OptState, w: &mut [f32], g: &[f32]) {
    debug_assert_eq!(w.len(), g.len());
    let n = w.len();
    if st.a.len() != n && spec.state_vectors() >= 1 {
        st.a = vec![0.0; n];
    }
    if st.b.len() != n && spec.state_vectors() >= 2 {
        st.b = vec![0.0; n];
    }
    st.step += 1;
    match *spec {
        UpdaterSpec::Sum => {
            for (w, g) in w.iter_mut().zip(g) {
                *w += g;
            }
        }
        UpdaterSpec::Assign => w.copy_from_slice(g),
        UpdaterSpec::Sgd { lr } => {
            for (w, g) in w.iter_mut().zip(g) {
                *w -= lr * g;
            }
        }
        UpdaterSpec::Momentum { lr, mu } => {
            for ((w, g), v) in w.iter_mut().zip(g).zip(st.a.iter_mut()) {
                *v = mu * *v + g;
                *w -= lr * *v;
            }
        }
        UpdaterSpec::Adagrad { lr, eps } => {
            for ((w, g), acc) in w.iter_mut().zip(g).zip(st.a.iter_mut()) {
                *acc += g * g;
                *w -= lr * g / (acc.sqrt() + eps);
            }
        }
        UpdaterSpec::Adam {
            lr,
            beta1,
            beta2,
            eps,
        } => {
            let t = st.step as i32;
            let c1 = 1.0 - beta1.powi(t);
            let c2 = 1.0 - beta2.powi(t);
            for (((w, g), m), v) in w
                .iter_mut()
                .zip(g)
                .zip(st.a.iter_mut())
                .zip(st.b.iter_mut())
            {
                *m = beta1 * *m + (1.0 - beta1) * g;
                *v = beta2 * *v + (1.0 - beta2) * g * g;
                let mh = *m / c1;
                let vh = *v / c2;
                *w -= lr * mh / (vh.sqrt() + eps);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_and_refuse_unknown() {
        for s in [
            "sum",
            "assign",
            "sgd:lr=0.1",
            "momentum:lr=0.1,mu=0.5",
            "adagrad:lr=0.5,eps=0.001",
            "adam:lr=0.001,beta1=0.9,beta2=0.999,eps=0.00000001",
        ] {
            let u: UpdaterSpec = s.parse().unwrap();
            assert_eq!(u.to_string().parse::<UpdaterSpec>().unwrap(), u, "{s}");
        }
        assert!("pickle:cls=Evil".parse::<UpdaterSpec>().is_err());
        assert!("sgd".parse::<UpdaterSpec>().is_err(), "lr is required");
        assert!("sgd:lr=0.1,foo=1".parse::<UpdaterSpec>().is_err());
        assert!("sgd:lr=nan".parse::<UpdaterSpec>().is_err());
    }

    #[test]
    fn updaters_match_hand_computed_steps() {
        let g = [1.0f32, -2.0];
        // momentum: two steps, v1 = g, v2 = 0.5 g + g.
        let spec: UpdaterSpec = "momentum:lr=0.1,mu=0.5".parse().unwrap();
        let mut st = OptState::default();
        let mut w = [0.0f32; 2];
        apply(&spec, &mut st, &mut w, &g);
        apply(&spec, &mut st, &mut w, &g);
        assert!((w[0] - (-0.1 - 0.15)).abs() < 1e-6);
        // adagrad: G = 1, 2 -> w = -(1/1 + 1/sqrt 2) * lr
        let spec: UpdaterSpec = "adagrad:lr=1,eps=0".parse().unwrap();
        let mut st = OptState::default();
        let mut w = [0.0f32; 2];
        apply(&spec, &mut st, &mut w, &g);
        apply(&spec, &mut st, &mut w, &g);
        assert!((w[0] + 1.0 + 1.0 / 2f32.sqrt()).abs() < 1e-6);
        // adam's first step moves every coordinate by lr·sign(g) (up to eps).
        let spec: UpdaterSpec = "adam:lr=0.01,eps=0".parse().unwrap();
        let mut st = OptState::default();
        let mut w = [0.0f32; 2];
        apply(&spec, &mut st, &mut w, &g);
        assert!((w[0] + 0.01).abs() < 1e-6 && (w[1] - 0.01).abs() < 1e-6);
        assert_eq!(st.step, 1);
        // assign: the value pushed replaces the old one, twice.
        let spec: UpdaterSpec = "assign".parse().unwrap();
        let mut st = OptState::default();
        let mut w = [5.0f32, 6.0];
        apply(&spec, &mut st, &mut w, &g);
        apply(&spec, &mut st, &mut w, &[3.0, 4.0]);
        assert_eq!(w, [3.0, 4.0]);
    }
}
