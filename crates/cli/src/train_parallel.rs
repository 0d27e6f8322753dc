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

pub use gradwire_job::model_parallel::RankGroups;
pub use gradwire_job::rank::{build, save_whole};
