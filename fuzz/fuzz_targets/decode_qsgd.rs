#![no_main]
//! Fuzzes the `qsgd:bits=4,bucket=64` decoder (see `src/lib.rs` for the input format).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gradwire_fuzz::decode("qsgd:bits=4,bucket=64", data));
