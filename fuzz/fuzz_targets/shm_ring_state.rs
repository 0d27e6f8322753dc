#![no_main]
//! Fuzzes the position arithmetic of a shared-memory ring (`shm::cursor`) against a model
//! ring whose peer is hostile: a producer and a consumer move bytes through a data area,
//! while the input also writes anything into the shared `head` and `tail` words.
//!
//! Input: capacity selector byte (4 KiB << (b % 4)), a start position (u64 LE), then
//! operations of 9 bytes: op byte, then a u64 LE argument.
//! - `op % 4 == 0`: the producer writes up to `arg % (3 * capacity)` bytes.
//! - `op % 4 == 1`: the consumer reads up to `arg % (3 * capacity)` bytes.
//! - `op % 4 == 2`: the shared `head` is set to `arg` (a hostile producer).
//! - `op % 4 == 3`: the shared `tail` is set to `arg` (a hostile consumer).
//!
//! Checked: nothing panics; every offset is inside the data area with room after it; no end
//! is ever told of more free or readable bytes than the capacity; a refused position is a
//! `Positions` error; and while nobody tampered, the bytes come out as they went in.
use gradwire_transport::shm::cursor::{Cursor, End};
use gradwire_transport::shm::header::HeaderError;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let cap = 4096u64 << (data[0] % 4);
    let start = u64::from_le_bytes(data[1..9].try_into().expect("8 bytes"));
    let mut p = Cursor::new(End::Producer, cap, start).expect("a valid capacity");
    let mut c = Cursor::new(End::Consumer, cap, start).expect("a valid capacity");
    let (mut head, mut tail) = (start, start);
    let mut ring = vec![0u8; cap as usize];
    let (mut next_in, mut next_out) = (0u8, 0u8);
    let mut tampered = false;
    for op in data[9..].chunks_exact(9) {
        let arg = u64::from_le_bytes(op[1..9].try_into().expect("8 bytes"));
        let want = (arg % (3 * cap)) as usize;
        match op[0] % 4 {
            0 => match p.free(want, || tail) {
                Ok(free) => {
                    assert!(free as u64 <= cap);
                    let base = p.pos();
                    let n = p.advance(want.min(free));
                    assert!(n <= free);
                    for k in 0..n {
                        let (off, room) = p.at(base.wrapping_add(k as u64));
                        assert!(off < cap as usize && room >= 1 && off + room <= cap as usize);
                        ring[off] = next_in;
                        next_in = next_in.wrapping_add(1);
                    }
                    head = p.pos();
                }
                Err(e) => {
                    assert!(tampered, "refused an honest ring: {e}");
                    assert!(matches!(e, HeaderError::Positions { .. }));
                }
            },
            1 => match c.avail(|| head) {
                Ok(avail) => {
                    assert!(avail as u64 <= cap);
                    let base = c.pos();
                    let n = c.advance(want.min(avail));
                    for k in 0..n {
                        let (off, room) = c.at(base.wrapping_add(k as u64));
                        assert!(off < cap as usize && off + room <= cap as usize);
                        if !tampered {
                            assert_eq!(ring[off], next_out, "bytes out of order");
                        }
                        next_out = next_out.wrapping_add(1);
                    }
                    tail = c.pos();
                }
                Err(e) => {
                    assert!(tampered, "refused an honest ring: {e}");
                    assert!(matches!(e, HeaderError::Positions { .. }));
                }
            },
            2 => {
                head = arg;
                tampered = true;
            }
            _ => {
                tail = arg;
                tampered = true;
            }
        }
    }
});
