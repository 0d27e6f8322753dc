//! A small per-thread pool of scratch buffers, so a steady state of collectives allocates
//! nothing. Buffers are 8-byte aligned words, viewed as `[E]` or bytes as needed.

use std::cell::RefCell;

use crate::Element;

/// How many idle buffers a thread keeps.
const POOL_MAX: usize = 4;

thread_local! {
    static POOL: RefCell<Vec<Vec<u64>>> = const { RefCell::new(Vec::new()) };
}

/// A scratch buffer borrowed from this thread's pool; returned on drop.
pub(crate) struct Scratch {
    words: Vec<u64>,
}

impl Scratch {
    /// Takes a buffer from the pool (or a new, empty one).
    pub(crate) fn take() -> Scratch {
        let words = POOL
            .try_with(|p| p.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_default();
        Scratch { words }
    }

    /// A view of `n` elements (contents unspecified), growing the buffer if needed.
    pub(crate) fn elems<E: Element>(&mut self, n: usize) -> &mut [E] {
        let bytes = n * std::mem::size_of::<E>();
        let words = bytes.div_ceil(8);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
        let all: &mut [u8] = bytemuck::cast_slice_mut(&mut self.words[..]);
        bytemuck::cast_slice_mut(&mut all[..bytes])
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let words = std::mem::take(&mut self.words);
        if words.capacity() == 0 {
            return;
        }
        let _ = POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < POOL_MAX {
                p.push(words);
            }
        });
    }
}

/// Frees this thread's idle scratch buffers (they are kept for reuse otherwise; their size
/// is bounded by the largest segment or message exchanged).
pub fn release_scratch() {
    let _ = POOL.try_with(|p| p.borrow_mut().clear());
}
