//! [`EngineConfig`]: the per-tensor policy (codec, strategy), momentum correction, fusion,
//! cycle time, stall inspector and collective settings, validated into one [`Policy`] per
//! tensor by [`EngineConfig::plan`] before any thread starts.
//!
//! Rules are tried in order; the first whose [`Selector`] matches a tensor gives its codec
//! (and strategy); tensors no rule matches take [`EngineConfig::codec`] and
//! [`EngineConfig::strategy`]. A rule is written `SELECTOR=>CODEC[@STRATEGY]`:
//!
//! | selector | matches |
//! |---|---|
//! | `name=fc1.weight` | exactly that tensor (an error if no tensor has that name) |
//! | `name=*.bias` | names matching the glob (`*` is any run of characters) |
//! | `min=100000` | tensors of at least that many elements |
//! | `max=1024` | tensors of fewer than that many elements |
//! | `dims=1` | tensors with that many dimensions (`dims=1`: biases, norms) |
//!
//! e.g. `dims=1=>none` (1-D tensors dense), `min=65536=>dgc:ratio=0.001@sparse`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use gradwire_codec::{CodecConfig, CodecId, TensorInfo, TensorRole};
use gradwire_collective::CollectiveConfig;

use crate::error::{Error, Result};

/// Which all-reduce carries a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// Chosen from the codec: `none` (without error feedback) → `Dense`; top-k, DGC,
    /// threshold, random-k → `Sparse`; onebit, adaptive, qsgd, fp16, bf16 → `Stripe`;
    /// powersgd (`variant=paper`) → `PowerSgd`; every other codec (terngrad, signsgd,
    /// powersgd `variant=local`, `none` with error feedback) → `Gather`.
    #[default]
    Auto,
    /// Uncompressed fp32 mean (codec must be `none`), see [`DenseAlgorithm`].
    Dense,
    /// Encode per tensor, all-gather the payloads, decode each rank's (`GatherDecode`).
    Gather,
    /// Dryden's quantized ring reduce-scatter + all-gather (`QuantizedAllReduce`; `P`
    /// quantizations in series). Only when asked for explicitly.
    Quantized,
    /// Sparse all-reduce of (index, value) pairs (`SparseAllReduce`).
    Sparse,
    /// CNTK's 1-bit SGD stripes / Dryden's direct exchange (`StripeAllReduce`): each rank
    /// quantizes its slice for each owner once, owners sum and re-quantize once, all-gather.
    /// About `2 (P-1)/P` compressed gradients per rank instead of gather's `P-1`. For dense
    /// quantizing codecs (onebit, adaptive, qsgd, terngrad, signsgd, fp16, bf16).
    Stripe,
    /// PowerSGD as published (`PowerSgdAllReduce`: all-reduces of `P` and `Q`); the
    /// `powersgd` codec with `variant=paper` only.
    PowerSgd,
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::Auto => "auto",
            Strategy::Dense => "dense",
            Strategy::Gather => "gather",
            Strategy::Quantized => "quantized",
            Strategy::Sparse => "sparse",
            Strategy::Stripe => "stripe",
            Strategy::PowerSgd => "powersgd",
        })
    }
}

impl FromStr for Strategy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Strategy::Auto),
            "dense" => Ok(Strategy::Dense),
            "gather" => Ok(Strategy::Gather),
            "quantized" => Ok(Strategy::Quantized),
            "sparse" => Ok(Strategy::Sparse),
            "stripe" => Ok(Strategy::Stripe),
            "powersgd" => Ok(Strategy::PowerSgd),
            other => Err(Error::InvalidSetting {
                field: "strategy",
                reason: format!(
                    "unknown strategy '{other}' (auto, dense, gather, quantized, sparse, \
                     stripe, powersgd)"
                ),
            }),
        }
    }
}

impl Strategy {
    /// What `Auto` resolves to for `codec` (other strategies are returned unchanged).
    pub fn resolve(self, codec: &CodecConfig) -> Strategy {
        match self {
            Strategy::Auto => match codec.id() {
                CodecId::None if !has_feedback(codec) => Strategy::Dense,
                CodecId::TopK | CodecId::Dgc | CodecId::Threshold | CodecId::RandomK => {
                    Strategy::Sparse
                }
                id if stripes(id) && !matches!(id, CodecId::TernGrad | CodecId::SignSgd) => {
                    Strategy::Stripe
                }
                CodecId::PowerSgd if is_paper_powersgd(codec) => Strategy::PowerSgd,
                _ => Strategy::Gather,
            },
            s => s,
        }
    }
}

fn has_feedback(codec: &CodecConfig) -> bool {
    matches!(codec, CodecConfig::None(c) if c.ef)
}

/// The dense quantizing codecs the stripe all-reduce carries.
fn stripes(id: CodecId) -> bool {
    matches!(
        id,
        CodecId::OneBit
            | CodecId::Adaptive
            | CodecId::Qsgd
            | CodecId::TernGrad
            | CodecId::SignSgd
            | CodecId::Fp16
            | CodecId::Bf16
    )
}

/// PowerSGD as published (`variant=paper`, the default), not the local gather variant.
fn is_paper_powersgd(codec: &CodecConfig) -> bool {
    matches!(codec, CodecConfig::PowerSgd(c) if !c.local)
}

/// How a `Dense` tensor (or a fused buffer of them) is summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DenseAlgorithm {
    /// An order fixed by the world alone (see `dense.rs`): on power-of-two worlds the
    /// hypercube tree of recursive halving (`(g0 + g2) + (g1 + g3)` on 4 ranks; the same bits
    /// as `Tree`, `2 log2 P` messages), on other worlds rank order `((g0 + g1) + g2) + ...`
    /// by pairwise exchange and the ring all-gather. Every element's rounding is independent
    /// of its position in the buffer, so fused and unfused results are bit-identical. Same
    /// bytes as the ring: `2 (P-1)/P` of the buffer. The registered dense batch is reduced
    /// in the negotiation round itself (the speculative round, `worker.rs`).
    #[default]
    Canonical,
    /// Always the collective layer's Rabenseifner all-reduce (recursive halving, then
    /// doubling; non-power-of-two worlds fold their extra ranks in first): `2 log2 P` steps
    /// instead of `2 (P-1)`, same bytes. Every element is summed along the same hypercube
    /// tree (`(g0 + g2) + (g1 + g3)` on 4 ranks) whatever its position, so fused and unfused
    /// results are bit-identical too, but they differ from a rank-order sum in the last bits.
    Tree,
    /// The collective layer's all-reduce with [`EngineConfig::collective`] (recursive
    /// doubling, Rabenseifner or ring by size). Faster for small worlds on latency-bound
    /// links, but fusion can change the last bits of a result (an element's summation order
    /// depends on its position in the ring's chunks).
    Collective,
}

/// Momentum correction (Lin et al., DGC, section 3.2) for every all-reduced tensor: each rank
/// keeps a velocity `u = beta u + g` per tensor and the engine reduces `u` (Nesterov:
/// `g + beta u`) instead of `g`; the optimizer must then step without momentum on the
/// gradient.
///
/// *Momentum factor masking* (`masking`, DGC section 3.2): after a sparsifying codec
/// ([`gradwire_codec::CodecId::sparsifies`]) encoded a tensor, `u = 0` wherever this rank
/// sent an entry, so that stale momentum does not push already-applied coordinates again.
/// "Sent" is read off the codec's own output: the indices of the (index, value) pairs under
/// [`Strategy::Sparse`], the entries this rank's payload decodes to non-zero under
/// [`Strategy::Gather`]. Under `Stripe` and `Quantized` the codec quantizes slices inside
/// the collective and nothing is masked (documented deviation). A codec that sends every
/// entry (`adaptive:ternary=true`) would be masked everywhere: `gradwire train` refuses it
/// with momentum correction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MomentumConfig {
    /// The momentum factor, in (0, 1).
    pub beta: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// Momentum factor masking for sparsifying codecs.
    pub masking: bool,
}

/// Which tensors a [`Rule`] applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Names matching a glob (`*` = any run of characters). Without `*` it is an exact
    /// name, and an error at build if no tensor has it.
    Name(String),
    /// Tensors of at least this many elements.
    MinElements(usize),
    /// Tensors of fewer than this many elements.
    MaxElements(usize),
    /// Tensors with exactly this many dimensions.
    Dims(usize),
}

impl Selector {
    /// Whether the selector picks `tensor`.
    pub fn matches(&self, tensor: &TensorSpec) -> bool {
        match self {
            Selector::Name(p) => glob_match(p, &tensor.name),
            Selector::MinElements(n) => tensor.len() >= *n,
            Selector::MaxElements(n) => tensor.len() < *n,
            Selector::Dims(d) => tensor.shape.len() == *d,
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Name(p) => write!(f, "name={p}"),
            Selector::MinElements(n) => write!(f, "min={n}"),
            Selector::MaxElements(n) => write!(f, "max={n}"),
            Selector::Dims(d) => write!(f, "dims={d}"),
        }
    }
}

/// `*`-glob matching (no other metacharacters).
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// A per-tensor policy rule: tensors its selector matches use its codec and strategy.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Which tensors.
    pub select: Selector,
    /// Their codec.
    pub codec: CodecConfig,
    /// Their strategy (`Auto`: from the codec).
    pub strategy: Strategy,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=>{}", self.select, self.codec)?;
        if self.strategy != Strategy::Auto {
            write!(f, "@{}", self.strategy)?;
        }
        Ok(())
    }
}

impl FromStr for Rule {
    type Err = Error;
    /// Parses `SELECTOR=>CODEC[@STRATEGY]` (see the module doc).
    fn from_str(s: &str) -> Result<Self> {
        let bad = |reason: String| Error::InvalidSetting {
            field: "rule",
            reason,
        };
        let (sel, rest) = s
            .split_once("=>")
            .ok_or_else(|| bad(format!("'{s}': expected SELECTOR=>CODEC[@STRATEGY]")))?;
        let (key, val) = sel
            .split_once('=')
            .ok_or_else(|| bad(format!("'{s}': selector needs key=value")))?;
        let num = |v: &str| {
            v.trim()
                .parse::<usize>()
                .map_err(|_| bad(format!("'{s}': '{v}' is not a count")))
        };
        let select = match key.trim() {
            "name" => Selector::Name(val.trim().to_string()),
            "min" => Selector::MinElements(num(val)?),
            "max" => Selector::MaxElements(num(val)?),
            "dims" => Selector::Dims(num(val)?),
            other => {
                return Err(bad(format!(
                    "'{s}': unknown selector '{other}' (name, min, max, dims)"
                )))
            }
        };
        let (codec, strategy) = match rest.rsplit_once('@') {
            Some((c, st)) => (c, st.parse()?),
            None => (rest, Strategy::Auto),
        };
        let codec = codec.trim().parse().map_err(|source| Error::CodecSpec {
            spec: codec.trim().to_string(),
            source,
        })?;
        Ok(Rule {
            select,
            codec,
            strategy,
        })
    }
}

/// A tensor the engine will reduce: its name (the same on every rank), shape and role.
///
/// Every codec the engine builds for it gets its shape and role
/// ([`BuildContext::with_tensors`](gradwire_codec::BuildContext::with_tensors)): column-wise
/// quantizers (onebit, adaptive) work per column, TernGrad keeps `Output` tensors in float,
/// DGC sends 1-D tensors dense, QSGD buckets inside the tensor, PowerSGD views it as
/// `[shape[0], rest]`. Shapes are burn's: a linear weight is `[in, out]`, a convolution
/// kernel `[c_out, c_in, kh, kw]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// The name every rank submits it under.
    pub name: String,
    /// Its shape (row-major; the product is its element count).
    pub shape: Vec<usize>,
    /// What it is (default from the shape: 1-D → `Bias`, else `Other`; see
    /// [`TensorSpec::with_role`]).
    pub role: TensorRole,
}

impl TensorSpec {
    /// A tensor of `shape`, its role inferred from the shape (1-D: `Bias`, else `Other`).
    pub fn new(name: impl Into<String>, shape: impl Into<Vec<usize>>) -> Self {
        let shape = shape.into();
        let role = if shape.len() == 1 {
            TensorRole::Bias
        } else {
            TensorRole::Other
        };
        TensorSpec {
            name: name.into(),
            shape,
            role,
        }
    }

    /// The same tensor playing `role` (e.g. `LinearWeight`, `ConvWeight`, `Output`).
    pub fn with_role(mut self, role: TensorRole) -> Self {
        self.role = role;
        self
    }

    /// Its shape and role, as the codecs see them.
    pub fn info(&self) -> TensorInfo {
        TensorInfo::new(self.shape.clone(), self.role)
    }

    /// Element count (the product of the shape; 1 for a scalar's empty shape).
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Settings of an [`Engine`](crate::Engine). Plain data; [`EngineConfig::plan`] validates it.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Codec of tensors no rule matches (default `none`).
    pub codec: CodecConfig,
    /// Strategy of tensors no rule matches (default `Auto`).
    pub strategy: Strategy,
    /// Per-tensor rules, first match wins.
    pub rules: Vec<Rule>,
    /// Momentum correction for every registered tensor (default off).
    pub momentum: Option<MomentumConfig>,
    /// Ready tensors of one policy are fused into buffers of at most this many raw fp32
    /// bytes (a bigger tensor travels alone); 0 turns fusion off. Default 4 MiB.
    pub fusion_bytes: usize,
    /// Negotiation cadence (default 1 ms): a rank with tensors pending joins a round at least
    /// this often; one with nothing pending sleeps until it submits, joining a round only for
    /// the stall inspector (every quarter of the stall deadline, 10 cycles .. 1 s). A burst of
    /// submissions starts its round when a thread waits on one of its handles, an eighth of a
    /// cycle (20..200 µs) after a flush, or else within ten cycles (once the queue has been
    /// quiet for an eighth of a cycle, or a cycle after the burst began).
    pub cycle_time: Duration,
    /// Warn (`tracing::warn!`, and a [`StallReport`](crate::StallReport)) when a tensor has
    /// been submitted by some ranks but not all for this long (default 60 s; `None`: off).
    pub stall_warning: Option<Duration>,
    /// Fail the whole engine with [`Error::Stalled`] after this long (default off).
    pub stall_abort: Option<Duration>,
    /// Algorithm and segment size of the dense collectives (default: auto, 256 KiB).
    pub collective: CollectiveConfig,
    /// How dense tensors are summed (default [`DenseAlgorithm::Canonical`]).
    pub dense: DenseAlgorithm,
    /// Seed of the codecs' RNGs (tensor `i` uses [`tensor_seed`]`(seed, i)`).
    pub seed: u64,
    /// Record timeline spans (default off: they accumulate in memory until written).
    pub timeline: bool,
    /// Where this rank runs (default `None`: every rank treated as on one flat network).
    /// With it, [`Engine::start`](crate::Engine::start) exchanges the ranks' hosts and, when
    /// the job spans several hosts with several ranks on one, reduces dense tensors
    /// hierarchically: shared memory within a host, one path between hosts.
    pub hosts: Option<HostConfig>,
}

/// Where a rank runs, for the hierarchical dense path (Horovod's hierarchical all-reduce).
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// This rank's host: ranks that give the same name share a host (a hostname, or a
    /// declared name, so that a test can place ranks on different hosts).
    pub host: String,
    /// How the ranks of one host reach each other.
    pub local: LocalLink,
}

/// The transport among the ranks of one host.
#[derive(Clone)]
pub enum LocalLink {
    /// Shared memory: the job's settings; the engine replaces rank, world size and job token
    /// by the host's (local rank = position among the host's ranks, job token +
    /// `/host:NAME/engine:N` for the process's `N`-th such engine). For ranks that are
    /// processes (a process's engines are numbered in start order).
    #[cfg(unix)]
    Shm(gradwire_transport::shm::ShmConfig),
    /// A transport among this host's ranks, already connected, its ranks numbered in the
    /// order of their job ranks; taken by the engine at start (so a config holding it starts
    /// one engine).
    Given(std::sync::Arc<std::sync::Mutex<Option<Box<dyn gradwire_transport::Transport>>>>),
}

impl LocalLink {
    /// [`LocalLink::Given`] of `t`.
    pub fn given<T: gradwire_transport::Transport + 'static>(t: T) -> LocalLink {
        LocalLink::Given(std::sync::Arc::new(std::sync::Mutex::new(Some(Box::new(
            t,
        )))))
    }
}

impl std::fmt::Debug for LocalLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            #[cfg(unix)]
            LocalLink::Shm(c) => f.debug_tuple("Shm").field(c).finish(),
            LocalLink::Given(_) => f.write_str("Given(..)"),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            codec: CodecConfig::None(Default::default()),
            strategy: Strategy::Auto,
            rules: Vec::new(),
            momentum: None,
            fusion_bytes: 4 << 20,
            cycle_time: Duration::from_millis(1),
            stall_warning: Some(Duration::from_secs(60)),
            stall_abort: None,
            collective: CollectiveConfig::default(),
            dense: DenseAlgorithm::Canonical,
            seed: 0,
            timeline: false,
            hosts: None,
        }
    }
}

/// The seed of registered tensor `index`'s codecs: `seed + index * 0x9E37_79B9_7F4A_7C15`
/// (wrapping). A quantized tensor's leg codecs further use
/// `tensor_seed ^ ((leg + 1) << 40) ^ (chunk << 20)` (leg 0 = reduce-scatter, 1 = all-gather).
/// Every codec context carries the tensor's shape and role
/// (`BuildContext::new(tensor_seed, rank, world, vec![len]).with_tensors(vec![spec.info()])`;
/// a quantized chunk: its rows when it holds whole rows, else its length only). `Stripe` and
/// `PowerSgd` tensors build `StripeAllReduce::new(codec, &ctx, len)` /
/// `PowerSgdAllReduce::new(cfg, &ctx, len)` from that same context (the stripe plan salts
/// its own seeds per stripe and leg).
pub fn tensor_seed(seed: u64, index: usize) -> u64 {
    seed.wrapping_add((index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// One registered tensor's resolved policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// The tensor.
    pub tensor: TensorSpec,
    /// Its codec (`none` for dense).
    pub codec: CodecConfig,
    /// Its strategy, never `Auto`.
    pub strategy: Strategy,
}

impl EngineConfig {
    /// Validates the settings and resolves every tensor's policy. Fails with a typed error
    /// for a duplicate tensor name, a rule naming an unknown tensor, an impossible
    /// codec/strategy pair, or an out-of-range setting.
    pub fn plan(&self, tensors: &[TensorSpec]) -> Result<Vec<Policy>> {
        if let Some(m) = &self.momentum {
            if !(m.beta > 0.0 && m.beta < 1.0) {
                return Err(Error::InvalidSetting {
                    field: "momentum",
                    reason: format!("beta {} is not in (0, 1)", m.beta),
                });
            }
        }
        if self.cycle_time > Duration::from_secs(10) {
            return Err(Error::InvalidSetting {
                field: "cycle_time",
                reason: format!("{:?} is longer than 10 s", self.cycle_time),
            });
        }
        if let (Some(w), Some(a)) = (self.stall_warning, self.stall_abort) {
            if a < w {
                return Err(Error::InvalidSetting {
                    field: "stall_abort",
                    reason: format!("{a:?} is shorter than the warning threshold {w:?}"),
                });
            }
        }
        if self.collective.segment_bytes < 8 {
            return Err(Error::InvalidSetting {
                field: "collective.segment_bytes",
                reason: format!("{} is below 8", self.collective.segment_bytes),
            });
        }
        let mut seen = std::collections::HashSet::new();
        for t in tensors {
            if !seen.insert(t.name.as_str()) {
                return Err(Error::DuplicateTensor {
                    tensor: t.name.clone(),
                });
            }
        }
        for rule in &self.rules {
            if let Selector::Name(n) = &rule.select {
                if !n.contains('*') && !seen.contains(n.as_str()) {
                    return Err(Error::UnknownTensorInRule {
                        rule: rule.to_string(),
                        tensor: n.clone(),
                    });
                }
            }
        }
        tensors
            .iter()
            .map(|t| {
                let (codec, strategy) = match self.rules.iter().find(|r| r.select.matches(t)) {
                    Some(r) => (r.codec.clone(), r.strategy),
                    None => (self.codec.clone(), self.strategy),
                };
                let strategy = strategy.resolve(&codec);
                check_pair(&t.name, &codec, strategy)?;
                Ok(Policy {
                    tensor: t.clone(),
                    codec,
                    strategy,
                })
            })
            .collect()
    }
}

/// Refuses the codec/strategy pairs that cannot run.
fn check_pair(tensor: &str, codec: &CodecConfig, strategy: Strategy) -> Result<()> {
    let why = match strategy {
        Strategy::Dense if codec.id() != CodecId::None || has_feedback(codec) => {
            Some("dense carries raw fp32; use codec 'none' (without ef) or another strategy")
        }
        Strategy::Sparse if !codec.sparsifies() => {
            Some("the sparse all-reduce needs a sparsifying codec (topk, dgc, threshold, randomk)")
        }
        Strategy::Quantized if codec.needs_shared_scalars() => {
            Some("codecs that agree on a shared scalar (terngrad) need the gather strategy")
        }
        Strategy::Stripe if !stripes(codec.id()) => Some(
            "the stripe all-reduce needs a dense quantizing codec (onebit, adaptive, qsgd, \
             terngrad, signsgd, fp16, bf16)",
        ),
        Strategy::PowerSgd if !is_paper_powersgd(codec) => Some(
            "the powersgd strategy needs the powersgd codec with variant=paper \
             (variant=local runs under gather)",
        ),
        _ => None,
    };
    match why {
        Some(why) => Err(Error::Incompatible {
            tensor: tensor.to_string(),
            codec: codec.to_string(),
            strategy: strategy.to_string(),
            why,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensors() -> Vec<TensorSpec> {
        vec![
            TensorSpec::new("conv1.weight", [6, 1, 5, 5]),
            TensorSpec::new("conv1.bias", [6]),
            TensorSpec::new("fc1.weight", [120, 400]),
        ]
    }

    #[test]
    fn globs() {
        assert!(glob_match("*.bias", "conv1.bias"));
        assert!(glob_match("conv*", "conv1.bias"));
        assert!(glob_match("c*1*s", "conv1.bias"));
        assert!(!glob_match("c*2*s", "conv1.bias"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("ab*ba", "aba"));
        assert!(glob_match("exact", "exact"));
    }

    #[test]
    fn rules_resolve_first_match() {
        let cfg = EngineConfig {
            codec: "topk:ratio=0.01".parse().unwrap(),
            rules: vec![
                "dims=1=>none".parse().unwrap(),
                "min=40000=>qsgd@gather".parse().unwrap(),
            ],
            ..Default::default()
        };
        let p = cfg.plan(&tensors()).unwrap();
        assert_eq!(p[0].strategy, Strategy::Sparse);
        assert_eq!(p[1].strategy, Strategy::Dense);
        assert_eq!(p[2].codec.name(), "qsgd");
        assert_eq!(p[2].strategy, Strategy::Gather);
        let r: Rule = "name=*.bias=>fp16@quantized".parse().unwrap();
        assert_eq!(r.to_string().parse::<Rule>().unwrap(), r);
    }

    #[test]
    fn build_errors_are_typed() {
        let unknown = EngineConfig {
            rules: vec!["name=fc9.weight=>none".parse().unwrap()],
            ..Default::default()
        };
        assert!(matches!(
            unknown.plan(&tensors()),
            Err(Error::UnknownTensorInRule { tensor, .. }) if tensor == "fc9.weight"
        ));
        for (codec, strategy) in [
            ("qsgd", Strategy::Sparse),
            ("terngrad", Strategy::Quantized),
            ("fp16", Strategy::Dense),
        ] {
            let cfg = EngineConfig {
                codec: codec.parse().unwrap(),
                strategy,
                ..Default::default()
            };
            assert!(
                matches!(cfg.plan(&tensors()), Err(Error::Incompatible { .. })),
                "{codec} under {strategy}"
            );
        }
        let mut dup = tensors();
        dup.push(dup[0].clone());
        assert!(matches!(
            EngineConfig::default().plan(&dup),
            Err(Error::DuplicateTensor { .. })
        ));
        assert!("min=x=>none".parse::<Rule>().is_err());
        assert!("dims=1=>nope".parse::<Rule>().is_err());
        assert!("dims=1=>none@fast".parse::<Rule>().is_err());
    }
}
