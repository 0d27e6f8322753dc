//! Measurement of the collectives on one rank of a job, for `gradwire bench allreduce` and
//! `gradwire check`: what is timed, how, and the numbers reported.
//!
//! - [`size`]: byte sizes as written on a command line (`4KiB`, `16MiB`) and back;
//! - [`timing`]: per message size, the median over iterations of the slowest rank's time of
//!   an all-reduce, all-gather or broadcast, and the bus bandwidth (nccl-tests convention),
//!   flat or through a [`HierarchicalAllReduce`];
//! - [`check`]: an all-reduce of a known integer pattern, verified exactly.
//!
//! Every rank of the job calls the same function with the same arguments (they are
//! collectives); every rank returns the same numbers.

pub mod check;
mod error;
pub mod size;
pub mod timing;

#[cfg(test)]
mod tests;

pub use check::check_iteration;
pub use error::BenchError;
pub use size::{format_size, parse_size, SizeError};
pub use timing::{iterations, measure, BenchOp, BenchSpec, HierarchicalAllReduce, SizeResult};
