#![no_main]
//! Fuzzes the engine's negotiation-round decoders (`gradwire_engine`'s wire module): the
//! round message (bit-vector, submit times, new descriptors) and a descriptor list.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gradwire_engine::fuzz_negotiation(1, data);
});
