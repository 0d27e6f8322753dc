//! The process launcher: starts N local ranks of a command (`gradwire launch`, and the
//! front ends that launch themselves: `gradwire train`, the benchmarks), passes their output
//! on, stops them all on the first failure, and launches elastic jobs.
//!
//! - [`RankSpec`]: what to start; [`spawn`], [`spawn_quiet`], [`spawn_capturing`] start it
//!   with each rank's environment (`GRADWIRE_RANK`, `GRADWIRE_WORLD_SIZE`,
//!   `GRADWIRE_MASTER_ADDR`/`PORT`, ...) and one of the output modes; [`Ranks`] waits for
//!   them ([`Ranks::wait`], [`Ranks::wait_all`], [`Ranks::wait_elastic`]) and reports an
//!   [`Outcome`]; [`run_ranks_for_json`] runs this binary's `--worker` form and parses rank
//!   0's JSON result.
//! - [`exit_code`] and [`describe`]: how a rank's exit status is reported.
//! - [`elastic`]: an elastic job (a membership coordinator in this process, processes that
//!   get their ranks from it, the join file through which one more process joins), built on
//!   [`crate::elastic::Coordinator`].
//!
//! Every job gets a fresh random token (`GRADWIRE_TOKEN`) and job identity
//! (`GRADWIRE_JOB_ID`). Every rank leads its own process group and is killed by the kernel
//! if this process dies ([`own_group_dies_with_parent`]).
//!
//! # Signals
//!
//! The first spawn installs SIGTERM and SIGINT handlers in this process (signal-hook): while
//! a set of ranks runs, such a signal is noted and passed on, by the wait loops, to every
//! rank's process group, which then gets [`GRACE`] to end before SIGKILL (a second signal
//! kills at once); while no ranks run, the signal ends this process as by default. Once the
//! ranks have exited, the launcher removes any shared-memory ring file of the job that a rank
//! killed during its setup left behind.

mod error;
mod output;
mod ranks;
mod signals;
mod spawn;
mod spec;
mod status;

pub mod elastic;

pub use error::{LaunchError, Stopped};
pub use ranks::{Outcome, Ranks};
pub use signals::GRACE;
pub use spawn::{
    own_group_dies_with_parent, run_ranks_for_json, spawn, spawn_capturing, spawn_elastic,
    spawn_quiet,
};
pub use spec::{ElasticEnv, RankSpec};
pub use status::{describe, exit_code};
