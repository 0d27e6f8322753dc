//! [`OptimizerConfig`]: plain, serializable settings, parsed from a spec string such as
//! `sgd:lr=0.05,momentum=0.9,nesterov,wd=5e-4,warmup=200,decay=cosine` or
//! `adam:lr=1e-3,clip=5`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, OptimizerError, Result};

/// The update rule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum OptimizerKind {
    /// SGD with optional momentum (`buf = momentum * buf + (1 - dampening) * g`, the first
    /// step taking `buf = g`) and optional Nesterov look-ahead; PyTorch's semantics.
    Sgd {
        /// Momentum factor; 0 gives plain SGD (what DGC, which owns momentum, needs).
        momentum: f64,
        /// Dampening of the momentum update (PyTorch's default 0).
        dampening: f64,
        /// Nesterov momentum (needs momentum > 0 and dampening 0).
        nesterov: bool,
        /// The gradient arrives momentum-corrected (DGC's momentum correction, in the codec
        /// or the engine): `momentum`, `nesterov` and `dampening` then apply to the weight
        /// decay term alone, with its own buffer, and the gradient is added as it is — the
        /// DGC reference optimizer (`DGCSGD` in synxlin/deep-gradient-compression):
        /// `b = m b + (1 - dampening) wd p` (first step `b = wd p`), `d = g + b` (Nesterov:
        /// `g + wd p + m b`), `p -= lr d`. Spec key `corrected`.
        #[serde(default)]
        corrected: bool,
    },
    /// Adam (Kingma and Ba) with PyTorch's bias correction; `decoupled` gives AdamW.
    Adam {
        /// First-moment decay.
        beta1: f64,
        /// Second-moment decay.
        beta2: f64,
        /// Denominator epsilon.
        eps: f64,
        /// Decoupled weight decay (AdamW) instead of L2 added to the gradient.
        decoupled: bool,
    },
    /// Adagrad (Duchi et al. 2011), as DistBelief's Downpour uses it and as PyTorch computes
    /// it: `sum += g^2; p -= lr * g / (sqrt(sum) + eps)`, per coordinate.
    Adagrad {
        /// Denominator epsilon (PyTorch's default 1e-10).
        eps: f64,
        /// Starting value of every accumulator (PyTorch's `initial_accumulator_value`, 0).
        initial_accumulator: f64,
    },
}

/// How the learning rate decays after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum LrDecay {
    /// Constant after warm-up.
    Constant,
    /// Multiplied by `gamma` every `every` steps after warm-up.
    Step {
        /// Steps between decays.
        every: u64,
        /// Factor per decay.
        gamma: f64,
    },
    /// Cosine from the base rate down to `min_lr` at the end of the run.
    Cosine {
        /// Run length in steps; `None` takes the trainer's run length.
        total_steps: Option<u64>,
        /// Final learning rate.
        min_lr: f64,
    },
}

/// Optimizer settings; [`OptimizerConfig::build`] makes the runtime [`super::Optimizer`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// The update rule.
    pub kind: OptimizerKind,
    /// Base learning rate.
    pub lr: f64,
    /// Weight decay (L2 for SGD and Adam, decoupled for AdamW).
    pub weight_decay: f64,
    /// Steps of linear warm-up from `lr / warmup_steps` to `lr`.
    pub warmup_steps: u64,
    /// Decay after warm-up.
    pub decay: LrDecay,
    /// Scale the gradient down to this global L2 norm when it is larger.
    pub clip_norm: Option<f64>,
}

impl OptimizerConfig {
    /// SGD with `momentum` (0 for plain SGD), no weight decay, constant rate.
    pub fn sgd(lr: f64, momentum: f64) -> Self {
        OptimizerConfig {
            kind: OptimizerKind::Sgd {
                momentum,
                dampening: 0.0,
                nesterov: false,
                corrected: false,
            },
            lr,
            weight_decay: 0.0,
            warmup_steps: 0,
            decay: LrDecay::Constant,
            clip_norm: None,
        }
    }

    /// Adam with betas (0.9, 0.999), eps 1e-8, constant rate.
    pub fn adam(lr: f64) -> Self {
        OptimizerConfig {
            kind: OptimizerKind::Adam {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                decoupled: false,
            },
            ..Self::sgd(lr, 0.0)
        }
    }

    /// Adagrad with eps 1e-10 and zero initial accumulators (PyTorch's defaults).
    pub fn adagrad(lr: f64) -> Self {
        OptimizerConfig {
            kind: OptimizerKind::Adagrad {
                eps: 1e-10,
                initial_accumulator: 0.0,
            },
            ..Self::sgd(lr, 0.0)
        }
    }

    /// SGD's momentum factor and Nesterov flag, when this is SGD applying momentum to the
    /// gradient (not [`OptimizerKind::Sgd::corrected`]).
    pub fn sgd_momentum(&self) -> Option<(f64, bool)> {
        match self.kind {
            OptimizerKind::Sgd {
                momentum,
                nesterov,
                corrected: false,
                ..
            } if momentum > 0.0 => Some((momentum, nesterov)),
            _ => None,
        }
    }

    /// The same settings for a gradient that arrives momentum-corrected (DGC, or
    /// `--momentum-correction on`): SGD keeps `momentum` (and Nesterov) for the weight decay
    /// term alone, with its own buffer, as the DGC reference optimizer does; `momentum`
    /// replaces the optimizer's factor when given (DGC's codec momentum). Other optimizers
    /// are returned unchanged.
    pub fn momentum_corrected(mut self, momentum: Option<(f64, bool)>) -> Self {
        if let OptimizerKind::Sgd {
            momentum: m,
            nesterov,
            corrected,
            ..
        } = &mut self.kind
        {
            if let Some((f, n)) = momentum {
                *m = f;
                *nesterov = n && f > 0.0;
            }
            *corrected = true;
        }
        self
    }

    /// Checks ranges and combinations (called by `FromStr` and `build`).
    pub fn validate(&self) -> Result<()> {
        let bad = |e: OptimizerError| Err(Error::from(e));
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad(OptimizerError::LearningRate { lr: self.lr });
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(OptimizerError::WeightDecay {
                value: self.weight_decay,
            });
        }
        if let Some(c) = self.clip_norm {
            if !(c.is_finite() && c > 0.0) {
                return bad(OptimizerError::ClipNorm { value: c });
            }
        }
        match self.kind {
            OptimizerKind::Sgd {
                momentum,
                dampening,
                nesterov,
                ..
            } => {
                if !(0.0..1.0).contains(&momentum) {
                    return bad(OptimizerError::Momentum { value: momentum });
                }
                if !(0.0..=1.0).contains(&dampening) {
                    return bad(OptimizerError::Dampening { value: dampening });
                }
                if nesterov && (momentum == 0.0 || dampening != 0.0) {
                    return bad(OptimizerError::Nesterov);
                }
            }
            OptimizerKind::Adam {
                beta1, beta2, eps, ..
            } => {
                if !(0.0..1.0).contains(&beta1) || !(0.0..1.0).contains(&beta2) {
                    return bad(OptimizerError::Betas { beta1, beta2 });
                }
                if !(eps.is_finite() && eps > 0.0) {
                    return bad(OptimizerError::Eps { value: eps });
                }
            }
            OptimizerKind::Adagrad {
                eps,
                initial_accumulator,
            } => {
                if !(eps.is_finite() && eps > 0.0) {
                    return bad(OptimizerError::Eps { value: eps });
                }
                if !(initial_accumulator.is_finite() && initial_accumulator >= 0.0) {
                    return bad(OptimizerError::InitialAccumulator {
                        value: initial_accumulator,
                    });
                }
            }
        }
        match self.decay {
            LrDecay::Step { every, gamma }
                if every == 0 || gamma.is_nan() || gamma <= 0.0 || gamma > 1.0 =>
            {
                bad(OptimizerError::StepDecay { every, gamma })
            }
            LrDecay::Cosine { min_lr, .. } if !(0.0..=self.lr).contains(&min_lr) => {
                bad(OptimizerError::CosineMinLr { min_lr })
            }
            _ => Ok(()),
        }
    }
}

impl FromStr for OptimizerConfig {
    type Err = Error;

    /// `NAME[:key=value,...]` with NAME `sgd`, `nesterov`, `adam`, `adamw` or `adagrad`;
    /// keys `lr`, `momentum`, `dampening`, `nesterov[=bool]`, `corrected[=bool]`, `wd`/`weight_decay`, `beta1`,
    /// `beta2`, `eps`, `init` (Adagrad's initial accumulator), `warmup`, `decay=constant|step|cosine`, `every`, `gamma`, `total`,
    /// `min_lr`, `clip`.
    fn from_str(s: &str) -> Result<Self> {
        let (name, rest) = s.split_once(':').unwrap_or((s, ""));
        let mut c = match name.trim().to_ascii_lowercase().as_str() {
            "sgd" => Self::sgd(0.01, 0.0),
            "nesterov" => {
                let mut c = Self::sgd(0.01, 0.9);
                c.kind = OptimizerKind::Sgd {
                    momentum: 0.9,
                    dampening: 0.0,
                    nesterov: true,
                    corrected: false,
                };
                c
            }
            "adam" => Self::adam(1e-3),
            "adamw" => {
                let mut c = Self::adam(1e-3);
                c.weight_decay = 0.01;
                if let OptimizerKind::Adam { decoupled, .. } = &mut c.kind {
                    *decoupled = true;
                }
                c
            }
            "adagrad" => Self::adagrad(0.01),
            other => {
                return Err(OptimizerError::Unknown {
                    name: other.to_string(),
                }
                .into())
            }
        };
        let (mut every, mut gamma, mut total, mut min_lr) = (None, None, None, None);
        let mut decay = None;
        for kv in rest.split(',').map(str::trim).filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, "true"));
            let f = || -> Result<f64> {
                v.parse::<f64>().map_err(|_| {
                    Error::from(OptimizerError::NotANumber {
                        key: k.to_string(),
                        value: v.to_string(),
                    })
                })
            };
            let u = || -> Result<u64> {
                v.parse::<u64>().map_err(|_| {
                    Error::from(OptimizerError::NotAWholeNumber {
                        key: k.to_string(),
                        value: v.to_string(),
                    })
                })
            };
            let b = || -> Result<bool> {
                match v {
                    "true" | "1" | "yes" => Ok(true),
                    "false" | "0" | "no" => Ok(false),
                    _ => Err(Error::from(OptimizerError::NotABoolean {
                        key: k.to_string(),
                        value: v.to_string(),
                    })),
                }
            };
            match (k, &mut c.kind) {
                ("lr", _) => c.lr = f()?,
                ("wd" | "weight_decay", _) => c.weight_decay = f()?,
                ("warmup", _) => c.warmup_steps = u()?,
                ("clip", _) => c.clip_norm = Some(f()?),
                ("decay", _) => decay = Some(v.to_ascii_lowercase()),
                ("every", _) => every = Some(u()?),
                ("gamma", _) => gamma = Some(f()?),
                ("total", _) => total = Some(u()?),
                ("min_lr", _) => min_lr = Some(f()?),
                ("momentum", OptimizerKind::Sgd { momentum, .. }) => *momentum = f()?,
                ("dampening", OptimizerKind::Sgd { dampening, .. }) => *dampening = f()?,
                ("nesterov", OptimizerKind::Sgd { nesterov, .. }) => *nesterov = b()?,
                ("corrected", OptimizerKind::Sgd { corrected, .. }) => *corrected = b()?,
                ("beta1", OptimizerKind::Adam { beta1, .. }) => *beta1 = f()?,
                ("beta2", OptimizerKind::Adam { beta2, .. }) => *beta2 = f()?,
                ("eps", OptimizerKind::Adam { eps, .. }) => *eps = f()?,
                ("eps", OptimizerKind::Adagrad { eps, .. }) => *eps = f()?,
                (
                    "init",
                    OptimizerKind::Adagrad {
                        initial_accumulator,
                        ..
                    },
                ) => *initial_accumulator = f()?,
                _ => {
                    return Err(OptimizerError::UnknownKey {
                        optimizer: name.to_string(),
                        key: k.to_string(),
                    }
                    .into())
                }
            }
        }
        c.decay = match decay.as_deref() {
            None if every.is_some() => LrDecay::Step {
                every: every.unwrap_or(1),
                gamma: gamma.unwrap_or(0.1),
            },
            None | Some("constant" | "none") => LrDecay::Constant,
            Some("step") => LrDecay::Step {
                every: every.ok_or(OptimizerError::StepDecayNeedsEvery)?,
                gamma: gamma.unwrap_or(0.1),
            },
            Some("cosine" | "cos") => LrDecay::Cosine {
                total_steps: total,
                min_lr: min_lr.unwrap_or(0.0),
            },
            Some(d) => {
                return Err(OptimizerError::UnknownDecay {
                    name: d.to_string(),
                }
                .into())
            }
        };
        c.validate()?;
        Ok(c)
    }
}

impl fmt::Display for OptimizerConfig {
    /// The spec string `FromStr` parses back to the same config.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            OptimizerKind::Sgd {
                momentum,
                dampening,
                nesterov,
                corrected,
            } => {
                write!(f, "sgd:lr={},momentum={momentum}", self.lr)?;
                if dampening != 0.0 {
                    write!(f, ",dampening={dampening}")?;
                }
                if nesterov {
                    write!(f, ",nesterov")?;
                }
                if corrected {
                    write!(f, ",corrected")?;
                }
            }
            OptimizerKind::Adam {
                beta1,
                beta2,
                eps,
                decoupled,
            } => write!(
                f,
                "{}:lr={},beta1={beta1},beta2={beta2},eps={eps}",
                if decoupled { "adamw" } else { "adam" },
                self.lr
            )?,
            OptimizerKind::Adagrad {
                eps,
                initial_accumulator,
            } => {
                write!(f, "adagrad:lr={},eps={eps}", self.lr)?;
                if initial_accumulator != 0.0 {
                    write!(f, ",init={initial_accumulator}")?;
                }
            }
        }
        write!(f, ",wd={}", self.weight_decay)?;
        if self.warmup_steps > 0 {
            write!(f, ",warmup={}", self.warmup_steps)?;
        }
        match self.decay {
            LrDecay::Constant => {}
            LrDecay::Step { every, gamma } => write!(f, ",decay=step,every={every},gamma={gamma}")?,
            LrDecay::Cosine {
                total_steps,
                min_lr,
            } => {
                write!(f, ",decay=cosine,min_lr={min_lr}")?;
                if let Some(t) = total_steps {
                    write!(f, ",total={t}")?;
                }
            }
        }
        if let Some(c) = self.clip_norm {
            write!(f, ",clip={c}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs_and_round_trips() {
        let specs = [
            "sgd",
            "sgd:lr=0.1,momentum=0.9",
            "nesterov:lr=0.05,wd=5e-4,warmup=100,decay=cosine",
            "sgd:lr=0.1,momentum=0.9,nesterov,decay=step,every=1000,gamma=0.5,clip=5",
            "adam:lr=3e-4,beta2=0.98,decay=cosine,total=5000,min_lr=1e-5",
            "adamw:lr=1e-3,wd=0.1",
            "sgd:lr=0.1,momentum=0.9,nesterov,corrected,wd=1e-4",
        ];
        for s in specs {
            let c: OptimizerConfig = s.parse().unwrap();
            let back: OptimizerConfig = c.to_string().parse().unwrap();
            assert_eq!(c, back, "{s} -> {c}");
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(c, serde_json::from_str::<OptimizerConfig>(&json).unwrap());
        }
        let c: OptimizerConfig = "nesterov:lr=0.05".parse().unwrap();
        assert!(
            matches!(c.kind, OptimizerKind::Sgd { nesterov: true, momentum, .. } if momentum == 0.9)
        );
        let corrected = c.clone().momentum_corrected(None);
        assert!(matches!(
            corrected.kind,
            OptimizerKind::Sgd { nesterov: true, corrected: true, momentum, .. } if momentum == 0.9
        ));
        assert_eq!(corrected.sgd_momentum(), None);
        let dgc = c.momentum_corrected(Some((0.5, false)));
        assert!(matches!(
            dgc.kind,
            OptimizerKind::Sgd { nesterov: false, corrected: true, momentum, .. } if momentum == 0.5
        ));
    }

    #[test]
    fn rejects_bad_specs() {
        for s in [
            "rmsprop",
            "sgd:lr=-1",
            "sgd:lr=abc",
            "sgd:momentum=1.5",
            "sgd:nesterov",
            "adam:momentum=0.9",
            "sgd:decay=step",
            "sgd:decay=linear",
            "sgd:bogus=1",
            "adam:beta1=1",
            "sgd:clip=0",
        ] {
            assert!(
                s.parse::<OptimizerConfig>().is_err(),
                "{s} should be rejected"
            );
        }
    }
}
