#![no_main]
//! Fuzzes the `qsgd:levels=3,bucket=64,coding=elias` decoder (see `src/lib.rs` for the input format).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gradwire_fuzz::decode("qsgd:levels=3,bucket=64,coding=elias", data));
