//! The elastic settings of a job (`--elastic MIN:MAX`, `--commit-every`, `--join`): the
//! range of world sizes ([`ElasticRange`]) and the validated setting ([`Elastic`]), checked
//! against the rest of the plan. What elastic training does is `gradwire_run::elastic`'s
//! and `gradwire_train::elastic`'s module docs.

use std::path::PathBuf;

use clap::Args;

/// Steps between commits when `--commit-every` is not given.
pub const DEFAULT_COMMIT_EVERY: u64 = 10;

/// The flags of elastic training.
#[derive(Debug, Clone, Default, Args)]
pub struct ElasticSettings {
    /// Elastic training between MIN and MAX ranks (`--workers` start it): when a rank dies
    /// the others go on from the last commit (--commit-every) without it, and processes
    /// started with `--join OUT` are admitted at the next commit. TCP processes on this host.
    #[arg(long, value_name = "MIN:MAX")]
    pub elastic: Option<ElasticRange>,
    /// Steps between the in-memory commits of --elastic: a lost rank costs at most this
    /// many steps, and a joiner waits at most this long [default: 10].
    #[arg(long, value_name = "N")]
    pub commit_every: Option<u64>,
    /// Join the running elastic run whose --out folder is DIR as one more worker (its
    /// settings are that run's; the other flags are ignored).
    #[arg(long, value_name = "DIR")]
    pub join: Option<PathBuf>,
}

/// `MIN:MAX` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElasticRange {
    /// The fewest ranks the run goes on with.
    pub min: usize,
    /// The most ranks it admits.
    pub max: usize,
}

/// A `MIN:MAX` that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// No colon.
    #[error("{0:?}: expected MIN:MAX, e.g. 2:4")]
    Shape(String),
    /// A side is not a number.
    #[error("{range:?}: {side:?} is not a number of ranks")]
    Number {
        /// The whole value.
        range: String,
        /// The side that is not a number.
        side: String,
    },
    /// Out of order or out of bounds.
    #[error("{0:?}: need 1 <= MIN <= MAX <= 64")]
    Bounds(String),
}

impl std::str::FromStr for ElasticRange {
    type Err = RangeError;
    fn from_str(s: &str) -> Result<Self, RangeError> {
        let (a, b) = s
            .split_once(':')
            .ok_or_else(|| RangeError::Shape(s.to_string()))?;
        let num = |v: &str| {
            v.trim().parse::<usize>().map_err(|_| RangeError::Number {
                range: s.to_string(),
                side: v.to_string(),
            })
        };
        let (min, max) = (num(a)?, num(b)?);
        if min == 0 || min > max || max > 64 {
            return Err(RangeError::Bounds(s.to_string()));
        }
        Ok(ElasticRange { min, max })
    }
}

/// A validated elastic setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elastic {
    /// The range of world sizes.
    pub range: ElasticRange,
    /// Steps between commits.
    pub commit_every: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_bad_ones_say_why() {
        assert_eq!("2:4".parse(), Ok(ElasticRange { min: 2, max: 4 }));
        assert!(matches!(
            "4".parse::<ElasticRange>(),
            Err(RangeError::Shape(_))
        ));
        assert!(matches!(
            "a:2".parse::<ElasticRange>(),
            Err(RangeError::Number { .. })
        ));
        for bad in ["0:2", "3:2", "1:65"] {
            assert!(
                matches!(bad.parse::<ElasticRange>(), Err(RangeError::Bounds(_))),
                "{bad}"
            );
        }
    }
}
