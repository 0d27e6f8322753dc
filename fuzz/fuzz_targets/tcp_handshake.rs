#![no_main]
//! Fuzzes the TCP handshake messages' decoders (hello, challenge, proof, confirm, and the
//! mesh identity rank 0 sends before the address table).
//!
//! Input: any bytes, given to each decoder. Whatever a decoder accepts encodes back to the
//! same bytes (no field is silently dropped or normalised).
use gradwire_transport::tcp::frame::{decode_mesh, encode_mesh, Challenge, Confirm, Hello, Proof};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Hello::decode(data) {
        assert_eq!(&h.encode()[..], data);
    }
    if let Ok(c) = Challenge::decode(data) {
        assert_eq!(&c.encode()[..], data);
    }
    if let Ok(p) = Proof::decode(data) {
        assert_eq!(&p.encode()[..], data);
    }
    if let Ok(k) = Confirm::decode(data) {
        assert_eq!(&k.encode()[..], data);
    }
    if let Ok(m) = decode_mesh(data) {
        assert_eq!(&encode_mesh(&m)[..], data);
    }
});
