#![no_main]
//! Fuzzes the PS request decoder: raw bytes as a stream of frames (header limit, CRC,
//! body decoder). Also re-checks, for frames whose CRC is valid, the body decoder alone.
use gradwire_ps::wire::{read_frame, FrameHeader, Request, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    let mut body = Vec::new();
    while let Ok(h) = read_frame(&mut r, 1 << 16, &mut body) {
        if let Ok(req) = Request::decode(&h, &body) {
            // What decodes must re-encode to a frame that decodes and re-encodes to the
            // same bytes (compared as bytes: NaN payloads are not equal to themselves).
            let mut out = Vec::new();
            req.encode(h.rid, &mut out);
            let h2 = FrameHeader::decode(&out, usize::MAX).expect("own header");
            let again = Request::decode(&h2, &out[HEADER_LEN..]).expect("own body");
            let mut out2 = Vec::new();
            again.encode(h.rid, &mut out2);
            assert_eq!(out, out2);
        }
    }
    // The body decoder on a header we make valid for these bytes.
    if data.len() > 1 {
        let mut f = Vec::new();
        gradwire_ps::wire::Request::Stats.encode(0, &mut f);
        f[5] = data[0] % 0x0C;
        f.extend_from_slice(&data[1..]);
        let len = (f.len() - HEADER_LEN) as u32;
        f[8..12].copy_from_slice(&len.to_le_bytes());
        let crc = crc32(&f[HEADER_LEN..]);
        f[12..16].copy_from_slice(&crc.to_le_bytes());
        if let Ok(h) = FrameHeader::decode(&f, usize::MAX) {
            let _ = Request::decode(&h, &f[HEADER_LEN..]);
        }
    }
});

fn crc32(b: &[u8]) -> u32 {
    let mut c = !0u32;
    for &x in b {
        c ^= x as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
        }
    }
    !c
}
