#![no_main]
//! Fuzzes the decoder of elastic training's commit (`Commit::from_bytes` of gradwire-train's
//! `elastic/commit.rs`, what rank 0 broadcasts to a new world; compiled here with the
//! checkpoint format it embeds, so the fuzz crate needs no burn): every input must decode or
//! give a typed error, and what decodes must decode again from its own encoding.
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/train/src/checkpoint/format.rs"]
#[allow(dead_code)]
mod format;

/// What `commit.rs` imports as `crate::checkpoint`.
mod checkpoint {
    pub use super::format::{Checkpoint, CheckpointFormatError};
}

#[path = "../../crates/train/src/elastic/commit.rs"]
#[allow(dead_code)]
mod commit;

fuzz_target!(|data: &[u8]| {
    commit::fuzz_commit(data);
});
