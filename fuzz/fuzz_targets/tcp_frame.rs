#![no_main]
//! Fuzzes the TCP transport's frame-header decoder.
//!
//! Input: 8 header bytes, then (optionally) 8 bytes of `max_frame` (u64 LE).
//! A decoded data frame never announces more than `max_frame`, and every decoded header
//! encodes back to the same bytes.
use gradwire_transport::tcp::frame::{FrameHeader, FRAME_HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < FRAME_HEADER_LEN {
        return;
    }
    let mut h = [0u8; FRAME_HEADER_LEN];
    h.copy_from_slice(&data[..FRAME_HEADER_LEN]);
    let max = data
        .get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + 8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
        .unwrap_or(1 << 30);
    if let Ok(d) = FrameHeader::decode(&h, max) {
        if let FrameHeader::Data(len) = d {
            assert!(u64::from(len) <= max);
        }
        assert_eq!(d.encode(), h);
    }
});
