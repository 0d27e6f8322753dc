//! `gradwire train --model-parallel K`: DistBelief's model parallelism composed with data
//! parallelism. `--workers R` runs `R` replicas of `K` partitions each, `R·K` ranks; rank
//! `r·K + j` is partition `j` of replica `r`. The world splits (collectively, over its own
//! transport: `gradwire_transport::split::grid`) into two independent transports per rank:
//!
//! - the **replica** (the `K` partitions of replica `r`), which the partitioned model owns:
//!   activations and their gradients cross it inside every forward and backward pass
//!   (`gradwire_train::model::partition`, `--mp-split tensor|pipeline`);
//! - the **partition group** (partition `j` of every replica), which the engine owns: it
//!   all-reduces partition `j`'s own tensors with the other replicas' under any codec, and
//!   shards the data by replica (every partition of a replica reads the same batch).
//!
//! An emulated link (`--link`) throttles both. The partition plan (which partition holds
//! which tensors, the bytes crossing the boundaries per step) is printed at start and kept
//! in run.json (`model_parallel`). Checkpoints, `--codec auto`, Sandblaster and the host
//! hierarchy are refused or off with model parallelism: each needs the whole model's
//! tensors on every rank.
//!
//! Under a parameter server (`--sync ps-sync|ps-async|ps-ssp:S`: DistBelief's Figure 2,
//! Downpour over model replicas) the ranks still form the world and split it; the replica
//! carries the activations as above, the partition group stays unused, and partition `j`
//! of every replica is a PS client for its own tensors only: table `j`
//! (`gradwire_train::sync::ps`, key `1 + j`), the replicas its workers. Each table gets its
//! own `--servers` shards (the parent starts `K·S`), since a shard's sync rounds count every
//! worker registered with it. Per flag:
//!
//! - `--model-parallel K`: partitions per replica; with a PS, also the number of tables.
//! - `--workers R`: replicas (R·K rank processes); with a PS, the workers of each table.
//! - `--mp-split`, `--micro-batches`: as without a PS.
//! - `--servers S`: shards per partition's table (K·S in all); `--ps-servers` lists K sets
//!   of S addresses, set `j` for partition `j`, each shard started with `--workers R`.
//! - `--save-params`: the whole model, assembled over the world from replica 0's partitions.
//! - reports: partition 0 of replica 0 (the whole model's loss and accuracy: every
//!   partition sees the same); run.json has `model_parallel` and `ps` (with `tables`).

use anyhow::{bail, Context, Result};
use gradwire_train::data::DataShape;
use gradwire_train::{Model, ModelKind};
use gradwire_transport::Transport;

pub use gradwire_job::model_parallel::{image_shape, ModelParallel, RankGroups};

/// Writes the whole model's parameters to `path` after a model-parallel run: replica 0's
/// partitions send theirs to rank 0 over the world (idle since the split), which assembles
/// them in the whole model's flat order, the bytes `--save-params` writes for a whole model.
/// Collective over the world; `kept` is this rank's partition's parameters on replica 0.
pub fn save_whole<T: Transport + ?Sized>(
    world: &mut T,
    mp: &ModelParallel,
    plan: &crate::train::Plan,
    kept: Option<Vec<f32>>,
    path: &std::path::Path,
) -> Result<()> {
    let rank = world.rank();
    let k = mp.partitions;
    if rank >= k {
        return Ok(());
    }
    let mine = kept.context("a partition of replica 0 kept no parameters")?;
    if rank > 0 {
        let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
        world
            .send(0, &bytes)
            .with_context(|| format!("partition {rank}: sending its parameters to rank 0"))?;
        return Ok(());
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
            .with_context(|| format!("receiving partition {j}'s parameters"))?;
        if buf.len() != want {
            bail!(
                "partition {j} sent {} bytes of parameters; its plan holds {want}",
                buf.len()
            );
        }
        parts.push(
            buf.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        );
    }
    let whole = split.assemble(&parts)?;
    crate::train_ps::save_params(path, &whole)
}

/// Partition `index` of `model`, over its replica's transport.
pub fn build(
    mp: &ModelParallel,
    model: ModelKind,
    shape: DataShape,
    seed: u64,
    index: usize,
    replica: Box<dyn Transport>,
) -> Result<Box<dyn Model>> {
    let part = mp
        .spec(model, shape, seed)
        .build(index, replica)
        .with_context(|| format!("building partition {index} of {model}"))?;
    Ok(Box::new(part))
}
