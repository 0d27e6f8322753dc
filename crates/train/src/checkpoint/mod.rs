//! Training checkpoints: one rank's state at a step boundary ([`Checkpoint`], with its
//! versioned, checksummed binary form in [`format`](mod@format)) and the folder they are
//! written to and resumed from ([`store`]). [`Trainer::checkpoint`](crate::Trainer::checkpoint)
//! takes one, [`Trainer::restore`](crate::Trainer::restore) continues from one bit for bit.

pub mod format;
pub mod store;

pub use format::{Checkpoint, CheckpointFormatError, CHECKPOINT_MAGIC, CHECKPOINT_VERSION};
