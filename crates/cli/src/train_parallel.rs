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
use clap::Args;
use gradwire_train::data::{DataShape, DatasetKind};
use gradwire_train::model::partition::{PartitionSpec, Split};
use gradwire_train::{Model, ModelKind};
use gradwire_transport::Transport;

use crate::train_ps::PsMode;

/// The flags of model parallelism.
#[derive(Debug, Clone, Default, Args)]
pub struct ModelParallelArgs {
    /// Split each model replica over K ranks (DistBelief's model parallelism): `--workers R`
    /// then starts R replicas of K partitions, R·K ranks, and partition j of every replica
    /// all-reduces its own tensors with the others under --codec, or, under --sync
    /// ps-sync|ps-async|ps-ssp:S (Downpour over model replicas), pushes and pulls them as its
    /// own table on its own --servers shards. Under a launcher its world must be a multiple
    /// of K. MLPs (both splits) and LeNet (pipeline) [default: 1, whole models].
    #[arg(long, value_name = "K")]
    pub model_parallel: Option<usize>,
    /// How a replica is split: `tensor` (each fully connected layer's units over the
    /// partitions, paired as Megatron pairs them: one all-reduce per pair of layers; MLPs) or
    /// `pipeline` (consecutive layers on consecutive partitions; MLPs and LeNet) [default:
    /// tensor for MLPs, pipeline for LeNet].
    #[arg(long, value_name = "SPLIT")]
    pub mp_split: Option<Split>,
    /// Micro-batches per pipeline step: GPipe's schedule (all forwards, then all backwards,
    /// the gradients summed to the whole batch's), beyond DistBelief's plain split [default:
    /// 1].
    #[arg(long, value_name = "M")]
    pub micro_batches: Option<usize>,
}

/// A validated model-parallel setting: `partitions` per replica, split as `split`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelParallel {
    /// Partitions per replica (`K`, at least 2).
    pub partitions: usize,
    /// Within layers or across them.
    pub split: Split,
}

impl ModelParallel {
    /// The setting the flags ask for: `None` without `--model-parallel` (or with 1).
    pub fn from_args(args: &ModelParallelArgs, model: ModelKind) -> Result<Option<Self>> {
        let k = args.model_parallel.unwrap_or(1);
        if k == 0 {
            bail!("--model-parallel needs at least 1 partition");
        }
        if k == 1 {
            if args.mp_split.is_some() || args.micro_batches.is_some() {
                bail!("--mp-split and --micro-batches go with --model-parallel K (K of 2 or more)");
            }
            return Ok(None);
        }
        let split = match (args.mp_split, model) {
            (Some(s), _) => s,
            (None, ModelKind::LeNet) => Split::Pipeline { micro_batches: 1 },
            (None, _) => Split::Tensor,
        };
        let split = match (split, args.micro_batches) {
            (s, None) => s,
            (Split::Pipeline { .. }, Some(m)) => Split::Pipeline { micro_batches: m },
            (Split::Tensor, Some(_)) => {
                bail!("--micro-batches goes with --mp-split pipeline (the tensor split has none)")
            }
        };
        split.validate()?;
        Ok(Some(ModelParallel {
            partitions: k,
            split,
        }))
    }

    /// The partition spec for `model` on data of `shape`, initialized from `seed`.
    pub fn spec(&self, model: ModelKind, shape: DataShape, seed: u64) -> PartitionSpec {
        PartitionSpec {
            kind: model,
            shape,
            seed,
            split: self.split,
            partitions: self.partitions,
        }
    }

    /// Replicas in a world of `world` ranks (an error unless `K` divides it).
    pub fn replicas(&self, world: usize) -> Result<usize> {
        if world == 0 || !world.is_multiple_of(self.partitions) {
            bail!(
                "--model-parallel {} needs a world that is a multiple of {0}; it has {world} rank(s)",
                self.partitions
            );
        }
        Ok(world / self.partitions)
    }

    /// Splits this rank's world into its replica and its partition group (collective: every
    /// rank calls it at the same point).
    pub fn split_world<T: Transport + ?Sized>(&self, world: &mut T) -> Result<RankGroups> {
        let replicas = self.replicas(world.world_size())?;
        let rank = world.rank();
        let (replica, group) = gradwire_transport::split::grid(world, replicas, self.partitions)
            .with_context(|| format!("rank {rank}: forming the replicas and partition groups"))?;
        Ok(RankGroups {
            index: rank % self.partitions,
            replica: Box::new(replica),
            group: Box::new(group),
        })
    }
}

/// One rank's place in a model-parallel world.
pub struct RankGroups {
    /// The partition this rank holds (0..K).
    pub index: usize,
    /// The K ranks of this rank's replica, in partition order.
    pub replica: Box<dyn Transport>,
    /// Partition `index` of every replica: the ranks this one all-reduces with.
    pub group: Box<dyn Transport>,
}

/// Refuses what model parallelism cannot do yet, by name, and checks that the model splits
/// (its partition plan builds) before anything starts.
pub fn check_plan(
    mp: &ModelParallel,
    plan: &crate::train::Plan,
    ps: Option<PsMode>,
    auto: bool,
) -> Result<()> {
    let k = mp.partitions;
    if ps == Some(PsMode::Sandblaster) {
        bail!(
            "--model-parallel {k} with --sync sandblaster: its L-BFGS workers are threads over \
             whole models; use ps-sync, ps-async or ps-ssp:S"
        );
    }
    if auto {
        bail!("--codec auto chooses per tensor of the whole model; give --codec with --model-parallel");
    }
    if plan.checkpoint_every > 0 || plan.resume.is_some() {
        bail!(
            "--checkpoint-every and --resume keep whole models' state; not with --model-parallel"
        );
    }
    if plan.timeline.is_some() {
        bail!("--timeline merges one file per data-parallel rank; not with --model-parallel");
    }
    let shape = image_shape(plan.dataset)?;
    let p = mp
        .spec(plan.model, shape, plan.train.seed)
        .plan(plan.train.batch_size)
        .with_context(|| {
            format!(
                "splitting {} over {k} partitions ({})",
                plan.model, mp.split
            )
        })?;
    if p.parts.iter().any(|part| part.elements == 0) {
        bail!(
            "{} split {} ways ({}) leaves a partition without parameters; use fewer partitions",
            plan.model,
            k,
            mp.split
        );
    }
    Ok(())
}

/// Checks a parameter-server plan against model parallelism: running shards given with
/// `--ps-servers` are `K` sets of equal size, set `j` holding partition `j`'s table.
pub fn check_ps(mp: &ModelParallel, ps: &crate::train_ps::PsPlan) -> Result<()> {
    let k = mp.partitions;
    if !ps.addrs.is_empty() && !ps.addrs.len().is_multiple_of(k) {
        bail!(
            "--model-parallel {k} with --ps-servers: give {k} sets of equal size (set j, each \
             shard started with --workers R, holds partition j's table); {} address(es) given",
            ps.addrs.len()
        );
    }
    Ok(())
}

/// The shape of an image data set's samples (model parallelism splits image models only).
pub fn image_shape(dataset: DatasetKind) -> Result<DataShape> {
    let shape = match dataset {
        DatasetKind::FashionMnist | DatasetKind::Mnist => [1, 28, 28],
        DatasetKind::Cifar10 => [3, 32, 32],
        other => bail!(
            "--model-parallel splits image models (MLPs, LeNet); {} is text",
            other.name()
        ),
    };
    Ok(DataShape::Image { shape, classes: 10 })
}

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
