//! The position arithmetic of one end of a ring, apart from its memory: how many bytes that
//! end may write or read, and where, given the positions it loads from the ring's header,
//! which the peer may have set to anything.
//!
//! `head` (bytes written) belongs to the producer and `tail` (bytes read) to the consumer;
//! both only grow, and a position maps to the data area modulo the capacity (a power of
//! two), so every offset is in bounds whatever the peer wrote. A loaded position is checked
//! (never more than the capacity apart from ours, never behind it) before it is used; one out
//! of line is [`HeaderError::Positions`]. Each end caches the peer's position and reloads it
//! only when the cached one leaves it no room (producer) or no data (consumer).
//!
//! Pure, so it is fuzzed against a model of a ring with a hostile peer
//! (`fuzz/fuzz_targets/shm_ring_state.rs`).

use super::header::{HeaderError, MAX_CAPACITY, MIN_CAPACITY};

/// Which end of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Writes, and owns `head`.
    Producer,
    /// Reads, and owns `tail`.
    Consumer,
}

/// One end's positions: its own, and the peer's as last loaded and checked.
#[derive(Debug, Clone)]
pub struct Cursor {
    end: End,
    capacity: u64,
    /// Our own position (we are its only writer).
    pos: u64,
    /// The peer's position as last loaded (checked against ours when loaded).
    peer_pos: u64,
}

impl Cursor {
    /// An end of a ring of `capacity` data bytes (a power of two in
    /// [`MIN_CAPACITY`]..=[`MAX_CAPACITY`]) whose own position is `pos` (the peer's is taken
    /// to be the same until loaded).
    pub fn new(end: End, capacity: u64, pos: u64) -> Result<Cursor, HeaderError> {
        if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
            return Err(HeaderError::Size { what: "capacity" });
        }
        Ok(Cursor {
            end,
            capacity,
            pos,
            peer_pos: pos,
        })
    }

    /// Which end this is.
    pub fn end(&self) -> End {
        self.end
    }

    /// Our own position.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The peer's position as last loaded.
    pub fn peer_pos(&self) -> u64 {
        self.peer_pos
    }

    /// The capacity.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Head and tail with the peer's position freshly `loaded`, checked: head never behind
    /// tail, never more than the capacity ahead. Only a checked position is cached.
    pub fn positions(&mut self, loaded: u64) -> Result<(u64, u64), HeaderError> {
        let (head, tail) = match self.end {
            End::Producer => (self.pos, loaded),
            End::Consumer => (loaded, self.pos),
        };
        if head.wrapping_sub(tail) > self.capacity {
            return Err(HeaderError::Positions {
                head,
                tail,
                capacity: self.capacity,
            });
        }
        self.peer_pos = loaded;
        Ok((head, tail))
    }

    /// Producer: free bytes, from the cached tail while it leaves room for `want` bytes,
    /// else from a fresh one (`load`).
    pub fn free(&mut self, want: usize, load: impl FnOnce() -> u64) -> Result<usize, HeaderError> {
        let cached = self.room();
        if cached >= want as u64 {
            return Ok(to_usize(cached));
        }
        let (head, tail) = self.positions(load())?;
        Ok(to_usize(self.capacity - head.wrapping_sub(tail)))
    }

    /// Consumer: readable bytes, from the cached head while it has any, else from a fresh
    /// one (`load`).
    pub fn avail(&mut self, load: impl FnOnce() -> u64) -> Result<usize, HeaderError> {
        let cached = self.room();
        if cached > 0 {
            return Ok(to_usize(cached));
        }
        let (head, tail) = self.positions(load())?;
        Ok(to_usize(head.wrapping_sub(tail)))
    }

    /// What the cached positions leave us: free bytes for a producer, readable ones for a
    /// consumer (at most the capacity: the cached position was checked).
    fn room(&self) -> u64 {
        let used = match self.end {
            End::Producer => self.pos.wrapping_sub(self.peer_pos),
            End::Consumer => self.peer_pos.wrapping_sub(self.pos),
        }
        .min(self.capacity);
        match self.end {
            End::Producer => self.capacity - used,
            End::Consumer => used,
        }
    }

    /// The offset in the data area of stream position `pos`, and how many bytes follow it
    /// before the end of the data area (at least one; together never past the capacity).
    pub fn at(&self, pos: u64) -> (usize, usize) {
        let off = pos & (self.capacity - 1);
        (to_usize(off), to_usize(self.capacity - off))
    }

    /// Moves our own position past `n` bytes written (producer) or read (consumer), at most
    /// as many as the cached positions leave room for; returns how many it moved.
    pub fn advance(&mut self, n: usize) -> usize {
        let n = (n as u64).min(self.room());
        self.pos = self.pos.wrapping_add(n);
        to_usize(n)
    }
}

/// A count of at most the capacity (2^30) as `usize`.
fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn a_fresh_ring_and_a_full_one() {
        let mut p = Cursor::new(End::Producer, 4096, 0).unwrap();
        let mut c = Cursor::new(End::Consumer, 4096, 0).unwrap();
        assert_eq!(p.free(10, || 0).unwrap(), 4096);
        assert_eq!(c.avail(|| 0).unwrap(), 0);
        assert_eq!(p.advance(5000), 4096);
        assert_eq!(p.free(1, || 0).unwrap(), 0);
        assert_eq!(c.avail(|| 4096).unwrap(), 4096);
        assert_eq!(c.advance(100), 100);
        assert_eq!(p.free(1, || 100).unwrap(), 100);
        assert_eq!(p.at(4096 + 7), (7, 4089));
        assert!(Cursor::new(End::Producer, 1000, 0).is_err());
    }

    #[test]
    fn positions_out_of_line_are_refused() {
        let mut p = Cursor::new(End::Producer, 4096, 10).unwrap();
        // The consumer claims to have read more than was written, or too little.
        assert!(matches!(
            p.positions(11),
            Err(HeaderError::Positions { .. })
        ));
        assert!(matches!(
            p.free(4097, || 5000),
            Err(HeaderError::Positions { .. })
        ));
        let mut c = Cursor::new(End::Consumer, 4096, 10).unwrap();
        assert!(matches!(
            c.avail(|| 10 + 4097),
            Err(HeaderError::Positions { .. })
        ));
        assert!(matches!(c.avail(|| 9), Err(HeaderError::Positions { .. })));
        // A refused position is not cached.
        assert_eq!(c.avail(|| 10).unwrap(), 0);
    }

    /// A cheap stand-in for the fuzz target: a producer and a consumer over a model ring,
    /// with a peer that now and then writes anything into the shared positions. Offsets stay
    /// in bounds, counts within the capacity, and while nobody tampered, the bytes come out
    /// as they went in.
    #[test]
    fn a_model_ring_with_a_hostile_peer() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..200 {
            let cap = 4096u64 << rng.gen_range(0..3);
            let start = if round % 2 == 0 { 0 } else { u64::MAX - 5000 };
            let mut p = Cursor::new(End::Producer, cap, start).unwrap();
            let mut c = Cursor::new(End::Consumer, cap, start).unwrap();
            let (mut head, mut tail) = (start, start);
            let mut data = vec![0u8; cap as usize];
            let (mut next_in, mut next_out) = (0u8, 0u8);
            let mut tampered = false;
            for _ in 0..300 {
                match rng.gen_range(0..10) {
                    0..=3 => {
                        let want = rng.gen_range(0..3 * cap as usize);
                        if let Ok(free) = p.free(want, || tail) {
                            assert!(free as u64 <= cap);
                            let base = p.pos();
                            let n = p.advance(want.min(free));
                            for k in 0..n {
                                let (off, room) = p.at(base.wrapping_add(k as u64));
                                assert!(off < cap as usize && room >= 1);
                                data[off] = next_in;
                                next_in = next_in.wrapping_add(1);
                            }
                            head = p.pos();
                        }
                    }
                    4..=7 => {
                        let want = rng.gen_range(0..3 * cap as usize);
                        if let Ok(avail) = c.avail(|| head) {
                            assert!(avail as u64 <= cap);
                            let base = c.pos();
                            let n = c.advance(want.min(avail));
                            for k in 0..n {
                                let (off, _) = c.at(base.wrapping_add(k as u64));
                                if !tampered {
                                    assert_eq!(data[off], next_out);
                                }
                                next_out = next_out.wrapping_add(1);
                            }
                            tail = c.pos();
                        }
                    }
                    8 => {
                        head = rng.gen();
                        tampered = true;
                    }
                    _ => {
                        tail = tail.wrapping_add(rng.gen_range(0..2 * cap));
                        tampered = true;
                    }
                }
            }
        }
    }
}
