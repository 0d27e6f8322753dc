//! How one model replica is cut over its partitions: [`Split`], written `tensor` or
//! `pipeline` / `pipeline:micro_batches=4` on a command line.

use std::str::FromStr;

use crate::error::{Error, PartitionError, Result};

/// Most micro-batches a pipeline step may be cut into.
pub const MAX_MICRO_BATCHES: usize = 1024;

/// How a model replica is split over its `K` partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Within each layer: every partition holds a slice of the units of every fully connected
    /// layer (DistBelief's vertical split, paired Megatron-style; see the module doc).
    Tensor,
    /// Across layers: consecutive layers on consecutive partitions, activations forward and
    /// their gradients backward as messages. `micro_batches = 1` is DistBelief's plain
    /// split; more cut each batch into that many micro-batches run as GPipe schedules them
    /// (all forwards, then all backwards, gradients summed).
    Pipeline {
        /// Micro-batches per step (1 to [`MAX_MICRO_BATCHES`]).
        micro_batches: usize,
    },
}

impl Split {
    /// Checks the settings (a pipeline needs 1 to [`MAX_MICRO_BATCHES`] micro-batches).
    pub fn validate(&self) -> Result<()> {
        match *self {
            Split::Pipeline { micro_batches }
                if !(1..=MAX_MICRO_BATCHES).contains(&micro_batches) =>
            {
                Err(PartitionError::MicroBatches {
                    given: micro_batches,
                }
                .into())
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Split::Tensor => f.write_str("tensor"),
            Split::Pipeline { micro_batches: 1 } => f.write_str("pipeline"),
            Split::Pipeline { micro_batches } => {
                write!(f, "pipeline:micro_batches={micro_batches}")
            }
        }
    }
}

impl FromStr for Split {
    type Err = Error;
    /// `tensor`, `pipeline` (one micro-batch) or `pipeline:micro_batches=N`.
    fn from_str(s: &str) -> Result<Split> {
        let lower = s.trim().to_ascii_lowercase();
        let bad = || {
            Error::from(PartitionError::UnknownSplit {
                spec: s.to_string(),
            })
        };
        let split = match lower.split_once(':') {
            None if lower == "tensor" => Split::Tensor,
            None if lower == "pipeline" => Split::Pipeline { micro_batches: 1 },
            Some((family, opts)) if family.trim() == "pipeline" => {
                let (key, value) = opts.split_once('=').ok_or_else(bad)?;
                if key.trim() != "micro_batches" {
                    return Err(bad());
                }
                let micro_batches = value.trim().parse().map_err(|_| {
                    Error::from(PartitionError::SplitCount {
                        spec: s.to_string(),
                        value: value.trim().to_string(),
                    })
                })?;
                Split::Pipeline { micro_batches }
            }
            _ => return Err(bad()),
        };
        split.validate()?;
        Ok(split)
    }
}
