#![no_main]
//! Fuzzes the decoders of the elastic coordinator's messages (`gradwire_run::elastic::
//! message`): every input, read as a request body, as a reply body and as a frame, gives a
//! message or a typed error, and a message that decodes encodes and decodes back to the same
//! value.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gradwire_run::elastic::message::fuzz_message(data);
});
