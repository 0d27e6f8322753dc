//! One single-producer single-consumer byte ring in a shared, memory-mapped file.
//!
//! The positions and their checks are [`super::cursor`]'s: every access is in bounds
//! whatever the peer writes. Data is published with a release store of `head` and
//! acknowledged with a release store of `tail`. Each side caches the other's position and
//! reloads it only when the cached one leaves it no room (producer) or no data (consumer),
//! so a small message costs one load of the peer's cache line per side.
//!
//! A ring file is opened only when this user owns it and its mode is 0600, never through a
//! symbolic link: another user who made a file under a ring's name cannot read or feed it.
//!
//! Sleeping: a party that has waited long enough sets its "asleep" flag in the header and
//! sleeps on the peer's position word with a futex ([`Ring::sleep`]); the peer, after
//! publishing its position, checks the flag (Dekker-style, a sequentially consistent fence
//! on both sides) and wakes it. The futex compares the low 32 bits of the position, which
//! cannot wrap around to the same value while the sleeper waits (the ring holds at most
//! 2^30 bytes), so no wake-up is lost. Futex waits always have a timeout: a peer that never
//! wakes us (it died) is still noticed by the caller's checks.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::cursor::{Cursor, End};
use super::header::{
    self, HeaderError, RingHeader, HEADER_LEN, OFF_CONSUMER_ASLEEP, OFF_CONSUMER_PID,
    OFF_CONSUMER_STATE, OFF_HEAD, OFF_PRODUCER_ABORT, OFF_PRODUCER_ASLEEP, OFF_PRODUCER_PID,
    OFF_PRODUCER_STATE, OFF_TAIL,
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
    role: Role,
    /// Our position and the peer's as last loaded.
    cursor: Cursor,
    /// Whether we claimed our role in the header (only then do we mark it closed on drop).
    claimed: bool,
}

// SAFETY: the mapping is owned by this value and only touched through `&mut self` (or atomics).
unsafe impl Send for Ring {}

impl Ring {
    /// Creates a fresh ring file at `path` (mode 0600, whatever the umask) with header `h`,
    /// atomically: it is written under a temporary name and renamed into place.
    pub(crate) fn create(path: &Path, h: &RingHeader) -> io::Result<()> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.set_len(HEADER_LEN as u64 + h.capacity)?;
        let mut hdr = vec![0u8; HEADER_LEN];
        header::encode(h, &mut hdr);
        std::os::unix::fs::FileExt::write_all_at(&f, &hdr, 0)?;
        std::fs::rename(&tmp, path)
    }

    /// Maps the ring file at `path` (its pages faulted in with `populate`, see `map`), checks
    /// its header, and claims `role` in it.
    /// `Ok(None)` when the role is already taken (a stale file of an earlier job).
    pub(crate) fn open(
        path: &Path,
        role: Role,
        expect: &RingHeader,
        populate: bool,
    ) -> Result<Option<Ring>, OpenError> {
        let f = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(HeaderError::Link.into()),
            Err(e) => return Err(e.into()),
        };
        let meta = f.metadata()?;
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if !meta.file_type().is_file() || meta.uid() != me || meta.mode() & 0o7777 != 0o600 {
            return Err(HeaderError::NotOurs {
                uid: meta.uid(),
                mode: meta.mode() & 0o7777,
            }
            .into());
        }
        let file_len = meta.len();
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
        let ring = Ring::map(&f, file_len as usize, h.capacity, role, populate)?;
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
        let pos = match role {
            Role::Producer => ring.u64_at(OFF_HEAD).load(Ordering::Acquire),
            Role::Consumer => ring.u64_at(OFF_TAIL).load(Ordering::Acquire),
        };
        ring.cursor = Cursor::new(ring.cursor.end(), h.capacity, pos)?;
        Ok(Some(ring))
    }

    /// Maps the whole file; with `populate`, its pages are faulted in now (`MAP_POPULATE`):
    /// otherwise the first lap through the ring takes a page fault per 4 KiB page on each
    /// side, which on the benchmark's first size (4 KiB all-reduce, 200 iterations: most of
    /// a 1 MiB ring's first lap) measured 6.4-8.9 us per all-reduce against 2.0-2.4 us once
    /// warm. (The caller leaves it off when the job's rings would fill much of the file
    /// system: pages of rings no algorithm uses would take room from the ones in use.)
    fn map(
        f: &File,
        map_len: usize,
        capacity: u64,
        role: Role,
        populate: bool,
    ) -> io::Result<Ring> {
        let populate = if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a fresh shared mapping of the whole file; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | populate,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let end = match role {
            Role::Producer => End::Producer,
            Role::Consumer => End::Consumer,
        };
        let base = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        let ring = Ring {
            base,
            map_len,
            role,
            // A placeholder position until `open` reads ours; the capacity is the header's,
            // decoded and checked already.
            cursor: Cursor::new(end, capacity, 0)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
            claimed: false,
        };
        Ok(ring)
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

    /// (resident pages, pages) of the whole mapping, as `mincore` reports them (tests of
    /// the up-front population).
    #[cfg(test)]
    pub(crate) fn resident_pages(&self) -> (usize, usize) {
        let pages = self.map_len.div_ceil(4096);
        let mut v = vec![0u8; pages];
        // SAFETY: `base..base+map_len` is our mapping; `v` has a byte per 4 KiB page.
        let r = unsafe { libc::mincore(self.base.as_ptr().cast(), self.map_len, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: {}", io::Error::last_os_error());
        (v.iter().filter(|&&b| b & 1 == 1).count(), pages)
    }

    /// A way to load the peer's position freshly from the header, apart from the borrow of
    /// the cursor that asks for it.
    fn peer_loader(&self) -> impl FnOnce() -> u64 {
        let off = match self.role {
            Role::Producer => OFF_TAIL,
            Role::Consumer => OFF_HEAD,
        };
        let word: *const AtomicU64 = self.u64_at(off);
        // SAFETY: the word lies in our mapping, which lives as long as `self`; the loader is
        // used at once, within the `&mut self` call that made it.
        move || unsafe { (*word).load(Ordering::Acquire) }
    }

    /// Publishes our position, and wakes the peer if it sleeps on it.
    fn publish(&self) {
        let (pos_off, asleep_off) = match self.role {
            Role::Producer => (OFF_HEAD, OFF_CONSUMER_ASLEEP),
            Role::Consumer => (OFF_TAIL, OFF_PRODUCER_ASLEEP),
        };
        self.u64_at(pos_off)
            .store(self.cursor.pos(), Ordering::Release);
        // Pairs with the fence in `sleep`: either the sleeper sees our position, or we see
        // its flag.
        fence(Ordering::SeqCst);
        if self.u32_at(asleep_off).load(Ordering::Relaxed) != 0 {
            futex_wake(self.u32_at(pos_off));
        }
    }

    /// Sleeps until the peer moves its position (new data for a consumer, new room for a
    /// producer), at most `timeout` (spurious wake-ups are possible).
    pub(crate) fn sleep(&self, timeout: Duration) {
        let (peer_off, asleep_off) = match self.role {
            Role::Producer => (OFF_TAIL, OFF_PRODUCER_ASLEEP),
            Role::Consumer => (OFF_HEAD, OFF_CONSUMER_ASLEEP),
        };
        let asleep = self.u32_at(asleep_off);
        asleep.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let word = self.u32_at(peer_off);
        // The low half of the little-endian u64 position.
        let seen = self.cursor.peer_pos() as u32;
        if word.load(Ordering::Relaxed) == seen {
            futex_wait(word, seen, timeout);
        }
        asleep.store(0, Ordering::Relaxed);
    }

    /// Pointer to the data byte at stream position `pos`, and how many bytes follow it
    /// before the end of the data area.
    fn at(&self, pos: u64) -> (*mut u8, usize) {
        let (off, room) = self.cursor.at(pos);
        // SAFETY: off < capacity, and the data area [HEADER_LEN, HEADER_LEN + capacity) is
        // mapped (the file length was checked against the capacity).
        let p = unsafe { self.base.as_ptr().add(HEADER_LEN + off) };
        (p, room)
    }

    /// Producer: copies as much of `a` then `b` as fits, published at once; returns the
    /// bytes written (of `a` first).
    pub(crate) fn write_parts(&mut self, a: &[u8], b: &[u8]) -> Result<usize, HeaderError> {
        debug_assert_eq!(self.role, Role::Producer);
        let load = self.peer_loader();
        let free = self.cursor.free(a.len() + b.len(), load)?;
        let start = self.cursor.pos();
        let mut done = 0;
        for part in [a, b] {
            let n = (free - done).min(part.len());
            self.copy_in(start.wrapping_add(done as u64), &part[..n]);
            done += n;
        }
        if done > 0 {
            self.cursor.advance(done);
            self.publish();
        }
        Ok(done)
    }

    /// Copies `src` into the data area from stream position `at` on (wrapping around).
    fn copy_in(&self, at: u64, src: &[u8]) {
        let mut done = 0;
        while done < src.len() {
            let (p, room) = self.at(at.wrapping_add(done as u64));
            let k = room.min(src.len() - done);
            // SAFETY: `p..p+k` lies in the data area (see `at`) and in the free part of
            // the ring (the caller checked `free`), which the consumer does not read until
            // `head` is published.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().add(done), p, k) };
            done += k;
        }
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
        let load = self.peer_loader();
        let n = self.cursor.avail(load)?.min(len);
        let tail = self.cursor.pos();
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
            self.cursor.advance(n);
            self.publish();
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

/// Sleeps while `*word == seen`, at most `timeout` (a shared, not process-private, futex:
/// the word lives in a mapping shared with another process).
#[cfg(target_os = "linux")]
fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the whole call; `ts` outlives it. Any
    // outcome (woken, timed out, value changed, interrupted) is fine for the caller, which
    // rechecks the ring.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every sleeper on `word`.
#[cfg(target_os = "linux")]
fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE only reads its address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Without futexes: a short sleep (the peer cannot wake us).
#[cfg(not(target_os = "linux"))]
fn futex_wait(_word: &AtomicU32, _seen: u32, timeout: Duration) {
    std::thread::sleep(timeout.min(Duration::from_micros(50)));
}

#[cfg(not(target_os = "linux"))]
fn futex_wake(_word: &AtomicU32) {}

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
