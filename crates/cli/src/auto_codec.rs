//! `--codec auto`: a codec per tensor, or none, chosen before training to minimise the
//! predicted time of that tensor's synchronization, by the cost model of `gradwire-sim`.
//!
//! For every gradient tensor and every candidate codec the engine's own plan gives the
//! strategy it would use (stripe, gather, sparse, dense); the cost model then predicts the
//! tensor's encode, wire and decode time over the job's link (`--link`, or this machine's
//! loopback) at the job's world size. The cheapest candidate wins, dense on ties. The
//! choice becomes one exact-name engine rule per tensor (after any `--rule` the user gave),
//! and run.json records every tensor's predicted times under `codec_choice`.
//!
//! Every rank must choose the same, so nothing is timed here: the codec costs are constants
//! measured on this project's 2-core machine (`gradwire simulate --model mlp:hidden=1024x2
//! --workers 4 --link 1gbit --codec C --json F`, `inputs.codecs`), and the loopback network
//! is the one `gradwire simulate --calibrate` measured there. On other machines the choice
//! is a prediction from these figures, not a measurement.
//!
//! The candidates are the codecs whose accuracy the reports show within the time-to-accuracy
//! margin of dense (0.5 points, the reports' default target) in paper mode, under the job's
//! optimizer ([`default_candidates`]): `none`, `fp16` and `qsgd:bits=4` always, and `onebit`
//! (1-bit SGD on the stripes) where no momentum is applied after aggregation. That is under
//! AdaGrad, Seide et al.'s optimizer (-0.13 points on LeNet, the wide MLP's target reached in
//! 3 seeds of 3), and under plain SGD (+0.11 points on LeNet, the wide MLP's target reached in
//! 3 of 3): `docs/results/fidelity/lenet-fashion-mnist/{adagrad,plain-sgd}`,
//! `docs/results/time-to-accuracy`.
//! Under SGD with momentum after aggregation 1-bit SGD diverged on the wide MLP (17%), so it
//! is not a candidate there. TernGrad (-0.80 on LeNet) is not one either: on the wide MLP it
//! ended under that target (82.9% against 83.47%) while QSGD reached it, so `auto` picking it
//! missed the target outright (`docs/results/time-to-accuracy`). `--auto-codecs` may
//! name it and the others in [`KNOWN`]. DGC is not a candidate: it owns the momentum (DGC's
//! momentum correction), so mixed with codecs whose momentum the optimizer applies after
//! aggregation, some tensors would get momentum twice.

use anyhow::{bail, Context, Result};
use gradwire_codec::CodecConfig;
use gradwire_engine::{EngineConfig, Rule, Selector, Strategy, TensorSpec};
use gradwire_sim::{step, CodecProfile, ModelProfile, Network, Scenario};
use gradwire_train::optim::{OptimizerConfig, OptimizerKind};
use gradwire_transport::link::LinkConfig;
use serde::Serialize;

/// `--codec`: a codec spec, or `auto`.
#[derive(Debug, Clone, PartialEq)]
pub enum CodecArg {
    /// Choose per tensor ([`choose`]).
    Auto,
    /// This codec for every tensor no rule matches.
    Codec(CodecConfig),
}

impl std::str::FromStr for CodecArg {
    type Err = gradwire_codec::ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("auto") {
            Ok(CodecArg::Auto)
        } else {
            s.parse().map(CodecArg::Codec)
        }
    }
}

/// The default candidates under SGD with momentum applied after aggregation, or Adam:
/// accurate within 0.5 points of dense in paper mode.
pub const DEFAULT_CANDIDATES: &str = "none,fp16,qsgd:bits=4";

/// The default candidates where no momentum is applied after aggregation (AdaGrad, plain
/// SGD): 1-bit SGD trains there as its paper trains it.
pub const DEFAULT_CANDIDATES_NO_MOMENTUM: &str = "none,fp16,qsgd:bits=4,onebit";

/// The default candidates for a job under `optimizer`. (`--momentum-correction on`, under
/// which the codecs would compress the velocity, is refused with `--codec auto`.)
pub fn default_candidates(optimizer: &OptimizerConfig) -> &'static str {
    let no_momentum = match optimizer.kind {
        OptimizerKind::Adagrad { .. } => true,
        OptimizerKind::Sgd { momentum, .. } => momentum == 0.0,
        OptimizerKind::Adam { .. } => false,
    };
    if no_momentum {
        DEFAULT_CANDIDATES_NO_MOMENTUM
    } else {
        DEFAULT_CANDIDATES
    }
}

/// A candidate's measured costs: (spec, encode s per element, decode s per element, wire
/// bytes per element of one rank's contribution).
///
/// `qsgd:bits=4` is measured where `auto` runs, four ranks sharing this machine's two cores
/// (measured 2026-12-02): the idle wide-MLP run over loopback (report committed at `1586056`,
/// `mlp:hidden=1024x2`, 1,863,690 elements, 500 steps) spent 16.0 s in QSGD's
/// synchronization, of which about 1.3 s moves its 1.4 MB per step at dense's measured
/// loopback rate (9.8 s for 11.2 MB per step): 14.7 s / 500 / 1,863,690 = 1.58e-8 s per
/// element for encoding and decoding on the stripe route, `e (1 + 1/P) + 2 d` at P = 4, split
/// in the ratio of the single-process `bench codecs` throughputs (encode 3.25, decode 6.76
/// GB/s). The single-process figures alone (1.9e-9 and 1.05e-9) made QSGD win on
/// loopback, where it ran at 0.53x of dense's speed; the loaded figures before (4.9e-8 and
/// 6.3e-9) made dense win at 1 Gbit/s, where QSGD ran at 1.63x of dense's speed.
///
/// `onebit` is measured against QSGD in the same way and the same runs (`470012b`, 2026-12-02,
/// idle, loopback, the same model, seeds 1 and 2, epochs 2 to 10): its synchronization less the
/// wire took 1.01 times QSGD's per element (7.76e-9 and 8.53e-9 s against 8.13e-9 and
/// 7.97e-9; both codecs got faster since the run above, dense with them), so its total on the
/// stripe route is set to 1.01 x the 1.59e-8 of QSGD's constants, split in the ratio of its
/// `bench codecs` throughputs on this tensor size (encode 9.44, decode 18.10 GB/s). Over
/// 1 Gbit/s the same comparison gives 1.5 times QSGD's (reports committed at `c3857e8`);
/// `auto` keeps the loopback ratio, measured as QSGD's was. The other rows are
/// single-process figures measured on the loaded machine (2026-12-01).
pub const KNOWN: [(&str, f64, f64, f64); 6] = [
    ("none", 0.0, 0.0, 4.0),
    ("fp16", 6.4e-9, 1.9e-8, 2.0),
    ("qsgd:bits=4", QSGD_ENCODE_S, QSGD_DECODE_S, 0.508),
    ("terngrad", 2.1e-8, 6.8e-9, 0.271),
    ("onebit", ONEBIT_ENCODE_S, ONEBIT_DECODE_S, 0.139),
    ("topk:ratio=0.01", 1.26e-8, 5.1e-10, 0.080),
];

/// QSGD 4-bit's encode seconds per element with four ranks on two cores (see [`KNOWN`]).
const QSGD_ENCODE_S: f64 = 7.2e-9;
/// QSGD 4-bit's decode seconds per element with four ranks on two cores (see [`KNOWN`]).
const QSGD_DECODE_S: f64 = 3.45e-9;

/// 1-bit SGD's encode seconds per element with four ranks on two cores (see [`KNOWN`]):
/// `e = 1.92 d` (the bench throughputs), `1.25 e + 2 d = 1.01 x 1.59e-8`.
const ONEBIT_ENCODE_S: f64 = 7.0e-9;
/// 1-bit SGD's decode seconds per element with four ranks on two cores (see [`KNOWN`]).
const ONEBIT_DECODE_S: f64 = 3.65e-9;

/// Loopback without emulation, as `gradwire simulate --calibrate` measured it here: seconds
/// per message.
pub const LOOPBACK_ALPHA_S: f64 = 4.4e-6;
/// Seconds per byte of software copies (about 1 GB/s), added to any link's wire time.
pub const SOFTWARE_BETA_S: f64 = 1.0e-9;
/// Seconds per byte reduced.
pub const GAMMA_S: f64 = 1.0e-9;

/// One tensor's choice and the predictions behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TensorChoice {
    /// The tensor's name.
    pub tensor: String,
    /// Its elements.
    pub elements: usize,
    /// The chosen codec spec (`none`: dense).
    pub codec: String,
    /// Every candidate's strategy and predicted milliseconds for this tensor.
    pub predicted_ms: Vec<(String, String, f64)>,
}

/// What `--codec auto` chose for a job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Choice {
    /// The link the prediction assumed (`loopback` without emulation).
    pub link: String,
    /// World size of the prediction.
    pub workers: usize,
    /// The candidates weighed, as given or as [`default_candidates`] gave them.
    pub candidates: Vec<String>,
    /// Per tensor, in the model's order.
    pub tensors: Vec<TensorChoice>,
}

impl Choice {
    /// One exact-name engine rule per tensor.
    pub fn rules(&self) -> Result<Vec<Rule>> {
        self.tensors
            .iter()
            .map(|t| {
                Ok(Rule {
                    select: Selector::Name(t.tensor.clone()),
                    codec: t
                        .codec
                        .parse()
                        .with_context(|| format!("codec {}", t.codec))?,
                    strategy: Strategy::Auto,
                })
            })
            .collect()
    }

    /// "fc1.weight: qsgd:bits=4, fc1.bias: none, ...", for the log.
    pub fn summary(&self) -> String {
        self.tensors
            .iter()
            .map(|t| format!("{}: {}", t.tensor, t.codec))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Parses a candidate list (comma-separated specs from [`KNOWN`]).
pub fn candidates(list: &str) -> Result<Vec<(CodecConfig, CodecProfile)>> {
    let mut out = Vec::new();
    for spec in crate::report::split_codecs(list) {
        let codec: CodecConfig = spec
            .parse()
            .with_context(|| format!("--auto-codecs: `{spec}`"))?;
        let canonical = codec.to_string();
        let Some(&(_, enc, dec, wire)) = KNOWN.iter().find(|k| {
            k.0.parse::<CodecConfig>()
                .is_ok_and(|c| c.to_string() == canonical)
        }) else {
            if matches!(codec, CodecConfig::Dgc(_)) {
                bail!(
                    "--auto-codecs: dgc cannot be mixed per tensor: it owns the momentum, so \
                     tensors under other codecs would get momentum twice"
                );
            }
            bail!(
                "--auto-codecs: no measured costs for `{spec}`; known: {}",
                KNOWN.map(|k| k.0).join(", ")
            );
        };
        out.push((
            codec,
            CodecProfile {
                spec,
                strategy: Strategy::Auto,
                encode_s_per_elem: enc,
                decode_s_per_elem: dec,
                wire_bytes_per_elem: wire,
            },
        ));
    }
    if out.is_empty() {
        bail!("--auto-codecs is empty");
    }
    Ok(out)
}

/// The network the prediction assumes: the link's bandwidth and latency plus the software's
/// per-byte and per-message costs, or this machine's loopback.
pub fn network(link: Option<&LinkConfig>) -> Result<Network> {
    let net = match link {
        // The slowest interface bounds a ring or exchange that passes through it.
        Some(cfg) => {
            let slowest = cfg
                .ranks
                .values()
                .copied()
                .fold(cfg.default, |a, b| a.between(&b));
            let wire = Network::from_link(&slowest, LOOPBACK_ALPHA_S, GAMMA_S)?;
            Network::new(wire.alpha, wire.beta + SOFTWARE_BETA_S, GAMMA_S)?
        }
        None => Network::new(LOOPBACK_ALPHA_S, SOFTWARE_BETA_S, GAMMA_S)?,
    };
    Ok(net)
}

/// Chooses a codec per tensor for `workers` ranks over `link`.
pub fn choose(
    tensors: &[TensorSpec],
    workers: usize,
    link: Option<&LinkConfig>,
    fusion_bytes: usize,
    candidates: &[(CodecConfig, CodecProfile)],
) -> Result<Choice> {
    let net = network(link)?;
    let scenario = Scenario {
        workers,
        network: net,
        overlap: 0.0,
        fusion_bytes,
        host: None,
    };
    // The same without per-message costs, to split a prediction into its alpha part and
    // the rest.
    let no_alpha = Scenario {
        network: Network::new(0.0, net.beta, net.gamma)?,
        ..scenario
    };
    let mut out = Vec::with_capacity(tensors.len());
    for t in tensors {
        let elements: usize = t.shape.iter().product();
        let model = ModelProfile {
            name: t.name.clone(),
            tensors: vec![elements],
            compute_s: 0.0,
        };
        let mut best: Option<(f64, String)> = None;
        let mut predicted = Vec::with_capacity(candidates.len());
        for (codec, profile) in candidates {
            // The strategy the engine itself resolves for this codec on this tensor.
            let policy = EngineConfig {
                codec: codec.clone(),
                strategy: Strategy::Auto,
                ..EngineConfig::default()
            }
            .plan(std::slice::from_ref(t))
            .map_err(|e| anyhow::anyhow!("planning {codec} for {}: {e}", t.name))?;
            let strategy = policy[0].strategy;
            let mut p = profile.clone();
            p.strategy = strategy;
            if strategy == Strategy::Dense {
                // The engine sends this tensor dense whatever the codec (e.g. a 1-D
                // tensor): full f32 on the wire, no codec work.
                p = CodecProfile::dense();
            }
            let predict = |sc: &Scenario| {
                step(&model, &p, sc)
                    .map(|s| s.step_s)
                    .map_err(|e| anyhow::anyhow!("predicting {codec} for {}: {e}", t.name))
            };
            let (full, rest) = (predict(&scenario)?, predict(&no_alpha)?);
            // The engine fuses tensors of one policy into buffers of `fusion_bytes`, so a
            // small tensor pays its share of a fused message's per-message costs.
            let share = if fusion_bytes == 0 {
                1.0
            } else {
                (4.0 * elements as f64 / fusion_bytes as f64).min(1.0)
            };
            let s = rest + share * (full - rest);
            predicted.push((profile.spec.clone(), strategy.to_string(), s * 1e3));
            if best.as_ref().is_none_or(|(b, _)| s < *b) {
                best = Some((s, profile.spec.clone()));
            }
        }
        out.push(TensorChoice {
            tensor: t.name.clone(),
            elements,
            codec: best.map_or_else(|| "none".into(), |b| b.1),
            predicted_ms: predicted,
        });
    }
    Ok(Choice {
        link: match link {
            Some(cfg) => cfg.default.to_string(),
            None => "loopback".into(),
        },
        workers,
        candidates: candidates.iter().map(|(_, p)| p.spec.clone()).collect(),
        tensors: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lenet_like() -> Vec<TensorSpec> {
        vec![
            TensorSpec::new("conv1.weight", [6, 1, 5, 5]),
            TensorSpec::new("conv1.bias", [6]),
            TensorSpec::new("fc1.weight", [400, 120]),
            TensorSpec::new("fc1.bias", [120]),
            TensorSpec::new("big.weight", [2048, 2048]),
        ]
    }

    /// The stripe exchange of `n` elements at `p` ranks, written out independently of the
    /// cost model, in milliseconds: `2 (p-1) (alpha + n w beta / p)` on the wire for `w`
    /// bytes per element, encode `e n (1 + 1/p)` and decode `2 d n`.
    fn stripe_ms(net: &Network, p: f64, n: f64, w: f64, e: f64, d: f64) -> f64 {
        let wire = 2.0 * (p - 1.0) * (net.alpha + n * w * net.beta / p);
        (wire + e * n * (1.0 + 1.0 / p) + 2.0 * d * n) * 1e3
    }

    /// Over 10 Gbit/s and on loopback, at 4 ranks, every tensor stays dense.
    fn fast_links_stay_dense(cands: &[(CodecConfig, CodecProfile)]) {
        let ten: LinkConfig = "10gbit".parse().unwrap();
        for link in [Some(&ten), None] {
            let c = choose(&lenet_like(), 4, link, 4 << 20, cands).unwrap();
            assert!(
                c.tensors.iter().all(|t| t.codec == "none"),
                "{link:?}: {c:?}"
            );
        }
    }

    fn pick(c: &Choice, name: &str) -> String {
        c.tensors
            .iter()
            .find(|t| t.tensor == name)
            .unwrap()
            .codec
            .clone()
    }

    #[test]
    fn a_slow_link_compresses_big_tensors_and_one_rank_compresses_nothing() {
        let cands = candidates(DEFAULT_CANDIDATES).unwrap();
        let slow: LinkConfig = "100mbit".parse().unwrap();
        let c = choose(&lenet_like(), 4, Some(&slow), 4 << 20, &cands).unwrap();
        // 16 MiB over 100 Mbit/s: 2 s dense, about 7x less with 4-bit QSGD.
        assert_eq!(pick(&c, "big.weight"), "qsgd:bits=4", "{c:?}");
        // Over 1 Gbit/s dense still pays about 0.2 s for it, QSGD under 0.1 s.
        let gbit: LinkConfig = "1gbit".parse().unwrap();
        let mid = choose(&lenet_like(), 4, Some(&gbit), 4 << 20, &cands).unwrap();
        assert_eq!(pick(&mid, "big.weight"), "qsgd:bits=4", "{mid:?}");
        // Over 10 Gbit/s and loopback four ranks on two cores encode slower than the link
        // moves the bytes QSGD saves: all dense.
        fast_links_stay_dense(&cands);
        let alone = choose(&lenet_like(), 1, Some(&slow), 4 << 20, &cands).unwrap();
        assert!(
            alone.tensors.iter().all(|t| t.codec == "none"),
            "one rank has no wire to save: {alone:?}"
        );
        // Every candidate's prediction is recorded.
        assert!(c
            .tensors
            .iter()
            .all(|t| t.predicted_ms.len() == cands.len()));
    }

    #[test]
    fn the_choice_minimises_an_independent_alpha_beta_sum() {
        // Reference, written out: stripe exchange of a tensor of n elements at P ranks with w
        // bytes per element costs 2 (P-1) (alpha + n w beta / P) on the wire, plus encode
        // e n (1 + 1/P) and decode 2 d n; dense (the canonical all-reduce) costs more than
        // 2 (P-1)/P n 4 beta. Over 10 Mbit/s a 4M-element tensor is decided by the wire.
        let cands = candidates("none,qsgd:bits=4").unwrap();
        let link: LinkConfig = "10mbit".parse().unwrap();
        let t = [TensorSpec::new("w", [2048, 2048])];
        // Fusion off: each tensor pays its own per-message costs, as in the formula.
        let c = choose(&t, 4, Some(&link), 0, &cands).unwrap();
        let net = network(Some(&link)).unwrap();
        let (p, n) = (4.0, 4_194_304.0);
        let qsgd_ms = stripe_ms(&net, p, n, 0.508, 7.2e-9, 3.45e-9);
        let got = &c.tensors[0].predicted_ms;
        assert_eq!(got[1].1, "stripe", "{got:?}");
        assert!(
            (got[1].2 - qsgd_ms).abs() / qsgd_ms < 1e-9,
            "{got:?} vs {qsgd_ms}"
        );
        let dense_lower = 2.0 * (p - 1.0) / p * n * 4.0 * net.beta * 1e3;
        assert!(got[0].2 >= dense_lower, "{got:?} vs {dense_lower}");
        assert_eq!(c.tensors[0].codec, "qsgd:bits=4");
    }

    #[test]
    fn one_bit_sgd_is_a_default_candidate_only_without_momentum_after_aggregation() {
        let opt = |spec: &str| spec.parse::<OptimizerConfig>().unwrap();
        for (spec, want) in [
            ("sgd:lr=0.05,momentum=0.9", DEFAULT_CANDIDATES),
            ("sgd:lr=0.05,momentum=0.9,nesterov", DEFAULT_CANDIDATES),
            ("adam:lr=0.001", DEFAULT_CANDIDATES),
            ("adagrad:lr=0.01", DEFAULT_CANDIDATES_NO_MOMENTUM),
            ("sgd:lr=0.05", DEFAULT_CANDIDATES_NO_MOMENTUM),
        ] {
            assert_eq!(default_candidates(&opt(spec)), want, "{spec}");
        }
        assert!(DEFAULT_CANDIDATES_NO_MOMENTUM.ends_with(",onebit"));
        assert!(!DEFAULT_CANDIDATES.contains("onebit"));
        // Every default list parses against the measured costs.
        assert_eq!(candidates(DEFAULT_CANDIDATES_NO_MOMENTUM).unwrap().len(), 4);
    }

    #[test]
    fn one_bit_sgd_wins_where_the_wire_counts_and_loses_where_it_does_not() {
        let cands = candidates(DEFAULT_CANDIDATES_NO_MOMENTUM).unwrap();
        // Over 1 Gbit/s and 100 Mbit/s the big matrix goes 1-bit: about QSGD's codec cost
        // per element, a quarter of its bytes.
        for link in ["1gbit", "100mbit"] {
            let l: LinkConfig = link.parse().unwrap();
            let c = choose(&lenet_like(), 4, Some(&l), 4 << 20, &cands).unwrap();
            assert_eq!(pick(&c, "big.weight"), "onebit", "{link}: {c:?}");
        }
        // Over 10 Gbit/s and on loopback the codec work costs more than the bytes it saves.
        fast_links_stay_dense(&cands);
        // Written out for the big matrix on the stripe route, fusion off.
        let l: LinkConfig = "10mbit".parse().unwrap();
        let t = [TensorSpec::new("w", [2048, 2048])];
        let c = choose(&t, 4, Some(&l), 0, &cands).unwrap();
        let net = network(Some(&l)).unwrap();
        let want_ms = stripe_ms(&net, 4.0, 4_194_304.0, 0.139, 7.0e-9, 3.65e-9);
        let got = &c.tensors[0].predicted_ms[3];
        assert_eq!((got.0.as_str(), got.1.as_str()), ("onebit", "stripe"));
        assert!(
            (got.2 - want_ms).abs() / want_ms < 1e-9,
            "{got:?} vs {want_ms}"
        );
    }

    #[test]
    fn candidates_are_checked_by_name() {
        assert!(candidates("none,fp16").is_ok());
        let e = candidates("dgc:ratio=0.001").unwrap_err().to_string();
        assert!(e.contains("momentum"), "{e}");
        let e = candidates("qsgd:bits=2").unwrap_err().to_string();
        assert!(e.contains("no measured costs"), "{e}");
        assert!(candidates("").is_err());
    }

    #[test]
    fn the_rules_name_each_tensor_exactly() {
        let cands = candidates(DEFAULT_CANDIDATES).unwrap();
        let link: LinkConfig = "100mbit".parse().unwrap();
        let c = choose(&lenet_like(), 4, Some(&link), 4 << 20, &cands).unwrap();
        let rules = c.rules().unwrap();
        assert_eq!(rules.len(), 5);
        let want: CodecConfig = pick(&c, "big.weight").parse().unwrap();
        assert_eq!(rules[4].to_string(), format!("name=big.weight=>{want}"));
    }
}
