#![no_main]
//! Fuzzes the decoder of the address table rank 0 sends at rendezvous.
//!
//! Input: world size (u16 LE), then the table bytes. A decoded table has exactly one
//! address per rank and encodes back to the same bytes.
use gradwire_transport::tcp::frame::{decode_table, encode_table};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let world = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let table = &data[2..];
    if let Ok(addrs) = decode_table(table, world) {
        assert_eq!(addrs.len(), world);
        assert_eq!(encode_table(&addrs), table);
    }
});
