//! One single-producer single-consumer byte ring in a shared, memory-mapped file.
//!
//! `head` (bytes written) belongs to the producer and `tail` (bytes read) to the consumer;
//! both only grow, and a position maps to the data area modulo the capacity (a power of two),
//! so every access is in bounds whatever the peer writes. Data is published with a release
//! store of `head` and acknowledged with a release store of `tail`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::header::{
    self, HeaderError, RingHeader, HEADER_LEN, OFF_CONSUMER_PID, OFF_CONSUMER_STATE, OFF_HEAD,
    OFF_PRODUCER_ABORT, OFF_PRODUCER_PID, OFF_PRODUCER_STATE, OFF_TAIL,
};

/// A party's state in the header: not yet joined.
pub(crate) const STATE_EMPTY: u32 = 0;
/// Joined and working.
pub(crate) const STATE_JOINED: u32 = 1;
/// Left cleanly (dropped).
pub(crate) const STATE_CLOSED: u32 = 2;

/// Which end of a ring this process holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Producer,
    Consumer,
}

/// A mapped ring file.
pub(crate) struct Ring {
    base: NonNull<u8>,
    map_len: usize,
    capacity: u64,
    role: Role,
    /// Our copy of our own position (we are its only writer).
    pos: u64,
    /// Whether we claimed our role in the header (only then do we mark it closed on drop).
    claimed: bool,
}

// SAFETY: the mapping is owned by this value and only touched through `&mut self` (or atomics).
unsafe impl Send for Ring {}

impl Ring {
    /// Creates a fresh ring file at `path` (mode 0600) with header `h`, atomically: it is
    /// written under a temporary name and renamed into place.
    pub(crate) fn create(path: &Path, h: &RingHeader) -> io::Result<()> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.set_len(HEADER_LEN as u64 + h.capacity)?;
        let mut hdr = vec![0u8; HEADER_LEN];
        header::encode(h, &mut hdr);
        std::os::unix::fs::FileExt::write_all_at(&f, &hdr, 0)?;
        std::fs::rename(&tmp, path)
    }

    /// Maps the ring file at `path`, checks its header, and claims `role` in it.
    /// `Ok(None)` when the role is already taken (a stale file of an earlier job).
    pub(crate) fn open(
        path: &Path,
        role: Role,
        expect: &RingHeader,
    ) -> Result<Option<Ring>, OpenError> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        let file_len = f.metadata()?.len();
        let mut hdr = vec![0u8; HEADER_LEN.min(file_len as usize)];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut hdr, 0)?;
        let h = header::decode(&hdr, file_len)?;
        if h.job != expect.job {
            return Err(HeaderError::Mismatch { what: "job" }.into());
        }
        if (h.src, h.dst, h.world_size) != (expect.src, expect.dst, expect.world_size) {
            return Err(HeaderError::Mismatch {
                what: "pair of ranks or world size",
            }
            .into());
        }
        let ring = Ring::map(&f, file_len as usize, h.capacity, role)?;
        let (pid_off, state_off) = match role {
            Role::Producer => (OFF_PRODUCER_PID, OFF_PRODUCER_STATE),
            Role::Consumer => (OFF_CONSUMER_PID, OFF_CONSUMER_STATE),
        };
        if ring
            .u32_at(state_off)
            .compare_exchange(
                STATE_EMPTY,
                STATE_JOINED,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return Ok(None);
        }
        let mut ring = ring;
        ring.claimed = true;
        ring.u32_at(pid_off)
            .store(std::process::id(), Ordering::Release);
        ring.pos = match role {
            Role::Producer => ring.u64_at(OFF_HEAD).load(Ordering::Acquire),
            Role::Consumer => ring.u64_at(OFF_TAIL).load(Ordering::Acquire),
        };
        Ok(Some(ring))
    }

    fn map(f: &File, map_len: usize, capacity: u64, role: Role) -> io::Result<Ring> {
        // SAFETY: a fresh shared mapping of the whole file; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Ring {
            base: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?,
            map_len,
            capacity,
            role,
            pos: 0,
            claimed: false,
        })
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= HEADER_LEN && off.is_multiple_of(4));
        // SAFETY: `off` is a fixed, aligned offset inside the mapped header page, which
        // lives as long as `self`; shared memory is only accessed atomically here.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU32) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= HEADER_LEN && off.is_multiple_of(8));
        // SAFETY: as in `u32_at`.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU64) }
    }

    /// The other party's (state, pid).
    pub(crate) fn peer(&self) -> (u32, u32) {
        let (pid_off, state_off) = match self.role {
            Role::Producer => (OFF_CONSUMER_PID, OFF_CONSUMER_STATE),
            Role::Consumer => (OFF_PRODUCER_PID, OFF_PRODUCER_STATE),
        };
        let state = self.u32_at(state_off).load(Ordering::Acquire);
        (state, self.u32_at(pid_off).load(Ordering::Acquire))
    }

    /// Producer: tells the consumer that rank `failed` failed (the job is over).
    pub(crate) fn report_failure(&self, failed: usize) {
        let v = u32::try_from(failed + 1).unwrap_or(u32::MAX);
        self.u32_at(OFF_PRODUCER_ABORT).store(v, Ordering::Release);
    }

    /// Consumer: the failed rank the producer reported, if any.
    pub(crate) fn reported_failure(&self) -> Option<usize> {
        match self.u32_at(OFF_PRODUCER_ABORT).load(Ordering::Acquire) {
            0 => None,
            v => Some(v as usize - 1),
        }
    }

    /// Marks our end closed, so the peer gets a clean "closed" instead of waiting.
    pub(crate) fn close(&self) {
        let off = match self.role {
            Role::Producer => OFF_PRODUCER_STATE,
            Role::Consumer => OFF_CONSUMER_STATE,
        };
        self.u32_at(off).store(STATE_CLOSED, Ordering::Release);
    }

    /// Overwrites the shared head (tests of a corrupt peer).
    #[cfg(test)]
    pub(crate) fn corrupt_head(&self, v: u64) {
        self.u64_at(OFF_HEAD).store(v, Ordering::Release);
    }

    /// Head and tail, checked: never more than the capacity apart.
    fn positions(&self) -> Result<(u64, u64), HeaderError> {
        let (head, tail) = match self.role {
            Role::Producer => (self.pos, self.u64_at(OFF_TAIL).load(Ordering::Acquire)),
            Role::Consumer => (self.u64_at(OFF_HEAD).load(Ordering::Acquire), self.pos),
        };
        if head.wrapping_sub(tail) > self.capacity {
            return Err(HeaderError::Positions {
                head,
                tail,
                capacity: self.capacity,
            });
        }
        Ok((head, tail))
    }

    /// Pointer to the data byte at stream position `pos`, and how many bytes follow it
    /// before the end of the data area.
    fn at(&self, pos: u64) -> (*mut u8, usize) {
        let off = (pos & (self.capacity - 1)) as usize;
        // SAFETY: off < capacity, and the data area [HEADER_LEN, HEADER_LEN + capacity) is
        // mapped (the file length was checked against the capacity).
        let p = unsafe { self.base.as_ptr().add(HEADER_LEN + off) };
        (p, self.capacity as usize - off)
    }

    /// Producer: copies as much of `src` as fits; returns the bytes written.
    pub(crate) fn write_some(&mut self, src: &[u8]) -> Result<usize, HeaderError> {
        debug_assert_eq!(self.role, Role::Producer);
        let (head, tail) = self.positions()?;
        let free = (self.capacity - head.wrapping_sub(tail)) as usize;
        let n = free.min(src.len());
        let mut done = 0;
        while done < n {
            let (p, room) = self.at(head.wrapping_add(done as u64));
            let k = room.min(n - done);
            // SAFETY: `p..p+k` lies in the data area (see `at`) and in the free part of
            // the ring, which the consumer does not read until `head` is published.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(done), p, k) };
            done += k;
        }
        if n > 0 {
            self.pos = head.wrapping_add(n as u64);
            self.u64_at(OFF_HEAD).store(self.pos, Ordering::Release);
        }
        Ok(n)
    }

    /// Consumer: copies up to `dst.len()` available bytes into `dst` (raw, so a caller can
    /// fill a `Vec`'s spare capacity); returns the bytes read.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes.
    pub(crate) unsafe fn read_some(
        &mut self,
        dst: *mut u8,
        len: usize,
    ) -> Result<usize, HeaderError> {
        debug_assert_eq!(self.role, Role::Consumer);
        let (head, tail) = self.positions()?;
        let n = (head.wrapping_sub(tail) as usize).min(len);
        let mut done = 0;
        while done < n {
            let (p, room) = self.at(tail.wrapping_add(done as u64));
            let k = room.min(n - done);
            // SAFETY: `p..p+k` is in the data area and was published by the producer;
            // the caller vouches for `dst`.
            unsafe { std::ptr::copy_nonoverlapping(p, dst.add(done), k) };
            done += k;
        }
        if n > 0 {
            self.pos = tail.wrapping_add(n as u64);
            self.u64_at(OFF_TAIL).store(self.pos, Ordering::Release);
        }
        Ok(n)
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if self.claimed {
            self.close();
        }
        // SAFETY: unmapping exactly the region mapped in `map`; no references outlive self.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

/// Why a ring could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    Io(io::Error),
    Header(HeaderError),
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> Self {
        OpenError::Io(e)
    }
}

impl From<HeaderError> for OpenError {
    fn from(e: HeaderError) -> Self {
        OpenError::Header(e)
    }
}
