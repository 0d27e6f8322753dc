//! What `--sync` asks for ([`SyncMode`]): an all-reduce strategy of the engine, or a
//! parameter-server mode ([`PsMode`]: a table's consistency, or Sandblaster).

use std::str::FromStr;

use gradwire_ps::Consistency;
use gradwire_train::SyncStrategy;

/// What `--sync` asks for: an all-reduce strategy or a parameter-server mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SyncMode {
    /// Gradients reduced by the engine with this strategy.
    AllReduce(SyncStrategy),
    /// Parameters and optimizer on parameter-server shards.
    Ps(PsMode),
}

impl Default for SyncMode {
    fn default() -> Self {
        SyncMode::AllReduce(SyncStrategy::default())
    }
}

/// The parameter-server modes of `--sync`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PsMode {
    /// `ps-sync`, `ps-async` or `ps-ssp:S`.
    Table(Consistency),
    /// `sandblaster`: DistBelief's batch L-BFGS.
    Sandblaster,
}

impl std::fmt::Display for PsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PsMode::Table(c) => write!(f, "ps-{c}"),
            PsMode::Sandblaster => f.write_str("sandblaster"),
        }
    }
}

/// A `--sync` value that names no strategy and no parameter-server mode.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SyncModeError {
    /// `ps-...` but not a consistency the parameter server knows.
    #[error("unknown parameter-server mode '{0}' (ps-sync, ps-async, ps-ssp:S)")]
    UnknownPs(String),
    /// Neither an all-reduce strategy nor a parameter-server mode.
    #[error("{0}; or a parameter server: ps-sync, ps-async, ps-ssp:S, sandblaster")]
    Unknown(String),
}

impl FromStr for SyncMode {
    type Err = SyncModeError;
    fn from_str(s: &str) -> Result<Self, SyncModeError> {
        let t = s.trim().to_ascii_lowercase();
        if t == "sandblaster" {
            return Ok(SyncMode::Ps(PsMode::Sandblaster));
        }
        if t.starts_with("ps-") {
            return t
                .parse::<Consistency>()
                .map(|c| SyncMode::Ps(PsMode::Table(c)))
                .map_err(|_| SyncModeError::UnknownPs(s.to_string()));
        }
        t.parse::<SyncStrategy>()
            .map(SyncMode::AllReduce)
            .map_err(|e| SyncModeError::Unknown(e.to_string()))
    }
}

impl SyncMode {
    /// The all-reduce strategy (auto for a PS mode) and the PS mode, if any.
    pub fn split(self) -> (SyncStrategy, Option<PsMode>) {
        match self {
            SyncMode::AllReduce(s) => (s, None),
            SyncMode::Ps(m) => (SyncStrategy::default(), Some(m)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_values_name_a_strategy_or_a_server_mode() {
        assert_eq!(
            "sandblaster".parse::<SyncMode>(),
            Ok(SyncMode::Ps(PsMode::Sandblaster))
        );
        assert_eq!(
            "PS-async".parse::<SyncMode>(),
            Ok(SyncMode::Ps(PsMode::Table(Consistency::Async)))
        );
        assert_eq!(
            "dense".parse::<SyncMode>().map(SyncMode::split),
            Ok(("dense".parse::<SyncStrategy>().expect("a strategy"), None))
        );
        assert!(matches!(
            "ps-fast".parse::<SyncMode>(),
            Err(SyncModeError::UnknownPs(_))
        ));
        let e = "fast".parse::<SyncMode>().unwrap_err().to_string();
        assert!(e.contains("sandblaster"), "{e}");
    }
}
