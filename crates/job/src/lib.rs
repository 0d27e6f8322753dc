//! gradwire-job: a training job's plan, for every front end that starts one (the `gradwire`
//! CLI today): what to train and how ([`Settings`], also the flags of `gradwire train`),
//! merged over a TOML settings file over the defaults into one validated [`Plan`] before any
//! thread or process starts, with every rule applied:
//!
//! - [`plan`]: the merge and its cross-checks (codec against strategy and optimizer,
//!   on-disk checkpoints, `--codec auto`, model parallelism, elastic membership);
//! - [`checkpoint`]: on-disk checkpoints: the configuration a checkpoint must match, every
//!   rank's save with its barrier, resuming;
//! - [`auto`]: `--codec auto`'s side in a job (the candidates of the optimizer, the
//!   model's tensors; the policy itself is `gradwire_sim::auto`);
//! - [`rank`]: one rank of an all-reduce job: its epochs, checkpoints, timeline and
//!   records, with its news to the front end ([`rank::Progress`]);
//! - [`ps`]: parameter-server modes (Downpour, BSP, SSP, Sandblaster) and their flags;
//! - [`shards`]: a parameter-server job's shard processes, supervised;
//! - [`model_parallel`]: DistBelief's model parallelism (partitions, replicas, a rank's
//!   groups);
//! - [`elastic`]: the range of world sizes and the commit period;
//! - [`sync_mode`]: what `--sync` names;
//! - [`plot`]: the PNG charts a job leaves behind (curves, report charts, a timeline step).
//!
//! It holds what a run *is*, with its model; what front ends share without a model (the
//! launcher's environment, elastic membership, the training rules, the run records) is
//! `gradwire-run`, which the Python package uses without this crate.
#![deny(missing_docs)]
// The errors here carry their cause with its context (the rank, the step, the file, the
// flags); they end a run or refuse a plan, once, never in a loop, so their size costs
// nothing measurable, and boxing every cause would only make matching on them clumsier.
#![allow(clippy::result_large_err)]

pub mod auto;
pub mod checkpoint;
pub mod elastic;
pub mod model_parallel;
pub mod plan;
pub mod plot;
pub mod ps;
pub mod rank;
pub mod settings;
pub mod shards;
pub mod sync_mode;

pub use plan::{link_label, Host, Plan, PlanError, Request};
pub use settings::{FileSettings, Settings};
pub use sync_mode::{PsMode, SyncMode};
