#![no_main]
//! Fuzzes the decoder of the split offer every rank sends when a transport is split
//! (`gradwire_transport::split::offer`).
//!
//! Input: the offer bytes. Decoding never panics; a decoded offer's payload is at most
//! `MAX_PAYLOAD` bytes and the offer encodes back to the same bytes, which decode to an
//! equal offer.
use gradwire_transport::split::offer::{Offer, MAX_PAYLOAD, OFFER_HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(offer) = Offer::decode(data) {
        assert!(offer.payload.len() <= MAX_PAYLOAD);
        assert_eq!(data.len(), OFFER_HEADER_LEN + offer.payload.len());
        let bytes = offer.encode().expect("a decoded payload fits an offer");
        assert_eq!(bytes, data);
        assert_eq!(Offer::decode(&bytes), Ok(offer));
    }
});
