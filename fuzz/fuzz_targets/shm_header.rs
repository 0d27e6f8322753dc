#![no_main]
//! Fuzzes the shared-memory ring header decoder (see `src/lib.rs` for the input format).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gradwire_fuzz::shm_header(data));
