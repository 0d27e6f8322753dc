#![no_main]
//! Fuzzes the MXNet 2-bit decoder: first two bytes = accumulator length (mod 4096).
use gradwire_ps::TwoBit;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let n = u16::from_le_bytes([data[0], data[1]]) as usize % 4096;
    let mut acc = vec![0.0f32; n];
    if TwoBit::decode_add(&data[2..], &mut acc).is_err() {
        assert!(acc.iter().all(|x| *x == 0.0), "a refused payload leaves acc untouched");
    }
});
