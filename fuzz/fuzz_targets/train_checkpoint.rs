#![no_main]
//! Fuzzes the training checkpoint decoder (`Checkpoint::from_bytes` of gradwire-train's
//! `checkpoint/format.rs`, compiled here on its own so the fuzz crate needs no burn): every
//! input must decode or give a typed error, and what decodes must encode back to the same
//! bytes.
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/train/src/checkpoint/format.rs"]
#[allow(dead_code)]
mod format;

fuzz_target!(|data: &[u8]| {
    format::fuzz_checkpoint(data);
});
