//! Typed link settings and their string form.
//!
//! Grammar (case-insensitive, spaces ignored):
//!
//! ```text
//! config    := spec (';' override)*
//! spec      := item (',' item)*            -- must name a bandwidth
//! override  := 'rank' R '=' item (',' item)*   -- replaces only the items it names
//! item      := bandwidth | latency | 'jitter=' duration | 'overhead=' bytes | 'seed=' u64
//! bandwidth := number ('bit' | 'kbit' | 'mbit' | 'gbit' | 'tbit')   -- decimal (SI) units
//! latency   := duration
//! duration  := number ('ns' | 'us' | 'ms' | 's')
//! ```
//!
//! Examples: `1gbit,50us`, `100mbit`, `10gbit,5us,jitter=1us`, `1gbit,50us;rank3=100mbit`,
//! `25gbit,2us,overhead=64`. `seed` only belongs to the base spec. Bandwidth is in bits per
//! second like tc's `mbit`; byte rates (`mbps`, `MB/s`) are refused rather than guessed.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A link's bandwidth, in bits per second (never zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bandwidth(u64);

impl Bandwidth {
    /// A bandwidth of `bps` bits per second; `None` for zero.
    pub fn from_bits_per_sec(bps: u64) -> Option<Bandwidth> {
        (bps > 0).then_some(Bandwidth(bps))
    }

    /// Bits per second.
    pub fn bits_per_sec(self) -> u64 {
        self.0
    }

    /// Time to put `bytes` bytes on the wire, in nanoseconds.
    pub fn wire_ns(self, bytes: u64) -> u64 {
        ((bytes as u128 * 8 * 1_000_000_000) / self.0 as u128).min(u64::MAX as u128) as u64
    }
}

impl fmt::Display for Bandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (unit, scale) in [("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)] {
            if b as f64 >= scale {
                return write!(f, "{}{unit}", b as f64 / scale);
            }
        }
        write!(f, "{b}bit")
    }
}

impl FromStr for Bandwidth {
    type Err = LinkSpecError;
    fn from_str(s: &str) -> Result<Self, LinkSpecError> {
        let t = s.trim().to_ascii_lowercase();
        let (num, unit) = split_unit(&t);
        let scale = match unit {
            "bit" => 1.0,
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            "tbit" => 1e12,
            _ => {
                return Err(LinkSpecError::BadItem {
                    item: s.trim().into(),
                })
            }
        };
        let x = parse_number(num, s)?;
        let bps = (x * scale).round();
        if !(1.0..=u64::MAX as f64).contains(&bps) {
            return Err(LinkSpecError::ZeroBandwidth {
                item: s.trim().into(),
            });
        }
        Ok(Bandwidth(bps as u64))
    }
}

/// The settings of one link (or one rank's network interface).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkSpec {
    /// Serialization rate of each direction.
    pub bandwidth: Bandwidth,
    /// One-way propagation delay added to every message.
    pub latency: Duration,
    /// Each message's latency is drawn uniformly from `latency ± jitter` (floored at zero,
    /// never reordering messages of one pair).
    pub jitter: Duration,
    /// Bytes charged per message on top of its payload (framing, headers); 0 by default.
    pub overhead: u32,
}

impl LinkSpec {
    /// A link of `bandwidth` and `latency`, no jitter, no per-message overhead.
    pub fn new(bandwidth: Bandwidth, latency: Duration) -> LinkSpec {
        LinkSpec {
            bandwidth,
            latency,
            jitter: Duration::ZERO,
            overhead: 0,
        }
    }

    /// Time for a message of `len` payload bytes to leave the sender, in nanoseconds.
    pub fn wire_ns(&self, len: usize) -> u64 {
        self.bandwidth
            .wire_ns(len as u64 + u64::from(self.overhead))
    }

    /// The link between two ranks with these interfaces: the slower bandwidth, the longer
    /// latency and jitter, the larger overhead (symmetric, so both ends agree).
    pub fn between(&self, other: &LinkSpec) -> LinkSpec {
        LinkSpec {
            bandwidth: self.bandwidth.min(other.bandwidth),
            latency: self.latency.max(other.latency),
            jitter: self.jitter.max(other.jitter),
            overhead: self.overhead.max(other.overhead),
        }
    }
}

impl fmt::Display for LinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}ns", self.bandwidth, self.latency.as_nanos())?;
        if !self.jitter.is_zero() {
            write!(f, ",jitter={}ns", self.jitter.as_nanos())?;
        }
        if self.overhead > 0 {
            write!(f, ",overhead={}", self.overhead)?;
        }
        Ok(())
    }
}

impl FromStr for LinkSpec {
    type Err = LinkSpecError;
    fn from_str(s: &str) -> Result<Self, LinkSpecError> {
        let p = Partial::parse(s, false)?;
        p.over(None)
    }
}

/// Link settings for a whole job: a default interface, per-rank overrides (a slow rank),
/// and the jitter seed. Every rank parses the same config, so both ends of a link agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkConfig {
    /// The interface of every rank without an override.
    pub default: LinkSpec,
    /// Ranks whose interface differs (complete specs, overrides already applied).
    pub ranks: BTreeMap<usize, LinkSpec>,
    /// Seed of the jitter draws (combined with the two ranks of each link).
    pub seed: u64,
}

impl LinkConfig {
    /// Every rank on the same `spec`.
    pub fn uniform(spec: LinkSpec) -> LinkConfig {
        LinkConfig {
            default: spec,
            ranks: BTreeMap::new(),
            seed: 0,
        }
    }

    /// Gives `rank` its own interface.
    pub fn with_rank(mut self, rank: usize, spec: LinkSpec) -> LinkConfig {
        self.ranks.insert(rank, spec);
        self
    }

    /// Applies an override in the item syntax (`100mbit`, `100mbit,5ms`) to `rank`.
    pub fn override_rank(&mut self, rank: usize, items: &str) -> Result<(), LinkSpecError> {
        let base = self.interface(rank);
        let spec = Partial::parse(items, false)?.over(Some(&base))?;
        self.ranks.insert(rank, spec);
        Ok(())
    }

    /// The interface of `rank`.
    pub fn interface(&self, rank: usize) -> LinkSpec {
        self.ranks.get(&rank).copied().unwrap_or(self.default)
    }

    /// The link between ranks `a` and `b` (see [`LinkSpec::between`]).
    pub fn link(&self, a: usize, b: usize) -> LinkSpec {
        self.interface(a).between(&self.interface(b))
    }
}

impl FromStr for LinkConfig {
    type Err = LinkSpecError;
    fn from_str(s: &str) -> Result<Self, LinkSpecError> {
        let mut parts = s.split(';');
        let base = Partial::parse(parts.next().unwrap_or(""), true)?;
        let mut cfg = LinkConfig::uniform(base.over(None)?);
        cfg.seed = base.seed.unwrap_or(0);
        for part in parts {
            let part = part.trim();
            let lower = part.to_ascii_lowercase();
            let (head, items) = lower
                .split_once('=')
                .ok_or_else(|| LinkSpecError::BadOverride { part: part.into() })?;
            let rank = head
                .trim()
                .strip_prefix("rank")
                .and_then(|r| r.trim().parse::<usize>().ok())
                .ok_or_else(|| LinkSpecError::BadOverride { part: part.into() })?;
            if cfg.ranks.contains_key(&rank) {
                return Err(LinkSpecError::Duplicate {
                    what: format!("rank{rank}"),
                });
            }
            cfg.override_rank(rank, items)?;
        }
        Ok(cfg)
    }
}

/// Why a link spec string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkSpecError {
    /// The spec names no bandwidth.
    #[error("no bandwidth given (expected e.g. `1gbit,50us`)")]
    MissingBandwidth,
    /// An item is neither a bandwidth, a duration nor a known `key=value`.
    #[error("`{item}` is not a bandwidth (100mbit, 1gbit), a latency (50us, 1ms) or jitter=/overhead=/seed=")]
    BadItem {
        /// The offending item.
        item: String,
    },
    /// A number did not parse (or was negative or not finite).
    #[error("`{item}`: not a non-negative number")]
    BadNumber {
        /// The offending item.
        item: String,
    },
    /// A bandwidth of zero (or out of range).
    #[error("`{item}`: bandwidth must be at least 1 bit/s")]
    ZeroBandwidth {
        /// The offending item.
        item: String,
    },
    /// A byte rate where a bit rate was expected.
    #[error(
        "`{item}`: byte rates are ambiguous; give bits per second (e.g. 800mbit for 100 MB/s)"
    )]
    ByteRate {
        /// The offending item.
        item: String,
    },
    /// The same setting twice.
    #[error("{what} given twice")]
    Duplicate {
        /// Which setting.
        what: String,
    },
    /// A per-rank part that is not `rank<R>=<items>`.
    #[error("`{part}`: a per-rank override reads `rank<R>=<items>`, e.g. `rank3=100mbit`")]
    BadOverride {
        /// The offending part.
        part: String,
    },
    /// `seed=` inside a per-rank override.
    #[error("seed= belongs to the base spec, not to a per-rank override")]
    SeedInOverride,
}

/// The items of one spec, each optional until merged over a base.
#[derive(Debug, Default)]
struct Partial {
    bandwidth: Option<Bandwidth>,
    latency: Option<Duration>,
    jitter: Option<Duration>,
    overhead: Option<u32>,
    seed: Option<u64>,
}

impl Partial {
    fn parse(s: &str, allow_seed: bool) -> Result<Partial, LinkSpecError> {
        let mut p = Partial::default();
        for raw in s.split(',') {
            let item: String = raw.chars().filter(|c| !c.is_whitespace()).collect();
            let item = item.to_ascii_lowercase();
            if item.is_empty() {
                continue;
            }
            fn set<T>(slot: &mut Option<T>, v: T, what: &str) -> Result<(), LinkSpecError> {
                if slot.replace(v).is_some() {
                    return Err(LinkSpecError::Duplicate { what: what.into() });
                }
                Ok(())
            }
            if let Some((key, val)) = item.split_once('=') {
                match key {
                    "jitter" => set(&mut p.jitter, parse_duration(val, raw)?, "jitter")?,
                    "latency" | "delay" => {
                        set(&mut p.latency, parse_duration(val, raw)?, "latency")?
                    }
                    "bandwidth" | "rate" => set(&mut p.bandwidth, val.parse()?, "bandwidth")?,
                    "overhead" => {
                        let v = val.trim_end_matches('b').parse().map_err(|_| {
                            LinkSpecError::BadNumber {
                                item: raw.trim().into(),
                            }
                        })?;
                        set(&mut p.overhead, v, "overhead")?
                    }
                    "seed" if allow_seed => {
                        let v = val.parse().map_err(|_| LinkSpecError::BadNumber {
                            item: raw.trim().into(),
                        })?;
                        set(&mut p.seed, v, "seed")?
                    }
                    "seed" => return Err(LinkSpecError::SeedInOverride),
                    _ => {
                        return Err(LinkSpecError::BadItem {
                            item: raw.trim().into(),
                        })
                    }
                }
            } else if item.ends_with("bps") || item.ends_with("b/s") || item.ends_with("byte") {
                return Err(LinkSpecError::ByteRate {
                    item: raw.trim().into(),
                });
            } else if item.ends_with("bit") {
                set(&mut p.bandwidth, item.parse()?, "bandwidth")?;
            } else {
                let d = parse_duration(&item, raw).map_err(|_| LinkSpecError::BadItem {
                    item: raw.trim().into(),
                })?;
                set(&mut p.latency, d, "latency")?;
            }
        }
        Ok(p)
    }

    /// Completes this partial spec over `base` (or alone, where a bandwidth is required).
    fn over(&self, base: Option<&LinkSpec>) -> Result<LinkSpec, LinkSpecError> {
        let bandwidth = self
            .bandwidth
            .or(base.map(|b| b.bandwidth))
            .ok_or(LinkSpecError::MissingBandwidth)?;
        Ok(LinkSpec {
            bandwidth,
            latency: self.latency.or(base.map(|b| b.latency)).unwrap_or_default(),
            jitter: self.jitter.or(base.map(|b| b.jitter)).unwrap_or_default(),
            overhead: self.overhead.or(base.map(|b| b.overhead)).unwrap_or(0),
        })
    }
}

/// Splits `12.5mbit` into (`12.5`, `mbit`).
fn split_unit(t: &str) -> (&str, &str) {
    let i = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    (&t[..i], &t[i..])
}

fn parse_number(num: &str, item: &str) -> Result<f64, LinkSpecError> {
    let x: f64 = num
        .replace('_', "")
        .parse()
        .map_err(|_| LinkSpecError::BadNumber {
            item: item.trim().into(),
        })?;
    if !x.is_finite() || x < 0.0 {
        return Err(LinkSpecError::BadNumber {
            item: item.trim().into(),
        });
    }
    Ok(x)
}

/// Parses `50us`, `1.5ms`, `2s`, `100ns` (a unit is required).
fn parse_duration(s: &str, item: &str) -> Result<Duration, LinkSpecError> {
    let (num, unit) = split_unit(s);
    let ns_per = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => {
            return Err(LinkSpecError::BadItem {
                item: item.trim().into(),
            })
        }
    };
    let ns = parse_number(num, item)? * ns_per;
    if ns > 1e15 {
        return Err(LinkSpecError::BadNumber {
            item: item.trim().into(),
        });
    }
    Ok(Duration::from_nanos(ns.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bw(s: &str) -> u64 {
        s.parse::<Bandwidth>().unwrap().bits_per_sec()
    }

    #[test]
    fn parses_units() {
        assert_eq!(bw("100mbit"), 100_000_000);
        assert_eq!(bw("1gbit"), 1_000_000_000);
        assert_eq!(bw("10Gbit"), 10_000_000_000);
        assert_eq!(bw("2.5gbit"), 2_500_000_000);
        assert_eq!(bw("64kbit"), 64_000);
        assert_eq!(bw("9600bit"), 9600);
        let s: LinkSpec = "1gbit,50us,jitter=10us".parse().unwrap();
        assert_eq!(s.latency, Duration::from_micros(50));
        assert_eq!(s.jitter, Duration::from_micros(10));
        let s: LinkSpec = " 50us , 1gbit ".parse().unwrap();
        assert_eq!(s.bandwidth.bits_per_sec(), 1_000_000_000);
        let s: LinkSpec = "100mbit".parse().unwrap();
        assert_eq!(s.latency, Duration::ZERO);
        let s: LinkSpec = "1gbit,1.5ms,overhead=64".parse().unwrap();
        assert_eq!((s.latency, s.overhead), (Duration::from_micros(1500), 64));
        // 1 MB at 8 Mbit/s is one second; 64 bytes of overhead are charged too.
        let s: LinkSpec = "8mbit,overhead=64".parse().unwrap();
        assert_eq!(s.wire_ns(1_000_000 - 64), 1_000_000_000);
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "1gbit,50us,jitter=10us",
            "100mbit",
            "12.5mbit,1ms,overhead=40",
        ] {
            let a: LinkSpec = s.parse().unwrap();
            let b: LinkSpec = a.to_string().parse().unwrap();
            assert_eq!(a, b, "{s} -> {a}");
        }
    }

    #[test]
    fn refuses_with_clear_errors() {
        let e = |s: &str| s.parse::<LinkConfig>().unwrap_err();
        assert_eq!(e("50us"), LinkSpecError::MissingBandwidth);
        assert_eq!(e(""), LinkSpecError::MissingBandwidth);
        assert!(matches!(e("1gbit,50"), LinkSpecError::BadItem { .. }));
        assert!(matches!(e("1gbits"), LinkSpecError::BadItem { .. }));
        assert!(matches!(e("0mbit"), LinkSpecError::ZeroBandwidth { .. }));
        assert!(matches!(e("-1mbit"), LinkSpecError::BadItem { .. }));
        assert!(matches!(e("100mbps"), LinkSpecError::ByteRate { .. }));
        assert!(matches!(e("1gbit,2gbit"), LinkSpecError::Duplicate { .. }));
        assert!(matches!(
            e("1gbit,1ms,2ms"),
            LinkSpecError::Duplicate { .. }
        ));
        assert!(matches!(e("1gbit,foo=1"), LinkSpecError::BadItem { .. }));
        assert!(matches!(
            e("1gbit;3=1mbit"),
            LinkSpecError::BadOverride { .. }
        ));
        assert!(matches!(
            e("1gbit;rankx=1mbit"),
            LinkSpecError::BadOverride { .. }
        ));
        assert_eq!(e("1gbit;rank1=1mbit,seed=3"), LinkSpecError::SeedInOverride);
        assert!(matches!(
            e("1gbit;rank1=1mbit;rank1=2mbit"),
            LinkSpecError::Duplicate { .. }
        ));
        // Messages say what was wrong and what to write instead.
        assert!(e("1gbit,50").to_string().contains("`50`"));
    }

    #[test]
    fn per_rank_overrides_make_a_slow_rank() {
        let c: LinkConfig = "1gbit,50us,seed=7;rank3=100mbit".parse().unwrap();
        assert_eq!(c.seed, 7);
        let slow = c.interface(3);
        assert_eq!(slow.bandwidth.bits_per_sec(), 100_000_000);
        assert_eq!(slow.latency, Duration::from_micros(50), "latency inherited");
        assert_eq!(c.link(0, 3), c.link(3, 0));
        assert_eq!(c.link(0, 3).bandwidth.bits_per_sec(), 100_000_000);
        assert_eq!(c.link(0, 1).bandwidth.bits_per_sec(), 1_000_000_000);
        let c: LinkConfig = "1gbit;rank0=2ms".parse().unwrap();
        assert_eq!(c.link(1, 0).latency, Duration::from_millis(2));
        assert_eq!(c.link(1, 2).latency, Duration::ZERO);
    }
}
