#![no_main]
//! Fuzzes the decoding of the host names ranks exchange before a hierarchical all-reduce
//! (`gradwire_collective::hierarchical`).
//!
//! Input: every rank's host-name bytes, separated by zero bytes. A layout that decodes must
//! place every rank exactly once (checked inside `fuzz_layout`).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gradwire_collective::hierarchical::fuzz_layout(data);
});
