//! The training rules between a codec and the optimizer, the same for every front end:
//!
//! - **DGC owns the momentum** (its momentum correction): the codec accumulates the velocity
//!   `u = m u + g` before selection, so the optimizer adds the aggregated update as it is and
//!   keeps DGC's momentum for the weight-decay term alone ([`OptimizerMomentum::Corrected`]
//!   with DGC's factor). DGC also clips locally (section 3.3): an optimizer's clip at `C`
//!   becomes the codec's `clip=C` (each worker clips at `C / sqrt(N)`).
//! - **`MomentumMode::On`** gives every other compressing codec DGC's momentum correction in
//!   the sync: the optimizer's SGD momentum moves into the sync (`momentum_correction`), the
//!   optimizer keeps it for weight decay alone.
//! - **`ClipScope::Local`** moves the optimizer's clip to each worker (`C / sqrt(N)` before
//!   the sync and its error feedback), as DGC does.
//!
//! Every refusal is a [`RulesError`] that says what to change.

use gradwire_codec::{CodecConfig, CodecId};
use serde::{Deserialize, Serialize};

/// Momentum correction mode (`--momentum-correction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum MomentumMode {
    /// The papers' choice: the optimizer applies momentum after aggregation for every codec
    /// (1-bit, Strom, Dryden, Aji, QSGD, TernGrad), except DGC, whose momentum correction is
    /// part of the method (the codec owns its momentum).
    #[default]
    Auto,
    /// DGC's momentum correction for every codec (needs SGD with momentum): each worker
    /// folds momentum into its gradient before the codec, with momentum factor masking for
    /// the sparsifying codecs, and the optimizer keeps momentum for weight decay only.
    On,
    /// Momentum applied by the optimizer after aggregation (same as auto except for DGC,
    /// which always owns its momentum).
    Off,
}

/// Where gradient-norm clipping happens (`--clip-scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ClipScope {
    /// The optimizer clips the aggregated gradient at `C` (a single machine's clip), except
    /// for DGC, which clips each worker's gradient as its paper does.
    #[default]
    Global,
    /// Every codec clips as DGC does (section 3.3): each worker clips its own gradient at
    /// `C / sqrt(N)` before the sync and its error feedback, and the optimizer does not clip.
    Local,
}

/// What the rules need to know of the optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerView {
    /// Its spec as the user wrote it (for messages).
    pub name: String,
    /// Whether it is SGD (DGC needs SGD: adaptive optimizers normalise its accumulated
    /// sparse update into one ordinary step).
    pub is_sgd: bool,
    /// SGD's momentum factor and Nesterov flag, when SGD has momentum > 0.
    pub sgd_momentum: Option<(f64, bool)>,
    /// Its global-norm clip, if any.
    pub clip_norm: Option<f64>,
}

/// How the optimizer must treat momentum after the rules.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerMomentum {
    /// As configured: momentum after aggregation.
    Keep,
    /// The gradient arrives momentum-corrected: SGD keeps momentum for the weight-decay term
    /// alone; `Some((factor, nesterov))` replaces its factor (DGC's own momentum).
    Corrected(Option<(f64, bool)>),
}

/// The rules' outcome for one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The codec, with DGC's clip taken from the optimizer where the rules say so.
    pub codec: CodecConfig,
    /// What the optimizer does with its momentum.
    pub optimizer_momentum: OptimizerMomentum,
    /// The optimizer's clip after the rules (taken by DGC or moved to the workers: `None`).
    pub optimizer_clip: Option<f64>,
    /// Momentum correction in the sync: `(beta, nesterov)` taken from the optimizer.
    pub momentum_correction: Option<(f64, bool)>,
    /// Each worker clips its own gradient at `C / sqrt(N)` before the sync.
    pub local_clip: Option<f64>,
}

/// A combination the rules refuse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RulesError {
    /// DGC under an adaptive optimizer.
    #[error(
        "DGC needs SGD: under {optimizer} the per-coordinate normalisation turns DGC's \
         accumulated sparse update into one ordinary step and the accumulation is lost (the \
         char-LSTM report measured +71% perplexity); use --optimizer sgd:... or pass \
         --allow-dgc-adaptive to run it anyway"
    )]
    DgcNeedsSgd {
        /// The optimizer's spec.
        optimizer: String,
    },
    /// Momentum correction with an optimizer that has no momentum to take.
    #[error(
        "--momentum-correction on needs SGD with momentum > 0 to take the momentum from, and \
         the optimizer is {optimizer}"
    )]
    CorrectionNeedsMomentum {
        /// The optimizer's spec.
        optimizer: String,
    },
    /// Momentum correction with a codec that sends every entry.
    #[error(
        "--momentum-correction on masks the momentum where the codec sent, and adaptive with \
         ternary=true sends every entry (its mask would erase the momentum): use \
         ternary=false or --momentum-correction auto"
    )]
    CorrectionWithTernary,
    /// Local clipping without a clip to move.
    #[error(
        "--clip-scope local moves the optimizer's clip=C to each worker, and {optimizer} has \
         no clip: add clip=C to --optimizer"
    )]
    LocalClipWithoutClip {
        /// The optimizer's spec.
        optimizer: String,
    },
}

/// The rules' choices for one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuleChoices {
    /// `--momentum-correction`.
    pub momentum: MomentumMode,
    /// `--clip-scope`.
    pub clip_scope: ClipScope,
    /// `--allow-dgc-adaptive`: run DGC under an adaptive optimizer anyway.
    pub allow_dgc_adaptive: bool,
}

/// Applies the rules to `codec` and `optimizer`.
pub fn resolve(
    codec: &CodecConfig,
    optimizer: &OptimizerView,
    choices: RuleChoices,
) -> Result<Resolved, RulesError> {
    let mode = choices.momentum;
    let mut codec = codec.clone();
    if codec.id() == CodecId::Dgc && !optimizer.is_sgd && !choices.allow_dgc_adaptive {
        return Err(RulesError::DgcNeedsSgd {
            optimizer: optimizer.name.clone(),
        });
    }
    if mode == MomentumMode::On && codec.id() != CodecId::Dgc && optimizer.sgd_momentum.is_none() {
        return Err(RulesError::CorrectionNeedsMomentum {
            optimizer: optimizer.name.clone(),
        });
    }
    if mode == MomentumMode::On && matches!(&codec, CodecConfig::Adaptive(a) if a.ternary) {
        return Err(RulesError::CorrectionWithTernary);
    }
    let mut clip = optimizer.clip_norm;
    let mut momentum_correction = None;
    let optimizer_momentum = if let CodecConfig::Dgc(d) = &mut codec {
        // Local gradient clipping (DGC section 3.3): a training that clips at C clips each
        // worker's gradient at C / sqrt(N) before accumulation instead of the sum.
        if d.clip == 0.0 {
            if let Some(c) = clip.take() {
                d.clip = c;
            }
        }
        OptimizerMomentum::Corrected(Some((d.momentum, d.nesterov)))
    } else if mode == MomentumMode::On && codec.id() != CodecId::None {
        momentum_correction = optimizer.sgd_momentum;
        OptimizerMomentum::Corrected(None)
    } else {
        OptimizerMomentum::Keep
    };
    let local_clip = match choices.clip_scope {
        ClipScope::Global => None,
        // DGC's codec took the clip above (its own local clipping).
        ClipScope::Local if codec.id() == CodecId::Dgc => None,
        ClipScope::Local => match clip.take() {
            Some(c) => Some(c),
            None => {
                return Err(RulesError::LocalClipWithoutClip {
                    optimizer: optimizer.name.clone(),
                })
            }
        },
    };
    Ok(Resolved {
        codec,
        optimizer_momentum,
        optimizer_clip: clip,
        momentum_correction,
        local_clip,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sgd(momentum: f64, clip: Option<f64>) -> OptimizerView {
        OptimizerView {
            name: format!("sgd:momentum={momentum}"),
            is_sgd: true,
            sgd_momentum: (momentum > 0.0).then_some((momentum, false)),
            clip_norm: clip,
        }
    }

    fn adam() -> OptimizerView {
        OptimizerView {
            name: "adam".into(),
            is_sgd: false,
            sgd_momentum: None,
            clip_norm: None,
        }
    }

    fn codec(spec: &str) -> CodecConfig {
        spec.parse().unwrap()
    }

    fn on() -> RuleChoices {
        RuleChoices {
            momentum: MomentumMode::On,
            ..RuleChoices::default()
        }
    }

    #[test]
    fn dgc_owns_momentum_and_takes_the_clip() {
        let r = resolve(
            &codec("dgc:ratio=0.01"),
            &sgd(0.5, Some(2.0)),
            RuleChoices::default(),
        )
        .unwrap();
        let CodecConfig::Dgc(d) = &r.codec else {
            panic!("{:?}", r.codec)
        };
        assert_eq!(d.clip, 2.0);
        // DGC's own momentum (its spec's, 0.9 by default) replaces the optimizer's 0.5.
        assert_eq!(
            r.optimizer_momentum,
            OptimizerMomentum::Corrected(Some((d.momentum, d.nesterov)))
        );
        assert_eq!(
            (r.optimizer_clip, r.momentum_correction, r.local_clip),
            (None, None, None)
        );
    }

    #[test]
    fn dgc_keeps_its_own_clip() {
        let r = resolve(
            &codec("dgc:ratio=0.01,clip=5"),
            &sgd(0.9, Some(2.0)),
            RuleChoices::default(),
        )
        .unwrap();
        let CodecConfig::Dgc(d) = &r.codec else {
            panic!()
        };
        assert_eq!((d.clip, r.optimizer_clip), (5.0, Some(2.0)));
    }

    #[test]
    fn dgc_refuses_adaptive_optimizers_unless_allowed() {
        let e = resolve(&codec("dgc"), &adam(), RuleChoices::default()).unwrap_err();
        assert_eq!(
            e,
            RulesError::DgcNeedsSgd {
                optimizer: "adam".into()
            }
        );
        assert!(e.to_string().contains("--allow-dgc-adaptive"));
        let allowed = RuleChoices {
            allow_dgc_adaptive: true,
            ..RuleChoices::default()
        };
        assert!(resolve(&codec("dgc"), &adam(), allowed).is_ok());
    }

    #[test]
    fn correction_on_moves_sgd_momentum_into_the_sync() {
        let r = resolve(&codec("qsgd"), &sgd(0.9, None), on()).unwrap();
        assert_eq!(r.momentum_correction, Some((0.9, false)));
        assert_eq!(r.optimizer_momentum, OptimizerMomentum::Corrected(None));
        // Dense has nothing to correct: momentum stays with the optimizer.
        let r = resolve(&codec("none"), &sgd(0.9, None), on()).unwrap();
        assert_eq!(
            (r.momentum_correction, r.optimizer_momentum),
            (None, OptimizerMomentum::Keep)
        );
    }

    #[test]
    fn correction_on_needs_momentum_and_refuses_ternary() {
        assert!(matches!(
            resolve(&codec("qsgd"), &sgd(0.0, None), on()),
            Err(RulesError::CorrectionNeedsMomentum { .. })
        ));
        assert_eq!(
            resolve(&codec("adaptive:ternary=true"), &sgd(0.9, None), on()),
            Err(RulesError::CorrectionWithTernary)
        );
    }

    #[test]
    fn auto_and_off_keep_momentum_after_aggregation() {
        for momentum in [MomentumMode::Auto, MomentumMode::Off] {
            let choices = RuleChoices {
                momentum,
                ..RuleChoices::default()
            };
            let r = resolve(&codec("onebit"), &sgd(0.9, Some(1.0)), choices).unwrap();
            assert_eq!(r.optimizer_momentum, OptimizerMomentum::Keep);
            assert_eq!((r.optimizer_clip, r.local_clip), (Some(1.0), None));
        }
    }

    #[test]
    fn local_clip_moves_the_optimizers_clip_to_the_workers() {
        let local = RuleChoices {
            clip_scope: ClipScope::Local,
            ..RuleChoices::default()
        };
        let r = resolve(&codec("topk:ratio=0.01"), &sgd(0.9, Some(3.0)), local).unwrap();
        assert_eq!((r.optimizer_clip, r.local_clip), (None, Some(3.0)));
        assert!(matches!(
            resolve(&codec("topk:ratio=0.01"), &sgd(0.9, None), local),
            Err(RulesError::LocalClipWithoutClip { .. })
        ));
        // DGC clips in its codec: no second local clip.
        let r = resolve(&codec("dgc"), &sgd(0.9, Some(3.0)), local).unwrap();
        assert_eq!(r.local_clip, None);
    }
}
