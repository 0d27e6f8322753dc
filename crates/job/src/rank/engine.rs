//! The engine a rank starts for a plan, and the partition plan a model-parallel run records.

use gradwire_run::report::records::RunRecord;
use gradwire_train::data::DataShape;
use gradwire_train::{EngineConfig, MomentumConfig};

use super::{Progress, RankError};
use crate::Plan;

/// The engine's settings for `plan`, with the host hierarchy `hosts` (if any).
pub fn engine_config(plan: &Plan, hosts: Option<gradwire_engine::HostConfig>) -> EngineConfig {
    EngineConfig {
        codec: plan.codec.clone(),
        strategy: plan.sync,
        rules: plan.rules.clone(),
        momentum: plan
            .momentum_correction
            .map(|(beta, nesterov)| MomentumConfig {
                beta: beta as f32,
                nesterov,
                masking: true,
            }),
        fusion_bytes: plan.fusion_bytes,
        seed: plan.train.seed,
        timeline: plan.timeline.is_some(),
        hosts,
        ..EngineConfig::default()
    }
}

/// Under model parallelism: notes the partition plan and keeps it in `run` (with every
/// rank counted in `workers`); nothing otherwise. The reporting rank's, before training.
pub fn record_partition_plan(
    plan: &Plan,
    shape: DataShape,
    run: &mut RunRecord,
    progress: &mut dyn Progress,
) -> Result<(), RankError> {
    if let Some(mp) = &plan.model_parallel {
        let split = mp
            .spec(plan.model, shape, plan.train.seed)
            .plan(plan.train.batch_size)?;
        progress.note(&format!("partition plan\n{split}"));
        run.workers = plan.workers;
        run.model_parallel =
            Some(
                serde_json::to_value(&split).map_err(|source| RankError::Json {
                    what: "the partition plan",
                    source,
                })?,
            );
    }
    Ok(())
}
