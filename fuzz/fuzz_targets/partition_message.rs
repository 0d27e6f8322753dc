#![no_main]
//! Fuzzes the decoder of the messages between a model replica's partitions
//! (`decode` of gradwire-train's `model/partition/message.rs`, compiled here on its own so
//! the fuzz crate needs no burn): every input, read as data of 0 to 7 values or as an abort,
//! gives values or a typed error, and data that decodes encodes back to the same bytes.
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/train/src/model/partition/message.rs"]
#[allow(dead_code)]
mod message;

fuzz_target!(|data: &[u8]| {
    message::fuzz_message(data);
});
