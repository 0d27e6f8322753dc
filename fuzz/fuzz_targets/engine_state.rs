#![no_main]
//! Fuzzes the engine's saved-state decoder (`gradwire_engine::EngineState::from_bytes`): the
//! whole file (magic, version, length, checksum, body), and the body alone past the checksum;
//! every input must decode or give a typed error, and what decodes must encode back to the
//! same bytes.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gradwire_engine::fuzz_state(data);
});
