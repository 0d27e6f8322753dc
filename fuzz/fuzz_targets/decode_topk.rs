#![no_main]
//! Fuzzes the `topk` decoder (see `src/lib.rs` for the input format).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gradwire_fuzz::decode("topk", data));
