//! [`CodecConfig`]: a codec chosen and parameterized by a spec string, parsed once.
//!
//! Spec grammar: `name` or `name:key=value,key=value` (see [`Params`]). Every codec takes
//! `ef=true|false` (error feedback); the default is on for the biased quantizers (`onebit`,
//! `signsgd`, `powersgd`) and off for the rest. `Display` writes the canonical spec, which
//! parses back to the same config.
//!
//! Adding a codec: one variant, one arm in each `match` below, one entry in [`KNOWN`] and
//! at least one in [`CodecConfig::examples`] (the shared property tests, the benches and the
//! fuzz target then pick it up).

use std::fmt;
use std::str::FromStr;

use crate::{
    Bf16, BuildContext, Caps, Codec, CodecId, ConfigError, Fp16, Fp32, OneBitConfig, Params,
    PowerSgdConfig, QsgdConfig, SignSgdConfig, TernGradConfig,
};
// Sparse codecs: `use crate::{ThresholdConfig, ...};` go here.
use crate::{AdaptiveConfig, DgcConfig, RandomKConfig, ThresholdConfig, TopKConfig};

/// Parameters of the plain casts (`none`, `fp16`, `bf16`): only `ef=` (default off).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CastConfig {
    /// Error feedback (default off).
    pub ef: bool,
}

impl CastConfig {
    /// Reads `ef=`.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        Ok(CastConfig {
            ef: p.bool("ef", false)?,
        })
    }
}

impl fmt::Display for CastConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ef {
            f.write_str("ef=true")
        } else {
            Ok(())
        }
    }
}

/// A codec and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum CodecConfig {
    /// `none` (alias `fp32`): uncompressed.
    None(CastConfig),
    /// `fp16`: IEEE half precision.
    Fp16(CastConfig),
    /// `bf16`: bfloat16.
    Bf16(CastConfig),
    /// `onebit`: 1-bit SGD (Seide 2014).
    OneBit(OneBitConfig),
    /// `qsgd`: QSGD (Alistarh 2017).
    Qsgd(QsgdConfig),
    /// `terngrad`: TernGrad (Wen 2017).
    TernGrad(TernGradConfig),
    /// `signsgd`: EF-signSGD (Karimireddy 2019).
    SignSgd(SignSgdConfig),
    /// `powersgd`: PowerSGD (Vogels 2019).
    PowerSgd(PowerSgdConfig),
    // ---- sparse codecs (threshold.rs, adaptive.rs, topk.rs, randomk.rs, dgc.rs) ----
    /// `topk`: top-k gradient dropping (Aji & Heafield 2017).
    TopK(TopKConfig),
    /// `threshold`: threshold quantization (Strom 2015).
    Threshold(ThresholdConfig),
    /// `randomk`: random-k sparsification (shared-seed indices).
    RandomK(RandomKConfig),
    /// `dgc`: Deep Gradient Compression (Lin 2018); the optimizer step must be plain SGD.
    Dgc(DgcConfig),
    /// `adaptive`: adaptive quantization (Dryden 2016).
    Adaptive(AdaptiveConfig),
}

/// The codec names this build knows (for error messages).
pub const KNOWN: &[&str] = &[
    "none",
    "fp16",
    "bf16",
    "onebit",
    "qsgd",
    "terngrad",
    "signsgd",
    "powersgd",
    // ---- sparse codecs ----
    "topk",
    "threshold",
    "randomk",
    "dgc",
    "adaptive",
];

impl FromStr for CodecConfig {
    type Err = ConfigError;

    fn from_str(spec: &str) -> Result<Self, ConfigError> {
        let mut p = Params::parse(spec)?;
        let cfg = match p.codec() {
            "none" | "fp32" => CodecConfig::None(CastConfig::parse(&mut p)?),
            "fp16" => CodecConfig::Fp16(CastConfig::parse(&mut p)?),
            "bf16" => CodecConfig::Bf16(CastConfig::parse(&mut p)?),
            "onebit" => CodecConfig::OneBit(OneBitConfig::parse(&mut p)?),
            "qsgd" => CodecConfig::Qsgd(QsgdConfig::parse(&mut p)?),
            "terngrad" => CodecConfig::TernGrad(TernGradConfig::parse(&mut p)?),
            "signsgd" => CodecConfig::SignSgd(SignSgdConfig::parse(&mut p)?),
            "powersgd" => CodecConfig::PowerSgd(PowerSgdConfig::parse(&mut p)?),
            // ---- sparse codecs ----
            "topk" => CodecConfig::TopK(TopKConfig::parse(&mut p)?),
            "threshold" => CodecConfig::Threshold(ThresholdConfig::parse(&mut p)?),
            "randomk" => CodecConfig::RandomK(RandomKConfig::parse(&mut p)?),
            "dgc" => CodecConfig::Dgc(DgcConfig::parse(&mut p)?),
            "adaptive" => CodecConfig::Adaptive(AdaptiveConfig::parse(&mut p)?),
            other => {
                return Err(ConfigError::UnknownCodec {
                    name: other.to_string(),
                    known: KNOWN.join(", "),
                })
            }
        };
        p.finish()?;
        Ok(cfg)
    }
}

impl fmt::Display for CodecConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let params = match self {
            CodecConfig::None(c) | CodecConfig::Fp16(c) | CodecConfig::Bf16(c) => c.to_string(),
            CodecConfig::OneBit(c) => c.to_string(),
            CodecConfig::Qsgd(c) => c.to_string(),
            CodecConfig::TernGrad(c) => c.to_string(),
            CodecConfig::SignSgd(c) => c.to_string(),
            CodecConfig::PowerSgd(c) => c.to_string(),
            // ---- sparse codecs ----
            CodecConfig::TopK(c) => c.to_string(),
            CodecConfig::Threshold(c) => c.to_string(),
            CodecConfig::RandomK(c) => c.to_string(),
            CodecConfig::Dgc(c) => c.to_string(),
            CodecConfig::Adaptive(c) => c.to_string(),
        };
        f.write_str(self.name())?;
        if !params.is_empty() {
            write!(f, ":{params}")?;
        }
        Ok(())
    }
}

impl CodecConfig {
    /// The codec's wire id.
    pub fn id(&self) -> CodecId {
        match self {
            CodecConfig::None(_) => CodecId::None,
            CodecConfig::Fp16(_) => CodecId::Fp16,
            CodecConfig::Bf16(_) => CodecId::Bf16,
            CodecConfig::OneBit(_) => CodecId::OneBit,
            CodecConfig::Qsgd(_) => CodecId::Qsgd,
            CodecConfig::TernGrad(_) => CodecId::TernGrad,
            CodecConfig::SignSgd(_) => CodecId::SignSgd,
            CodecConfig::PowerSgd(_) => CodecId::PowerSgd,
            // ---- sparse codecs ----
            CodecConfig::TopK(_) => CodecId::TopK,
            CodecConfig::Threshold(_) => CodecId::Threshold,
            CodecConfig::RandomK(_) => CodecId::RandomK,
            CodecConfig::Dgc(_) => CodecId::Dgc,
            CodecConfig::Adaptive(_) => CodecId::Adaptive,
        }
    }

    /// The codec's spec name.
    pub fn name(&self) -> &'static str {
        self.id().name()
    }

    /// Whether the codec this config builds is unbiased and who keeps its residual (they do
    /// not depend on the build context).
    pub fn caps(&self) -> Caps {
        self.build(&BuildContext::single(0)).caps()
    }

    /// Whether the codec this config builds has a sparse form ([`Codec::sparse_encode`]), for
    /// choosing a strategy before building one (it does not depend on the build context).
    pub fn sparsifies(&self) -> bool {
        self.build(&BuildContext::single(0))
            .sparse_encode()
            .is_some()
    }

    /// Whether the codec this config builds needs scalars agreed over ranks
    /// ([`Codec::shared_scalars`]) before every encode (it does not depend on the build
    /// context).
    pub fn needs_shared_scalars(&self) -> bool {
        self.build(&BuildContext::single(0))
            .shared_scalars()
            .is_some()
    }

    /// The runtime codec (wrapped in error feedback when the config asks for it).
    pub fn build(&self, ctx: &BuildContext) -> Box<dyn Codec> {
        use crate::feedback::maybe_wrap;
        match self {
            CodecConfig::None(c) => maybe_wrap(Fp32, c.ef),
            CodecConfig::Fp16(c) => maybe_wrap(Fp16, c.ef),
            CodecConfig::Bf16(c) => maybe_wrap(Bf16, c.ef),
            CodecConfig::OneBit(c) => c.build(ctx),
            CodecConfig::Qsgd(c) => c.build(ctx),
            CodecConfig::TernGrad(c) => c.build(ctx),
            CodecConfig::SignSgd(c) => c.build(ctx),
            CodecConfig::PowerSgd(c) => c.build(ctx),
            // ---- sparse codecs ----
            CodecConfig::TopK(c) => c.build(ctx),
            CodecConfig::Threshold(c) => c.build(ctx),
            CodecConfig::RandomK(c) => c.build(ctx),
            CodecConfig::Dgc(c) => c.build(ctx),
            CodecConfig::Adaptive(c) => c.build(ctx),
        }
    }

    /// The multiple, in elements counted from a tensor's start, at which a stripe may cut the
    /// tensor so that its pieces, each encoded as a tensor of its own, form the same groups
    /// (columns, buckets) as the whole tensor: the column length of 1-bit SGD and adaptive
    /// quantization, QSGD's bucket, 1 for element-wise codecs. `tensor` is `None` when the
    /// shape is unknown. `usize::MAX`: never cut inside the tensor. Codecs with one scale per
    /// tensor (TernGrad, signSGD) and the sparsifiers (top-k, DGC, ...) get their column
    /// length: a piece then has its own scale or selection (documented in `stripe.rs`).
    pub fn stripe_grain(&self, tensor: Option<&crate::TensorInfo>) -> usize {
        let column = tensor.map_or(1, |t| t.column_len());
        match self {
            CodecConfig::None(_) | CodecConfig::Fp16(_) | CodecConfig::Bf16(_) => 1,
            CodecConfig::OneBit(c) => c.column.grain(tensor),
            CodecConfig::Adaptive(c) => c.column.grain(tensor),
            CodecConfig::Qsgd(c) => c.bucket,
            _ => column,
        }
    }

    /// One or more configurations per codec, for shared property tests, benches and fuzzing.
    pub fn examples() -> Vec<CodecConfig> {
        [
            "none",
            "fp16",
            "bf16",
            "onebit",
            "onebit:column=0,ef=false",
            "onebit:column=300",
            "qsgd",
            "qsgd:bits=8,bucket=256,norm=l2",
            "qsgd:levels=3,bucket=1024,norm=l2,coding=elias",
            "terngrad",
            "terngrad:clip=0,ef=true",
            "terngrad:output=ternary",
            "signsgd",
            "powersgd:rank=2",
            "powersgd:rank=1,variant=local",
            "powersgd:rank=2,start=2,min_rate=2",
            // ---- sparse codecs ----
            "topk",
            "topk:ratio=0.05,select=exact,scope=tensor,values=fp16,ef=false",
            // A dyadic tau keeps sums of +-tau exact in any order (the collectives compare bitwise).
            "threshold:tau=0.015625",
            "threshold:tau=0.01,max_ratio=0.01",
            "randomk",
            "randomk:ratio=0.05,scale=false",
            // Dyadic momenta keep sums exact in any order (the collectives compare bitwise).
            "dgc:momentum=0.5",
            "dgc:ratio=0.01,momentum=0.75,nesterov=true,warmup_epochs=0,min_dense=16",
            "dgc:ratio=0.01,momentum=0.5,warmup_epochs=0",
            "adaptive",
            "adaptive:pi=0.05,column=64,max_excess=1.5",
            "adaptive:column=tensor",
            "adaptive:pi=0.05,column=64,ternary=true",
            "adaptive:pi=0.05,column=64,index=golomb",
        ]
        .iter()
        .map(|s| s.parse().expect("example specs parse"))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_displays_and_refuses() {
        for c in CodecConfig::examples() {
            let s = c.to_string();
            assert_eq!(s.parse::<CodecConfig>().unwrap(), c, "{s}");
        }
        assert_eq!("fp16".parse::<CodecConfig>().unwrap().to_string(), "fp16");
        assert_eq!(
            "QSGD:bits=4".parse::<CodecConfig>().unwrap().to_string(),
            "qsgd:bits=4,bucket=512,norm=max,coding=fixed,ef=false"
        );
        let refused = |spec: &str| spec.parse::<CodecConfig>().unwrap_err();
        assert!(matches!(refused("nope"), ConfigError::UnknownCodec { .. }));
        assert!(matches!(
            refused("fp16:bits=3"),
            ConfigError::UnknownParam { .. }
        ));
        for spec in ["qsgd:bucket=0", "onebit:ef=maybe"] {
            assert!(
                matches!(refused(spec), ConfigError::BadValue { .. }),
                "{spec}"
            );
        }
    }
}
