#![no_main]
//! Fuzzes the sparse all-reduce's wire decoder (`gradwire_collective::compressed`).
//!
//! Input: the receiver's tensor length (u16 LE), then the message. The decoder returns an
//! error or a message that re-encodes to the same bytes (checked inside `fuzz_sparse_wire`).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let len = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let _ = gradwire_collective::compressed::fuzz_sparse_wire(&data[2..], len);
});
