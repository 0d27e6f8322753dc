#![no_main]
//! Fuzzes the reader of the engine's pre-encoded sparse payloads
//! (`gradwire_engine::fuzz_encoded_pairs`: the sparse codecs' `SparseEncode::decode_pairs`,
//! which the engine calls): the first byte picks the codec (top-k f32/f16, DGC, threshold,
//! random-k), the next two the element count (1..=4096), an odd fourth byte puts a valid
//! header in front of the rest. Every input must give pairs or a typed error, never a panic,
//! and agree with the codec's own decoder (accept/refuse with the same error, and the sums).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gradwire_engine::fuzz_encoded_pairs(data);
});
