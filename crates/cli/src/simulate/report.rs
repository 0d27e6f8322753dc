//! The JSON report of `gradwire simulate` (`--json FILE`): the predictions, the
//! model-parallel projections and every number they used ([`gradwire_sim::report`]'s data),
//! with the command's provenance.

use gradwire_sim::report::{Inputs, MpInputs, MpRow, SimResult};
use serde::Serialize;

/// The JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    /// One entry per (link, workers, codec).
    pub results: Vec<SimResult>,
    /// What the predictions used.
    pub inputs: Inputs,
    /// The version, revision and command that made the report.
    pub provenance: gradwire_run::report::records::Provenance,
    /// With `--model-parallel`: one entry per (params, split, link, K).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_parallel: Option<Vec<MpRow>>,
    /// With `--model-parallel`: the batch, rate and split options it used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_parallel_inputs: Option<MpInputs>,
}
