//! The chunk schedule of the host-transfer all-reduce, without any device: which chunk is
//! copied down, reduced over the wire, and copied back at each stage, and which pinned host
//! slot each uses.
//!
//! Aluminum's host-transfer algorithm overlaps three things: while chunk `c` is on the wire,
//! chunk `c + 1` is being copied device → host and chunk `c - 1` host → device. With
//! [`SLOTS`] pinned buffers used round-robin, chunk `c + 2`'s copy down into slot
//! `(c + 2) % 3` must wait only for chunk `c - 1`'s copy up out of the same slot.

use std::ops::Range;

/// Pinned host buffers in flight.
pub const SLOTS: usize = 3;

/// The chunks of a buffer of `n` elements, `chunk` elements each (the last shorter).
pub fn chunks(n: usize, chunk: usize) -> Vec<Range<usize>> {
    let chunk = chunk.max(1);
    (0..n)
        .step_by(chunk)
        .map(|a| a..(a + chunk).min(n))
        .collect()
}

/// The pinned slot chunk `c` uses.
pub fn slot(c: usize) -> usize {
    c % SLOTS
}

/// The chunk whose copy back to the device must finish before chunk `c`'s copy down may
/// overwrite its slot, if any.
pub fn reuses(c: usize) -> Option<usize> {
    c.checked_sub(SLOTS)
}

/// How many chunk copies down are issued ahead of the one on the wire.
pub const AHEAD: usize = SLOTS - 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_buffer_in_order() {
        assert_eq!(chunks(10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(chunks(0, 4), Vec::<Range<usize>>::new());
        assert_eq!(chunks(3, 0), vec![0..1, 1..2, 2..3]);
    }

    /// Simulates the schedule: no slot is written while a chunk still in flight owns it.
    #[test]
    fn no_slot_is_overwritten_while_in_use() {
        let n = 11;
        // owner[s] = chunk whose data is in slot s and not yet copied back.
        let mut owner: [Option<usize>; SLOTS] = [None; SLOTS];
        let mut issued = 0;
        for c in 0..n {
            while issued < n && issued <= c + AHEAD {
                let s = slot(issued);
                // The copy down waits for the reused chunk's copy up, which the schedule
                // issues when that chunk leaves the wire (before chunk issued - SLOTS + 1's).
                if let Some(old) = owner[s] {
                    assert_eq!(Some(old), reuses(issued), "slot {s} reused by {issued}");
                    assert!(
                        old < c,
                        "chunk {old} still on the wire when {issued} reuses its slot"
                    );
                }
                owner[s] = Some(issued);
                issued += 1;
            }
            // chunk c goes over the wire, then up: its slot is free once the copy up is done.
            assert_eq!(owner[slot(c)], Some(c));
        }
    }
}
