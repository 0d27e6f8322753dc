//! The checks of a plan that involve several settings groups: model parallelism against the
//! rest of the plan and the parameter server, and elastic membership against everything it
//! cannot carry across a change of world.

use gradwire_train::model::partition::Split;

use super::{Plan, PlanError};
use crate::elastic::{Elastic, ElasticRange, ElasticSettings, DEFAULT_COMMIT_EVERY};
use crate::model_parallel::{image_shape, ModelParallel};
use crate::ps::PsPlan;
use crate::sync_mode::PsMode;

/// Refuses what model parallelism cannot do yet, by name, and checks that the model splits
/// (its partition plan builds) before anything starts.
pub(super) fn model_parallel(
    mp: &ModelParallel,
    plan: &Plan,
    ps: Option<PsMode>,
    auto: bool,
) -> Result<(), PlanError> {
    let k = mp.partitions;
    if ps == Some(PsMode::Sandblaster) {
        return Err(PlanError::MpSandblaster(k));
    }
    if auto {
        return Err(PlanError::MpAuto);
    }
    if plan.checkpoint_every > 0 || plan.resume.is_some() {
        return Err(PlanError::MpCheckpoint);
    }
    if plan.timeline.is_some() {
        return Err(PlanError::MpTimeline);
    }
    let shape = image_shape(plan.dataset)?;
    let split: Split = mp.split;
    let p = mp
        .spec(plan.model, shape, plan.train.seed)
        .plan(plan.train.batch_size)
        .map_err(|source| PlanError::MpSplit {
            model: plan.model,
            k,
            split,
            source,
        })?;
    if p.parts.iter().any(|part| part.elements == 0) {
        return Err(PlanError::MpEmptyPartition {
            model: plan.model,
            k,
            split,
        });
    }
    Ok(())
}

/// Checks a parameter-server plan against model parallelism: running shards given with
/// `--ps-servers` are `K` sets of equal size, set `j` holding partition `j`'s table.
pub(super) fn model_parallel_ps(mp: &ModelParallel, ps: &PsPlan) -> Result<(), PlanError> {
    let k = mp.partitions;
    if !ps.addrs.is_empty() && !ps.addrs.len().is_multiple_of(k) {
        return Err(PlanError::MpPsServers {
            k,
            given: ps.addrs.len(),
        });
    }
    Ok(())
}

/// The elastic setting the flags ask for, checked against the rest of the plan (`None`
/// without `--elastic`). A process that `gradwire launch --elastic` started is elastic
/// without the flag (`launched`); the launcher holds the range.
pub(super) fn elastic(
    s: &ElasticSettings,
    plan: &Plan,
    launched: bool,
) -> Result<Option<Elastic>, PlanError> {
    let range = match s.elastic {
        Some(r) => r,
        None if launched => ElasticRange { min: 1, max: 64 },
        None => {
            if s.commit_every.is_some() {
                return Err(PlanError::CommitEveryWithoutElastic);
            }
            return Ok(None);
        }
    };
    let refused = [
        (plan.ps.is_some(), "a parameter server (--sync ps-*)"),
        (plan.model_parallel.is_some(), "--model-parallel"),
        (plan.train.overlap_steps != 0, "--overlap-steps 1"),
        (
            plan.checkpoint_every > 0 || plan.resume.is_some(),
            "--checkpoint-every or --resume (its commits are kept in memory)",
        ),
        (plan.timeline.is_some(), "--timeline"),
    ];
    if let Some((_, what)) = refused.into_iter().find(|(r, _)| *r) {
        return Err(PlanError::ElasticWith(what));
    }
    if !launched && !(range.min..=range.max).contains(&plan.workers) {
        return Err(PlanError::ElasticWorkers {
            workers: plan.workers,
            min: range.min,
            max: range.max,
        });
    }
    let commit_every = s.commit_every.unwrap_or(DEFAULT_COMMIT_EVERY);
    if commit_every == 0 {
        return Err(PlanError::CommitEveryZero);
    }
    Ok(Some(Elastic {
        range,
        commit_every,
    }))
}
