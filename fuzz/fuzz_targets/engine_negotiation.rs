#![no_main]
//! Fuzzes the engine's negotiation-round decoders (`gradwire_engine`'s wire module): the
//! round message (bit-vector, submit times, new descriptors), a descriptor list and the
//! speculative round's exchange (message, flag, padding, part).
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gradwire_engine::fuzz_negotiation(1, data);
});
