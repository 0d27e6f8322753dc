#![no_main]
//! Fuzzes the checkpoint decoders: the file envelope, then the shard-state body (first
//! byte = worker count, mod 8, plus 1).
use gradwire_ps::durability::decode_checkpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_checkpoint(data);
    if let Some((&w, body)) = data.split_first() {
        let _ = gradwire_ps::check_checkpoint_body((w % 8) as u32 + 1, body);
    }
});
