//! A model-parallel rank's model and its end: partition `j` built over its replica, and the
//! whole model's parameters gathered from replica 0's partitions to rank 0.

use std::path::Path;

use gradwire_train::data::DataShape;
use gradwire_train::{Model, ModelKind};
use gradwire_transport::Transport;

use super::output::save_params;
use super::RankError;
use crate::model_parallel::{image_shape, ModelParallel};
use crate::Plan;

/// Partition `index` of `model`, over its replica's transport.
pub fn build(
    mp: &ModelParallel,
    model: ModelKind,
    shape: DataShape,
    seed: u64,
    index: usize,
    replica: Box<dyn Transport>,
) -> Result<Box<dyn Model>, RankError> {
    let part = mp
        .spec(model, shape, seed)
        .build(index, replica)
        .map_err(|source| RankError::Partition {
            index,
            model,
            source,
        })?;
    Ok(Box::new(part))
}

/// Writes the whole model's parameters to `path` after a model-parallel run: replica 0's
/// partitions send theirs to rank 0 over the world (idle since the split), which assembles
/// them in the whole model's flat order, the bytes `--save-params` writes for a whole model.
/// Collective over the world; `kept` is this rank's partition's parameters on replica 0.
pub fn save_whole<T: Transport + ?Sized>(
    world: &mut T,
    mp: &ModelParallel,
    plan: &Plan,
    kept: Option<Vec<f32>>,
    path: &Path,
) -> Result<(), RankError> {
    let rank = world.rank();
    let k = mp.partitions;
    if rank >= k {
        return Ok(());
    }
    let mine = kept.ok_or(RankError::NothingKept)?;
    if rank > 0 {
        let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        return world.send(0, &bytes).map_err(|source| RankError::Gather {
            index: rank,
            what: "sending",
            source,
        });
    }
    let split = mp
        .spec(plan.model, image_shape(plan.dataset)?, plan.train.seed)
        .plan(plan.train.batch_size)?;
    let mut parts = vec![mine];
    let mut buf = Vec::new();
    for j in 1..k {
        let want = split.parts[j].bytes;
        world
            .recv(j, &mut buf)
            .map_err(|source| RankError::Gather {
                index: j,
                what: "receiving",
                source,
            })?;
        if buf.len() != want {
            return Err(RankError::GatherSize {
                index: j,
                got: buf.len(),
                want,
            });
        }
        parts.push(
            buf.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        );
    }
    let whole = split.assemble(&parts)?;
    save_params(path, &whole)
}
