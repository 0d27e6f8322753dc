//! Identifiers and the declarative description of a table: consistency, dead-worker policy,
//! push codec and server-side updater. Everything here is plain data that parses from and
//! prints to a spec string; nothing here is code shipped over the wire.

use std::fmt;
use std::str::FromStr;

use gradwire_codec::{CodecConfig, CodecId, Params};

use crate::twobit::TwoBitConfig;
use crate::updater::UpdaterSpec;
use crate::{Error, Result};

/// A table (tensor) key, chosen by the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub u64);

/// A worker's rank, `0..num_workers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u32);

/// One chunk of a table: tables longer than the chunk size are sliced into chunks, each
/// placed on one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId {
    /// The table.
    pub key: Key,
    /// The chunk's index within the table.
    pub index: u32,
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {} chunk {}", self.key.0, self.index)
    }
}

/// How pushes of different workers are combined in time (per table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consistency {
    /// BSP: a round closes after one push from each distinct live worker; pulls wait for it.
    Sync,
    /// Downpour / ASP: each push is applied as it arrives; pulls never wait.
    Async,
    /// Stale synchronous parallel: a pull at clock `c` waits until every worker has pushed
    /// at least `c - staleness` times.
    Ssp {
        /// The bound `s` (0 behaves like BSP reads, unbounded like async).
        staleness: u32,
    },
}

impl FromStr for Consistency {
    type Err = Error;
    /// `sync`, `async`, `ssp:S` (also `ssp:staleness=S`), and the CLI's `ps-sync`,
    /// `ps-async`, `ps-ssp:S`.
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim().to_ascii_lowercase();
        let s = s.strip_prefix("ps-").map(str::to_string).unwrap_or(s);
        match s.as_str() {
            "sync" | "bsp" => return Ok(Consistency::Sync),
            "async" | "asp" | "downpour" => return Ok(Consistency::Async),
            _ => {}
        }
        if let Some(rest) = s.strip_prefix("ssp:") {
            let v = rest.strip_prefix("staleness=").unwrap_or(rest);
            if let Ok(staleness) = v.parse::<u32>() {
                return Ok(Consistency::Ssp { staleness });
            }
        }
        Err(Error::Spec {
            what: "consistency",
            spec: s,
            reason: "expected sync, async or ssp:S".into(),
        })
    }
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Consistency::Sync => f.write_str("sync"),
            Consistency::Async => f.write_str("async"),
            Consistency::Ssp { staleness } => write!(f, "ssp:{staleness}"),
        }
    }
}

/// What a synchronous round (or an SSP read) does when a worker it waits for is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeadPolicy {
    /// Every waiter gets [`Error::WorkerLost`] naming the dead worker.
    #[default]
    Strict,
    /// The dead worker is left out: the round closes with the live workers' pushes.
    Shrink,
}

impl FromStr for DeadPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "strict" => Ok(DeadPolicy::Strict),
            "shrink" => Ok(DeadPolicy::Shrink),
            other => Err(Error::Spec {
                what: "dead-worker policy",
                spec: other.into(),
                reason: "expected strict or shrink".into(),
            }),
        }
    }
}

/// How the server treats one push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PushMode {
    /// A gradient: averaged over the round's workers (sync) and given to the updater.
    Grad = 0,
    /// A precomputed update, added to the parameters (sync: the round's pushes are summed).
    Add = 1,
    /// A precomputed value that replaces the parameters (async and SSP tables only).
    Assign = 2,
}

impl PushMode {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(PushMode::Grad),
            1 => Some(PushMode::Add),
            2 => Some(PushMode::Assign),
            _ => None,
        }
    }
}

/// How pushes of a table are compressed on the way to the server.
#[derive(Debug, Clone, PartialEq)]
pub enum PushCodec {
    /// Plain little-endian f32.
    Dense,
    /// MXNet's 2-bit quantizer with a worker-side residual ([`crate::TwoBit`]).
    TwoBit(TwoBitConfig),
    /// Any gradwire codec (spec as in `gradwire-codec`); the server `decode_add`s. Add
    /// `ef=true` to the spec for error feedback at the worker.
    Codec(CodecConfig),
}

impl FromStr for PushCodec {
    type Err = Error;
    /// `dense` (or `none`), `2bit[:threshold=T]`, or any gradwire codec spec.
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        let name = t
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let bad = |reason: String| Error::Spec {
            what: "push codec",
            spec: t.into(),
            reason,
        };
        match name.as_str() {
            "" | "dense" => Ok(PushCodec::Dense),
            "2bit" | "twobit" => {
                let mut p = Params::parse(t).map_err(|e| bad(e.to_string()))?;
                let c = TwoBitConfig::parse(&mut p).map_err(|e| bad(e.to_string()))?;
                p.finish().map_err(|e| bad(e.to_string()))?;
                Ok(PushCodec::TwoBit(c))
            }
            _ => {
                let c: CodecConfig = t
                    .parse()
                    .map_err(|e: gradwire_codec::ConfigError| bad(e.to_string()))?;
                if c.id() == CodecId::PowerSgd {
                    return Err(bad(
                        "powersgd needs an all-reduce of its factors; a server cannot decode it"
                            .into(),
                    ));
                }
                if c.id() == CodecId::None {
                    return Ok(PushCodec::Dense);
                }
                Ok(PushCodec::Codec(c))
            }
        }
    }
}

impl fmt::Display for PushCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PushCodec::Dense => f.write_str("dense"),
            PushCodec::TwoBit(c) => write!(f, "{c}"),
            PushCodec::Codec(c) => write!(f, "{c}"),
        }
    }
}

/// Everything the server needs to know about a table, as data.
#[derive(Debug, Clone, PartialEq)]
pub struct TableSpec {
    /// Server-side optimizer (`sgd:lr=0.1`, `adagrad:lr=0.1`, `adam:lr=1e-3`, `sum`).
    pub updater: UpdaterSpec,
    /// BSP, ASP or SSP.
    pub consistency: Consistency,
    /// What a sync round or SSP read does about a dead worker.
    pub dead_policy: DeadPolicy,
    /// How pushes are compressed.
    pub codec: PushCodec,
    /// Elements per row, for row-sparse pulls (1 for a flat vector). Chunks hold whole rows.
    pub row_len: u32,
}

impl Default for TableSpec {
    fn default() -> Self {
        TableSpec {
            updater: UpdaterSpec::Sum,
            consistency: Consistency::Sync,
            dead_policy: DeadPolicy::Strict,
            codec: PushCodec::Dense,
            row_len: 1,
        }
    }
}

impl TableSpec {
    /// A table with this consistency and updater, dense pushes, strict policy, flat rows.
    pub fn new(consistency: Consistency, updater: UpdaterSpec) -> Self {
        TableSpec {
            consistency,
            updater,
            ..TableSpec::default()
        }
    }

    /// Sets the push codec.
    pub fn with_codec(mut self, codec: PushCodec) -> Self {
        self.codec = codec;
        self
    }

    /// Sets the dead-worker policy.
    pub fn with_dead_policy(mut self, p: DeadPolicy) -> Self {
        self.dead_policy = p;
        self
    }

    /// Sets the row length (for row-sparse pulls).
    pub fn with_row_len(mut self, row_len: u32) -> Self {
        self.row_len = row_len.max(1);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consistency_specs_parse_and_print() {
        for (s, c) in [
            ("sync", Consistency::Sync),
            ("ps-sync", Consistency::Sync),
            ("async", Consistency::Async),
            ("ps-async", Consistency::Async),
            ("ssp:3", Consistency::Ssp { staleness: 3 }),
            ("ps-ssp:0", Consistency::Ssp { staleness: 0 }),
            ("ssp:staleness=7", Consistency::Ssp { staleness: 7 }),
        ] {
            assert_eq!(s.parse::<Consistency>().unwrap(), c, "{s}");
            assert_eq!(c.to_string().parse::<Consistency>().unwrap(), c);
        }
        assert!("ssp".parse::<Consistency>().is_err());
        assert!("ssp:-1".parse::<Consistency>().is_err());
        assert!("2bit:threshold=0".parse::<PushCodec>().is_err());
        assert!("powersgd".parse::<PushCodec>().is_err());
        assert_eq!("none".parse::<PushCodec>().unwrap(), PushCodec::Dense);
        assert_eq!("shrink".parse::<DeadPolicy>().unwrap(), DeadPolicy::Shrink);
    }
}
