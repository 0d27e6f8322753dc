#![no_main]
//! Fuzzes the PS response decoder (what a worker reads from a shard).
use gradwire_ps::wire::{read_frame, Response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    let mut body = Vec::new();
    while let Ok(h) = read_frame(&mut r, 1 << 16, &mut body) {
        let _ = Response::decode(&h, &body);
    }
});
