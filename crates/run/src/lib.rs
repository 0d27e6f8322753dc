//! gradwire-run: what a run is, without a model, for every front end (the `gradwire` CLI and
//! the Python package) so that both apply the same rules:
//!
//! - [`elastic`]: elastic membership: the coordinator that forms each generation's world
//!   (ranks, master address, the commit to restore) as members die and join, and the
//!   member's connection to it;
//! - [`join`]: which launcher started this process (gradwire launch, torchrun, mpirun, srun,
//!   MPICH), read from its environment, and the transport (`tcp`, `shm`, `mpi`) that joins the
//!   job;
//! - [`launch`]: the process launcher: starting N local ranks of a command with their
//!   environment, passing their output and the signals this process gets on, stopping them
//!   all on the first failure, and elastic jobs (the coordinator, the join file);
//! - [`report`]: the records a run writes (`run.json`, `metrics.jsonl`) and the report that
//!   compares runs: the matrix of runs, time to accuracy, the Markdown tables;
//! - [`rules`]: the training rules between a codec and the optimizer: DGC owns the momentum
//!   (momentum correction), `--momentum-correction on` moves it into the sync for any codec,
//!   and where gradient clipping happens.
#![deny(missing_docs)]

/// The git revision this build was made from (`-dirty` with uncommitted changes; `unknown`
/// outside a checkout), from `build.rs`: what every run record and checkpoint names.
pub const GIT_REV: &str = env!("GRADWIRE_GIT_REV");

pub mod elastic;
pub mod join;
pub mod launch;
pub mod report;
pub mod rules;

pub use join::{detect, join_from_env, join_with, JoinError, Launched, TransportKind};
pub use rules::{
    resolve, ClipScope, MomentumMode, OptimizerMomentum, OptimizerView, Resolved, RuleChoices,
    RulesError,
};
