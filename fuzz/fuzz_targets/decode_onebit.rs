#![no_main]
//! Fuzzes the `onebit` decoder (columns by shape) (see `src/lib.rs` for the input format).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gradwire_fuzz::decode("onebit", data));
