#![no_main]
//! Fuzzes WAL decoding and replay (first byte = worker count, mod 8, plus 1).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&w, rest)) = data.split_first() {
        gradwire_ps::check_wal_bytes((w % 8) as u32 + 1, rest);
    }
});
