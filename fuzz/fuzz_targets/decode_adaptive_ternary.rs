#![no_main]
//! Fuzzes the `adaptive:pi=0.05,column=64,ternary=true` decoder (see `src/lib.rs` for the input format).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gradwire_fuzz::decode("adaptive:pi=0.05,column=64,ternary=true", data));
