//! The `adaptive:...` spec's parameters ([`AdaptiveConfig`]).

use std::fmt;

use super::Adaptive;
use crate::onebit::UNKNOWN_SHAPE_RUN;
use crate::{BuildContext, Codec, Columns, ConfigError, Params};

/// LBANN's default proportion: one in 64 values.
pub const DEFAULT_PI: f64 = 1.0 / 64.0;

/// Parameters of `adaptive:pi=0.015625[,column=shape][,max_excess=2][,ternary=false]
/// [,index=words|golomb]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveConfig {
    /// Proportion of positive (and of negative) entries sent, in (0, 0.5] (default 1/64).
    pub pi: f64,
    /// How elements group into columns (default: the tensors' shapes).
    pub column: Columns,
    /// Cap per column, as a multiple of `pi * len` (default 2, at least 1).
    pub max_excess: f64,
    /// Ternary reconstruction: unsent entries decode to their column's mean (default off).
    pub ternary: bool,
    /// Golomb-Rice coding (M = 16) of the index gaps instead of 32-bit words (default off).
    pub golomb: bool,
}

impl AdaptiveConfig {
    /// Reads `pi`, `column`, `max_excess`, `ternary`.
    pub fn parse(p: &mut Params) -> Result<Self, ConfigError> {
        Ok(AdaptiveConfig {
            pi: p.f64_in("pi", Some(DEFAULT_PI), 1e-9, 0.5)?,
            column: p.columns(
                "column",
                Columns::Shape(UNKNOWN_SHAPE_RUN),
                UNKNOWN_SHAPE_RUN,
            )?,
            max_excess: p.f64_in("max_excess", Some(2.0), 1.0, 1e6)?,
            ternary: p.bool("ternary", false)?,
            golomb: p.choice("index", "words", &["words", "golomb"])? == "golomb",
        })
    }

    /// The canonical `key=value,...` parameters (parse back to `self`).
    pub fn spec_params(&self) -> String {
        self.to_string()
    }

    /// The runtime codec.
    pub fn build(&self, ctx: &BuildContext) -> Box<dyn Codec> {
        Box::new(Adaptive::new(self.clone(), ctx))
    }
}

impl fmt::Display for AdaptiveConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pi={},column={},max_excess={}",
            self.pi, self.column, self.max_excess
        )?;
        if self.ternary {
            write!(f, ",ternary=true")?;
        }
        if self.golomb {
            write!(f, ",index=golomb")?;
        }
        Ok(())
    }
}
