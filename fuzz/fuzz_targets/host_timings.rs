#![no_main]
//! Fuzzes the decoding of the timings the ranks of `gradwire simulate --host-cores` send
//! rank 0 (`gradwire_sim::host`).
//!
//! Input: every rank's message, separated by `0xff` bytes. What decodes has one step time and
//! the same number of passes per rank (checked inside `fuzz_decode`).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gradwire_sim::host::fuzz_decode(data);
});
