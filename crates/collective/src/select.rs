//! Choosing an all-reduce algorithm by message size and world size: every threshold lives here.
//!
//! Small messages are latency-bound (Aluminum, MLHPC 2018; horovod#221): recursive doubling
//! takes `log2 P` steps. Mid-size ones on power-of-two worlds go to Rabenseifner (halving
//! reduce-scatter + doubling all-gather: `2 log2 P` steps, bandwidth-optimal volume). Large
//! ones go to the ring (`2 (P-1)` steps, bandwidth-optimal, segmented and pipelined).
//!
//! Every rank must make the same choice: it depends only on the byte count, the world size
//! and `GRADWIRE_ALGO`, which the launcher gives every rank alike.
//!
//! ## Measurements (2026-12-01)
//! `cargo run --release -p gradwire-collective --example tcp_busbw -- --worlds 2,3,4,8
//! --sizes 4K,16K,64K,256K,1M,4M --algos rd,rabenseifner,ring --paths pipelined`: TCP
//! loopback, one thread per rank, f32 sum, pipelined data path. Bus bandwidth in GB/s
//! (`size · 2(P-1)/P / time`). Three runs: 1 (best of 3 per cell), 2 (best of 5, the
//! algorithms interleaved), 3 (best of 9, interleaved, 64K-1M at P <= 4 only). Values are
//! run 2, then run 3 where there is one; the last column counts the runs that agree. Caveat: a 2-core VM shared with other builds (load average 13-14),
//! so every rank competes for the CPU with everything else: single runs vary by up to 2x,
//! and only choices that held in at least two of the three runs moved a threshold.
//!
//! ```text
//!  P  size   rd         rabenseifner  ring       best (runs agreeing)
//!  2  4K     0.26       0.14          0.14       rd (2/2)
//!  2  16K    0.81       0.50          0.49       rd (2/2)
//!  2  64K    1.25 1.89  1.73 1.00     1.52 1.04  rd (2/3)
//!  2  256K   0.77 0.91  0.84 0.89     0.61 0.77  rd ~ rabenseifner
//!  2  1M     0.51 0.63  0.63 0.60     0.58 0.65  tie
//!  3  4K     0.09       0.06          0.03       rd (2/2)
//!  3  64K    0.80 0.95  0.56 0.36     0.48 0.25  rd (2/3)
//!  3  256K   1.72 1.04  1.36 0.66     1.46 0.74  rd (2/3), ring close
//!  3  1M     0.94 0.84  0.61 0.95     0.40 1.04  mixed
//!  3  4M     0.19       0.16          0.29       ring ~ rabenseifner (run 1: .18/.23/.22)
//!  4  4K     0.14       0.08          0.06       rd (2/2)
//!  4  64K    0.62 0.51  0.81 0.40     0.53 0.22  rd (2/3)
//!  4  256K   0.72 0.65  0.49 0.90     0.50 0.90  rabenseifner ~ ring (2/3)
//!  4  1M     0.32 0.59  0.29 0.88     0.71 0.95  ring (3/3)
//!  4  4M     0.37       0.55          0.60       ring ~ rabenseifner
//!  8  4K     0.04       0.02          0.01       rd (2/2)
//!  8  64K    0.26       0.28          0.20       rd ~ rabenseifner (2/2)
//!  8  256K   0.26       0.38          0.44       ring, rabenseifner close (2/2)
//!  8  1M     0.22       0.41          0.40       rabenseifner ~ ring (2/2)
//!  8  4M     0.14       0.32          0.13       mixed (run 1: .15/.20/.26)
//! ```
//! Hence recursive doubling below 128 KiB (was 64 KiB: it won at 64 KiB for P = 2, 3, 4 and
//! tied at 8), Rabenseifner up to 512 KiB on power-of-two worlds (was 1 MiB: the ring won at
//! 1 MiB for P = 4 in every run and tied at 8), the ring above (for threads; four processes
//! are the next section's). On two ranks recursive
//! doubling (one exchange) keeps everything below [`MEDIUM_BYTES`]. These numbers are
//! CPU-bound (loopback moves bytes with the same cores that add them); re-measure on a real
//! network, where the bandwidth-optimal algorithms should win earlier.
//!
//! ## Four ranks in four processes (2026-12-01)
//! The table above times threads of one process. With one process per rank (as `gradwire
//! launch` and `gradwire bench allreduce` run them), on the same 2-core VM (loaded machine:
//! load average 6-7, another helper compiling), `examples/allreduce_procs.rs`, bus GB/s,
//! three interleaved rounds, ring → Rabenseifner:
//!
//! ```text
//!  TCP P=4  1M   1.05 → 1.61   0.94 → 1.35   0.98 → 1.49
//!           16M  0.87 → 1.20   0.77 → 1.10   0.78 → 1.07
//!           64M  0.80 → 1.01   0.84 → 0.99   0.79 → 0.95
//!  shm P=4  1M   0.54 → 1.24   1.25 → 1.22        16M 0.55 → 0.52  0.47 → 0.50
//!           64M  0.55 → 0.52   0.48 → 0.41   (a tie)
//!  TCP P=8  1M   0.41 → 0.37   0.35 → 0.39        16M 0.27 → 0.20  0.17 → 0.28   (mixed)
//! ```
//! Four processes on two cores take turns on the CPU: Rabenseifner's pairwise exchanges
//! (4 steps, two independent pairs each) need fewer hand-overs than the ring's 6 steps, in
//! which every rank waits on its left neighbour. Open MPI 4.1's fixed decision rules
//! (`coll_tuned_decision_fixed.c`, commutative ops, 4 to 7 ranks) also pick Rabenseifner
//! from 8 KiB up. Hence on power-of-two worlds of at most [`RABENSEIFNER_MAX_WORLD`] ranks
//! Rabenseifner keeps every size from [`SMALL_BYTES`] up; larger worlds keep the ring above
//! [`MEDIUM_BYTES`] (P = 8 was mixed).

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// Below this many bytes, all-reduce uses recursive doubling (measured: see the module doc).
pub const SMALL_BYTES: usize = 128 << 10;
/// Up to this many bytes (on power-of-two worlds), all-reduce uses Rabenseifner.
pub const MEDIUM_BYTES: usize = 512 << 10;
/// On power-of-two worlds up to this many ranks (and more than 2: two ranks use recursive
/// doubling, then the ring), Rabenseifner has no upper size limit (module doc).
pub const RABENSEIFNER_MAX_WORLD: usize = 4;
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
    } else if world.is_power_of_two()
        && (bytes <= MEDIUM_BYTES || (world > 2 && world <= RABENSEIFNER_MAX_WORLD))
    {
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
        // Four ranks: Rabenseifner from SMALL_BYTES up, whatever the size.
        assert_eq!(choose(SMALL_BYTES - 4, 4), Algorithm::RecursiveDoubling);
        assert_eq!(choose(SMALL_BYTES, 4), Algorithm::Rabenseifner);
        assert_eq!(choose(64 << 20, 4), Algorithm::Rabenseifner);
        assert_eq!(choose(64 << 20, 8), Algorithm::Ring);
        assert_eq!(choose(64 << 20, 3), Algorithm::Ring);
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
