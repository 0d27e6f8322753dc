#![no_main]
//! Fuzzes the decoder of every `CodecConfig::examples()` entry, chosen by the first byte.
use gradwire_codec::CodecConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&which, rest)) = data.split_first() {
        let examples = CodecConfig::examples();
        let cfg = &examples[which as usize % examples.len()];
        gradwire_fuzz::decode(&cfg.to_string(), rest);
    }
});
