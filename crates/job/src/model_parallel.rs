//! DistBelief's model parallelism as a job setting (`gradwire train --model-parallel K`):
//! the flags ([`MpSettings`]), the validated setting ([`ModelParallel`]), the replicas a
//! world holds and one rank's split of it ([`RankGroups`]), composed with data parallelism.
//! `--workers R` runs `R` replicas of `K` partitions each, `R·K` ranks; rank
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

use clap::Args;
use gradwire_train::data::{DataShape, DatasetKind};
use gradwire_train::model::partition::{PartitionSpec, Split};
use gradwire_train::ModelKind;
use gradwire_transport::Transport;

/// The flags of model parallelism.
#[derive(Debug, Clone, Default, Args)]
pub struct MpSettings {
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

/// A model-parallel setting that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum MpError {
    /// `--model-parallel 0`.
    #[error("--model-parallel needs at least 1 partition")]
    NoPartitions,
    /// `--mp-split` or `--micro-batches` without model parallelism.
    #[error("--mp-split and --micro-batches go with --model-parallel K (K of 2 or more)")]
    SplitWithoutPartitions,
    /// `--micro-batches` with the tensor split.
    #[error("--micro-batches goes with --mp-split pipeline (the tensor split has none)")]
    MicroBatchesWithTensor,
    /// The split itself is invalid.
    #[error(transparent)]
    Split(gradwire_train::Error),
    /// A world whose size `K` does not divide.
    #[error(
        "--model-parallel {k} needs a world that is a multiple of {k}; it has {world} rank(s)"
    )]
    World {
        /// Partitions per replica.
        k: usize,
        /// Ranks in the world.
        world: usize,
    },
    /// A text data set.
    #[error("--model-parallel splits image models (MLPs, LeNet); {0} is text")]
    Text(String),
    /// Forming the replica and the partition group failed.
    #[error("rank {rank}: forming the replicas and partition groups: {source}")]
    Groups {
        /// This rank.
        rank: usize,
        /// What the transport said.
        source: gradwire_transport::Error,
    },
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
    pub fn from_settings(s: &MpSettings, model: ModelKind) -> Result<Option<Self>, MpError> {
        let k = s.model_parallel.unwrap_or(1);
        if k == 0 {
            return Err(MpError::NoPartitions);
        }
        if k == 1 {
            if s.mp_split.is_some() || s.micro_batches.is_some() {
                return Err(MpError::SplitWithoutPartitions);
            }
            return Ok(None);
        }
        let split = match (s.mp_split, model) {
            (Some(s), _) => s,
            (None, ModelKind::LeNet) => Split::Pipeline { micro_batches: 1 },
            (None, _) => Split::Tensor,
        };
        let split = match (split, s.micro_batches) {
            (s, None) => s,
            (Split::Pipeline { .. }, Some(m)) => Split::Pipeline { micro_batches: m },
            (Split::Tensor, Some(_)) => return Err(MpError::MicroBatchesWithTensor),
        };
        split.validate().map_err(MpError::Split)?;
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
    pub fn replicas(&self, world: usize) -> Result<usize, MpError> {
        if world == 0 || !world.is_multiple_of(self.partitions) {
            return Err(MpError::World {
                k: self.partitions,
                world,
            });
        }
        Ok(world / self.partitions)
    }

    /// Splits this rank's world into its replica and its partition group (collective: every
    /// rank calls it at the same point).
    pub fn split_world<T: Transport + ?Sized>(&self, world: &mut T) -> Result<RankGroups, MpError> {
        let replicas = self.replicas(world.world_size())?;
        let rank = world.rank();
        let (replica, group) = gradwire_transport::split::grid(world, replicas, self.partitions)
            .map_err(|source| MpError::Groups { rank, source })?;
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

/// The shape of an image data set's samples (model parallelism splits image models only).
pub fn image_shape(dataset: DatasetKind) -> Result<DataShape, MpError> {
    let shape = match dataset {
        DatasetKind::FashionMnist | DatasetKind::Mnist => [1, 28, 28],
        DatasetKind::Cifar10 => [3, 32, 32],
        other => return Err(MpError::Text(other.name().to_string())),
    };
    Ok(DataShape::Image { shape, classes: 10 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(k: Option<usize>, split: Option<&str>, m: Option<usize>) -> MpSettings {
        MpSettings {
            model_parallel: k,
            mp_split: split.map(|s| s.parse().expect("a split")),
            micro_batches: m,
        }
    }

    #[test]
    fn the_split_defaults_by_model_and_bad_combinations_are_refused() {
        let lenet = ModelParallel::from_settings(&settings(Some(2), None, None), ModelKind::LeNet)
            .expect("valid")
            .expect("model parallel");
        assert_eq!(lenet.split, Split::Pipeline { micro_batches: 1 });
        let mlp = ModelParallel::from_settings(&settings(Some(4), None, None), ModelKind::Mlp)
            .expect("valid")
            .expect("model parallel");
        assert_eq!(mlp.split, Split::Tensor);
        assert_eq!(mlp.replicas(8).expect("divides"), 2);
        assert!(matches!(
            mlp.replicas(6),
            Err(MpError::World { k: 4, world: 6 })
        ));
        assert!(
            ModelParallel::from_settings(&settings(None, None, None), ModelKind::Mlp)
                .expect("valid")
                .is_none()
        );
        assert!(matches!(
            ModelParallel::from_settings(&settings(Some(0), None, None), ModelKind::Mlp),
            Err(MpError::NoPartitions)
        ));
        assert!(matches!(
            ModelParallel::from_settings(&settings(Some(1), Some("tensor"), None), ModelKind::Mlp),
            Err(MpError::SplitWithoutPartitions)
        ));
        assert!(matches!(
            ModelParallel::from_settings(
                &settings(Some(2), Some("tensor"), Some(4)),
                ModelKind::Mlp
            ),
            Err(MpError::MicroBatchesWithTensor)
        ));
        assert!(matches!(
            image_shape(DatasetKind::Shakespeare),
            Err(MpError::Text(_))
        ));
    }
}
