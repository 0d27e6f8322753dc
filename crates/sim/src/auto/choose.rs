//! The choice itself: per tensor, the candidate whose predicted synchronization is cheapest
//! ([`choose`]), over the network a link and a [`Calibration`] give ([`network`]).

use gradwire_engine::codec::CodecConfig;
use gradwire_engine::{EngineConfig, Rule, Selector, Strategy, TensorSpec};
use gradwire_transport::link::LinkConfig;
use serde::Serialize;

use super::{AutoError, Calibration};
use crate::{step, CodecProfile, ModelProfile, Network, Scenario};

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
    /// The candidates weighed, as given or as [`super::default_candidates`] gave them.
    pub candidates: Vec<String>,
    /// Per tensor, in the model's order.
    pub tensors: Vec<TensorChoice>,
}

impl Choice {
    /// One exact-name engine rule per tensor.
    pub fn rules(&self) -> Result<Vec<Rule>, AutoError> {
        self.tensors
            .iter()
            .map(|t| {
                Ok(Rule {
                    select: Selector::Name(t.tensor.clone()),
                    codec: t.codec.parse().map_err(|source| AutoError::Spec {
                        spec: t.codec.clone(),
                        source,
                    })?,
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

/// The network the prediction assumes: the link's bandwidth and latency plus the software's
/// per-byte and per-message costs of `calibration`, or its loopback without a link.
pub fn network(link: Option<&LinkConfig>, calibration: &Calibration) -> Result<Network, AutoError> {
    let (alpha, beta, gamma) = (
        calibration.loopback_alpha_s,
        calibration.software_beta_s,
        calibration.gamma_s,
    );
    let net = match link {
        // The slowest interface bounds a ring or exchange that passes through it.
        Some(cfg) => {
            let slowest = cfg
                .ranks
                .values()
                .copied()
                .fold(cfg.default, |a, b| a.between(&b));
            Network::from_link_with_stack(&slowest, alpha, beta, gamma)?
        }
        None => Network::new(alpha, beta, gamma)?,
    };
    Ok(net)
}

/// Chooses a codec per tensor for `workers` ranks over `link` (this machine's loopback
/// without one), the engine fusing tensors into buffers of `fusion_bytes`, from `candidates`
/// ([`super::candidates()`]) priced by `calibration`'s network.
pub fn choose(
    tensors: &[TensorSpec],
    workers: usize,
    link: Option<&LinkConfig>,
    fusion_bytes: usize,
    candidates: &[(CodecConfig, CodecProfile)],
    calibration: &Calibration,
) -> Result<Choice, AutoError> {
    let net = network(link, calibration)?;
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
            .map_err(|source| AutoError::Plan {
                codec: codec.to_string(),
                tensor: t.name.clone(),
                source: Box::new(source),
            })?;
            let strategy = policy.first().map_or(Strategy::Dense, |p| p.strategy);
            let mut p = profile.clone();
            p.strategy = strategy;
            if strategy == Strategy::Dense {
                // The engine sends this tensor dense whatever the codec (e.g. a 1-D
                // tensor): full f32 on the wire, no codec work.
                p = CodecProfile::dense();
            }
            let (full, rest) = (
                step(&model, &p, &scenario)?.step_s,
                step(&model, &p, &no_alpha)?.step_s,
            );
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
