//! The codecs `--codec auto` weighs: the default lists per optimizer, the codecs it knows
//! ([`KNOWN`], with their wire bytes), and a candidate list priced from a [`Calibration`].

use gradwire_engine::codec::CodecConfig;
use gradwire_engine::Strategy;

use super::{AutoError, Calibration};
use crate::CodecProfile;

/// The default candidates under SGD with momentum applied after aggregation, or Adam:
/// accurate within 0.5 points of dense in paper mode.
pub const DEFAULT_CANDIDATES: &str = "none,fp16,qsgd:bits=4";

/// The default candidates where no momentum is applied after aggregation (AdaGrad, plain
/// SGD): 1-bit SGD trains there as its paper trains it.
pub const DEFAULT_CANDIDATES_NO_MOMENTUM: &str = "none,fp16,qsgd:bits=4,onebit";

/// The default candidates for a job whose optimizer applies momentum after aggregation
/// (`momentum_after_aggregation`: SGD with momentum, Adam) or not (AdaGrad, plain SGD).
pub fn default_candidates(momentum_after_aggregation: bool) -> &'static str {
    if momentum_after_aggregation {
        DEFAULT_CANDIDATES
    } else {
        DEFAULT_CANDIDATES_NO_MOMENTUM
    }
}

/// The codecs `auto` may weigh and the bytes each puts on the wire per element of one rank's
/// contribution (a property of the codec, not of the machine: fp16 2 bytes, 4-bit QSGD half a
/// byte plus its bucket norms, TernGrad 2 bits plus its scalars, 1-bit SGD a bit plus its
/// column means, top-k 1% an 8-byte pair per kept element). Their encode and decode costs come
/// from a [`Calibration`]; `none` costs nothing.
pub const KNOWN: [(&str, f64); 6] = [
    ("none", 4.0),
    ("fp16", 2.0),
    ("qsgd:bits=4", 0.508),
    ("terngrad", 0.271),
    ("onebit", 0.139),
    ("topk:ratio=0.01", 0.080),
];

/// Splits a list of codec specs ([`gradwire_engine::codec::bench::split_specs`]: a `key=value`
/// piece without a `:` belongs to the spec before it, so `qsgd:bits=2,bucket=128,none` is two
/// specs).
pub use gradwire_engine::codec::bench::split_specs;

/// The canonical form of a spec (`CodecConfig`'s display), or `None` if it does not parse.
fn canonical(spec: &str) -> Option<String> {
    spec.parse::<CodecConfig>().ok().map(|c| c.to_string())
}

/// Parses a candidate list (comma-separated specs from [`KNOWN`]) and prices each from
/// `calibration` (`none` costs nothing; its strategy stays `auto` until [`super::choose()`]
/// resolves it per tensor).
pub fn candidates(
    list: &str,
    calibration: &Calibration,
) -> Result<Vec<(CodecConfig, CodecProfile)>, AutoError> {
    let mut out = Vec::new();
    for spec in split_specs(list) {
        let codec: CodecConfig = spec.parse().map_err(|source| AutoError::Spec {
            spec: spec.clone(),
            source,
        })?;
        let canon = codec.to_string();
        let Some(&(known, wire)) = KNOWN
            .iter()
            .find(|k| canonical(k.0).as_deref() == Some(canon.as_str()))
        else {
            if matches!(codec, CodecConfig::Dgc(_)) {
                return Err(AutoError::Dgc);
            }
            return Err(AutoError::Unknown { spec });
        };
        let (enc, dec) = if known == "none" {
            (0.0, 0.0)
        } else {
            let t = calibration
                .codecs
                .iter()
                .find(|c| canonical(&c.spec).as_deref() == Some(canon.as_str()))
                .ok_or_else(|| AutoError::Uncalibrated { spec: spec.clone() })?;
            (t.encode_s_per_elem, t.decode_s_per_elem)
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
        return Err(AutoError::Empty);
    }
    Ok(out)
}
