//! Choosing an all-reduce algorithm by message size and world size: every threshold lives here.
//!
//! Small messages are latency-bound (Aluminum, MLHPC 2018; horovod#221): recursive doubling
//! takes `log2 P` steps. Mid-size ones on power-of-two worlds go to Rabenseifner (halving
//! reduce-scatter + doubling all-gather: `2 log2 P` steps, bandwidth-optimal volume). Large
//! ones go to the ring (`2 (P-1)` steps, bandwidth-optimal, segmented and pipelined).
//!
//! The constants are initial guesses, to be tuned from TCP measurements. Every rank must make
//! the same choice: it depends only on the byte count, the world size and `GRADWIRE_ALGO`,
//! which the launcher gives every rank alike.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// Below this many bytes, all-reduce uses recursive doubling.
pub const SMALL_BYTES: usize = 64 << 10;
/// Up to this many bytes (on power-of-two worlds), all-reduce uses Rabenseifner.
pub const MEDIUM_BYTES: usize = 1 << 20;
/// Broadcasts below this many bytes (or on worlds of 2 ranks) use a binomial tree; larger
/// ones scatter and ring all-gather (van de Geijn).
pub const BCAST_TREE_BYTES: usize = 256 << 10;
/// Default segment size: big messages travel in pieces of at most this many bytes, so the
/// next piece is on the wire while this one is reduced, scratch stays bounded, and no frame
/// exceeds a transport's limit.
pub const DEFAULT_SEGMENT_BYTES: usize = 256 << 10;

/// Environment variable that overrides [`Algorithm::Auto`] on every rank.
pub const ENV_ALGO: &str = "GRADWIRE_ALGO";
/// Environment variable that overrides [`DEFAULT_SEGMENT_BYTES`].
pub const ENV_SEGMENT_BYTES: &str = "GRADWIRE_SEGMENT_BYTES";

/// An all-reduce algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Chosen by [`choose`] from the message size and world size (or `GRADWIRE_ALGO`).
    #[default]
    Auto,
    /// Ring reduce-scatter then ring all-gather.
    Ring,
    /// Recursive doubling (full-buffer exchanges, `log2 P` steps).
    RecursiveDoubling,
    /// Recursive-halving reduce-scatter then recursive-doubling all-gather.
    Rabenseifner,
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Algorithm::Auto => "auto",
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "rd",
            Algorithm::Rabenseifner => "rabenseifner",
        })
    }
}

/// An algorithm name that is none of `auto|ring|rd|rabenseifner`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm '{0}' (expected auto|ring|rd|rabenseifner)")]
pub struct ParseAlgorithmError(pub String);

impl FromStr for Algorithm {
    type Err = ParseAlgorithmError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Algorithm::Auto),
            "ring" => Ok(Algorithm::Ring),
            "rd" | "recursive-doubling" | "recursive_doubling" => Ok(Algorithm::RecursiveDoubling),
            "rabenseifner" | "rab" => Ok(Algorithm::Rabenseifner),
            _ => Err(ParseAlgorithmError(s.to_string())),
        }
    }
}

/// Explicit collective settings: the algorithm override and the segment size, owned by the
/// caller (the engine) instead of read from the environment into process statics.
///
/// [`CollectiveConfig::from_env`] reproduces the old behaviour (`GRADWIRE_ALGO`,
/// `GRADWIRE_SEGMENT_BYTES`); [`CollectiveConfig::default`] ignores the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveConfig {
    /// The all-reduce algorithm; `Auto` means [`choose`] by size (never the environment).
    pub algo: Algorithm,
    /// Segment size in bytes (at least 8): big messages travel in pieces of at most this size.
    pub segment_bytes: usize,
}

impl Default for CollectiveConfig {
    fn default() -> Self {
        CollectiveConfig {
            algo: Algorithm::Auto,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
        }
    }
}

impl CollectiveConfig {
    /// The settings the environment gives: `GRADWIRE_ALGO` and `GRADWIRE_SEGMENT_BYTES`
    /// (as [`env_algorithm`] and [`segment_bytes`] read them), defaults otherwise.
    pub fn from_env() -> Self {
        CollectiveConfig {
            algo: env_algorithm().unwrap_or(Algorithm::Auto),
            segment_bytes: segment_bytes(),
        }
    }

    /// The algorithm for a message of `bytes` bytes on `world` ranks (never `Auto`; the
    /// environment is not consulted).
    pub fn resolve(&self, bytes: usize, world: usize) -> Algorithm {
        match self.algo {
            Algorithm::Auto => choose(bytes, world),
            a => a,
        }
    }

    /// The segment size, clamped to at least 8 bytes.
    pub fn segment_bytes(&self) -> usize {
        self.segment_bytes.max(8)
    }
}

/// The all-reduce algorithm for a message of `bytes` bytes on `world` ranks (never `Auto`).
pub fn choose(bytes: usize, world: usize) -> Algorithm {
    if bytes < SMALL_BYTES || (world <= 2 && bytes < MEDIUM_BYTES) {
        Algorithm::RecursiveDoubling
    } else if bytes <= MEDIUM_BYTES && world.is_power_of_two() {
        Algorithm::Rabenseifner
    } else {
        Algorithm::Ring
    }
}

/// Resolves `Auto`: `GRADWIRE_ALGO` if set (and not `auto`), else [`choose`].
pub fn resolve(algo: Algorithm, bytes: usize, world: usize) -> Algorithm {
    match algo {
        Algorithm::Auto => match env_algorithm() {
            Some(a) if a != Algorithm::Auto => a,
            _ => choose(bytes, world),
        },
        a => a,
    }
}

/// `GRADWIRE_ALGO`, parsed once per process (an unparsable value is logged and ignored).
pub fn env_algorithm() -> Option<Algorithm> {
    static ALGO: OnceLock<Option<Algorithm>> = OnceLock::new();
    *ALGO.get_or_init(|| {
        let v = std::env::var(ENV_ALGO).ok()?;
        match v.parse() {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::warn!("{ENV_ALGO} ignored: {e}");
                None
            }
        }
    })
}

/// The segment size in bytes: `GRADWIRE_SEGMENT_BYTES` (parsed once) or the default.
pub fn segment_bytes() -> usize {
    static SEG: OnceLock<usize> = OnceLock::new();
    *SEG.get_or_init(|| {
        let Ok(v) = std::env::var(ENV_SEGMENT_BYTES) else {
            return DEFAULT_SEGMENT_BYTES;
        };
        match v.trim().parse::<usize>() {
            Ok(n) if n >= 8 => n,
            _ => {
                tracing::warn!("{ENV_SEGMENT_BYTES}={v:?} ignored (need an integer >= 8)");
                DEFAULT_SEGMENT_BYTES
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for a in [
            Algorithm::Auto,
            Algorithm::Ring,
            Algorithm::RecursiveDoubling,
            Algorithm::Rabenseifner,
        ] {
            assert_eq!(a.to_string().parse::<Algorithm>().unwrap(), a);
        }
        assert!("tree".parse::<Algorithm>().is_err());
    }

    #[test]
    fn thresholds() {
        assert_eq!(choose(4, 8), Algorithm::RecursiveDoubling);
        assert_eq!(choose(SMALL_BYTES, 8), Algorithm::Rabenseifner);
        assert_eq!(choose(SMALL_BYTES, 6), Algorithm::Ring);
        assert_eq!(choose(MEDIUM_BYTES + 1, 8), Algorithm::Ring);
        assert_eq!(choose(100 << 20, 2), Algorithm::Ring);
        assert_ne!(resolve(Algorithm::Ring, 4, 8), Algorithm::Auto);
    }

    #[test]
    fn explicit_config_resolves_without_env() {
        let c = CollectiveConfig::default();
        assert_eq!(c.resolve(4, 8), Algorithm::RecursiveDoubling);
        assert_eq!(c.resolve(100 << 20, 2), Algorithm::Ring);
        let r = CollectiveConfig {
            algo: Algorithm::Ring,
            segment_bytes: 1,
        };
        assert_eq!(r.resolve(4, 8), Algorithm::Ring);
        assert_eq!(r.segment_bytes(), 8);
    }
}
