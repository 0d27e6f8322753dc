//! The pinned host buffers of the staged path, reused across steps.
//!
//! A buffer returns to the pool with the event of the last copy that uses it (a copy up
//! still queued behind the caller's kernels), and is handed out again only once that event
//! has completed, so a later tensor's result never overwrites one still on its way to the
//! device. [`Pool::take`] picks the smallest free buffer that fits and allocates one when
//! none does; at most [`KEEP`] buffers stay in the pool (beyond that, the returned buffer
//! whose copy is done, or else the oldest after waiting for its copy, is freed), so memory
//! stays bounded by the largest burst of tensors in flight. Dropping the pool waits for the
//! copies still using its buffers before freeing them.

use std::sync::Arc;

use super::StreamApi;
use crate::error::Result;

/// Most buffers kept for reuse.
pub const KEEP: usize = 256;

/// A pinned buffer and the event of the last copy that uses it, if any.
struct Entry<A: StreamApi> {
    buf: A::Pinned,
    busy: Option<A::Event>,
}

/// Free pinned buffers of one device.
pub struct Pool<A: StreamApi> {
    api: Arc<A>,
    free: Vec<Entry<A>>,
    allocated: usize,
}

impl<A: StreamApi> Drop for Pool<A> {
    fn drop(&mut self) {
        self.drain();
    }
}

impl<A: StreamApi> Pool<A> {
    /// An empty pool of `api`'s buffers.
    pub fn new(api: Arc<A>) -> Self {
        Pool {
            api,
            free: Vec::new(),
            allocated: 0,
        }
    }

    /// Buffers allocated so far (for tests and reports).
    pub fn allocated(&self) -> usize {
        self.allocated
    }

    /// Buffers in the pool now.
    pub fn len(&self) -> usize {
        self.free.len()
    }

    /// Whether the pool holds no buffer.
    pub fn is_empty(&self) -> bool {
        self.free.is_empty()
    }

    /// The smallest free buffer of at least `len` floats whose last copy is done, or a new
    /// one of `len` floats.
    pub fn take(&mut self, len: usize) -> Result<A::Pinned> {
        let mut best: Option<(usize, usize)> = None;
        for (i, e) in self.free.iter().enumerate() {
            let cap = A::pinned_len(&e.buf);
            if cap < len || best.is_some_and(|(_, c)| c <= cap) {
                continue;
            }
            let ready = match &e.busy {
                None => true,
                Some(ev) => self.api.is_done(ev)?,
            };
            if ready {
                best = Some((i, cap));
            }
        }
        if let Some((i, _)) = best {
            return Ok(self.free.swap_remove(i).buf);
        }
        let buf = self.api.alloc_pinned(len.max(1))?;
        self.allocated += 1;
        Ok(buf)
    }

    /// Returns `buf`, in use until `busy` completes (if given).
    pub fn give(&mut self, buf: A::Pinned, busy: Option<A::Event>) {
        self.free.push(Entry { buf, busy });
        if self.free.len() > KEEP {
            let done = self.free.iter().position(|e| match &e.busy {
                None => true,
                Some(ev) => self.api.is_done(ev).unwrap_or(false),
            });
            let i = done.unwrap_or(0);
            let e = self.free.remove(i);
            if let Some(ev) = &e.busy {
                // An error here is the device's; the buffer is freed either way.
                let _ = self.api.synchronize(ev);
            }
        }
    }

    /// Waits for every pending copy and frees every buffer.
    pub fn drain(&mut self) {
        for e in self.free.drain(..) {
            if let Some(ev) = &e.busy {
                let _ = self.api.synchronize(ev);
            }
        }
    }
}
