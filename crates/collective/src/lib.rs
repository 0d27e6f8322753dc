//! gradwire-collective: collective algorithms over any [`Transport`].
//!
//! This layer owns the algorithms that combine every rank's buffer — all-reduce
//! (ring, recursive doubling, Rabenseifner, chosen by size in [`select`]), reduce-scatter,
//! all-gather (equal and variable sizes), broadcast and barrier — and, in [`compressed`],
//! the all-reduces that carry codec payloads; [`hierarchical`] is Horovod's hierarchical
//! all-reduce over a host's shared memory and one network path per host. It sees only `rank`, `world_size` and
//! point-to-point messages; it must never know how bytes move (sockets, channels, MPI) or
//! what a model or an optimizer is.
//!
//! Every operation comes from the [`Collectives`] extension trait, implemented for every
//! `Transport` (including `Box<dyn Transport>`), so callers write `t.all_reduce(..)`.
//! All ranks must call the same collectives in the same order with the same lengths; a
//! length mismatch fails with an error naming a rank rather than hanging.
//!
//! ```
//! use gradwire_collective::{Collectives, ReduceOp, Transport};
//! use gradwire_transport::local::Local;
//!
//! let handles: Vec<_> = Local::world(4)
//!     .into_iter()
//!     .map(|mut t| {
//!         std::thread::spawn(move || {
//!             let r = t.rank() as f32;
//!             let mut grad = vec![r, 10.0 * r, 1.0];
//!             t.all_reduce(&mut grad, ReduceOp::Sum).unwrap();
//!             grad
//!         })
//!     })
//!     .collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap(), vec![6.0, 60.0, 4.0]);
//! }
//! ```
#![deny(missing_docs)]

pub mod bench;
pub mod broadcast;
pub mod chunks;
pub mod compressed;
mod element;
mod error;
mod exchange;
pub mod fold;
pub mod gather;
pub mod hierarchical;
pub mod rabenseifner;
pub mod recursive_doubling;
#[cfg(any(test, feature = "test-util"))]
pub mod reference;
pub mod ring;
mod scratch;
pub mod select;

#[cfg(test)]
mod tests;

use std::ops::Range;

pub use element::{Element, ParseReduceOpError, ReduceOp};
pub use error::{Error, Result};
pub use gradwire_transport::Transport;
pub use scratch::release_scratch;
pub use select::{Algorithm, CollectiveConfig, ParseAlgorithmError};

/// All-reduce with an explicit segment size (what [`Collectives::all_reduce_with`] calls
/// with [`select::segment_bytes`]).
pub fn all_reduce<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    algo: Algorithm,
    seg_bytes: usize,
) -> Result<()> {
    let world = t.world_size();
    if world == 1 {
        return Ok(());
    }
    match select::resolve(algo, std::mem::size_of_val(buf), world) {
        Algorithm::Ring => ring::all_reduce(t, buf, op, seg_bytes),
        Algorithm::RecursiveDoubling | Algorithm::Auto => {
            recursive_doubling::all_reduce(t, buf, op, seg_bytes)
        }
        Algorithm::Rabenseifner => rabenseifner::all_reduce(t, buf, op, seg_bytes),
    }
}

/// All-reduce with explicit [`CollectiveConfig`] settings: `Auto` resolves by size only
/// ([`CollectiveConfig::resolve`]), never from the environment.
pub fn all_reduce_config<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    config: &CollectiveConfig,
) -> Result<()> {
    let world = t.world_size();
    let algo = config.resolve(std::mem::size_of_val(buf), world);
    all_reduce(t, buf, op, algo, config.segment_bytes())
}

/// Reduce-scatter with an explicit segment size: the ring, or recursive halving on
/// power-of-two worlds when `algo` resolves to recursive doubling or Rabenseifner.
pub fn reduce_scatter<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    op: ReduceOp,
    algo: Algorithm,
    seg_bytes: usize,
) -> Result<Range<usize>> {
    let world = t.world_size();
    match select::resolve(algo, std::mem::size_of_val(buf), world) {
        Algorithm::Ring => ring::reduce_scatter(t, buf, op, seg_bytes),
        _ => rabenseifner::reduce_scatter(t, buf, op, seg_bytes),
    }
}

/// All-gather in place with an explicit segment size: the ring, or recursive doubling on
/// power-of-two worlds when `algo` resolves to recursive doubling or Rabenseifner.
pub fn all_gather<T: Transport + ?Sized, E: Element>(
    t: &mut T,
    buf: &mut [E],
    algo: Algorithm,
    seg_bytes: usize,
) -> Result<()> {
    let world = t.world_size();
    match select::resolve(algo, std::mem::size_of_val(buf), world) {
        Algorithm::Ring => ring::all_gather(t, buf, seg_bytes),
        _ => rabenseifner::all_gather(t, buf, seg_bytes),
    }
}

/// Collective operations on every [`Transport`] (blanket impl, rsmpi style).
///
/// Every rank of the world must make the same calls in the same order, with buffers of the
/// same length (and the same `root`, `op` and algorithm).
pub trait Collectives: Transport {
    /// All-reduces `buf` in place with `op`, the algorithm chosen by size
    /// ([`select::choose`], or `GRADWIRE_ALGO`).
    fn all_reduce<E: Element>(&mut self, buf: &mut [E], op: ReduceOp) -> Result<()> {
        self.all_reduce_with(buf, op, Algorithm::Auto)
    }

    /// All-reduces `buf` in place with `op` using `algo`.
    fn all_reduce_with<E: Element>(
        &mut self,
        buf: &mut [E],
        op: ReduceOp,
        algo: Algorithm,
    ) -> Result<()> {
        all_reduce(self, buf, op, algo, select::segment_bytes())
    }

    /// Reduce-scatter in place: returns the range of `buf` this rank owns
    /// ([`chunks::range`]`(len, world, rank)`), reduced over all ranks; the rest of `buf`
    /// is left with partial sums.
    fn reduce_scatter<E: Element>(&mut self, buf: &mut [E], op: ReduceOp) -> Result<Range<usize>> {
        reduce_scatter(self, buf, op, Algorithm::Auto, select::segment_bytes())
    }

    /// All-gather in place: each rank's chunk [`chunks::range`]`(len, world, rank)` of `buf`
    /// is copied into every rank's `buf`.
    fn all_gather<E: Element>(&mut self, buf: &mut [E]) -> Result<()> {
        all_gather(self, buf, Algorithm::Auto, select::segment_bytes())
    }

    /// All-gather of equal-size contributions: `out[r * mine.len()..][..mine.len()]` receives
    /// rank `r`'s `mine`; `out.len()` must be `world * mine.len()`.
    fn all_gather_into<E: Element>(&mut self, mine: &[E], out: &mut [E]) -> Result<()> {
        gather::all_gather_into(self, mine, out, select::segment_bytes())
    }

    /// All-gather of byte payloads of any size per rank: `out[r]` receives rank `r`'s
    /// `mine` (`out` is resized to the world size; its buffers are reused).
    fn all_gather_bytes(&mut self, mine: &[u8], out: &mut Vec<Vec<u8>>) -> Result<()> {
        gather::all_gather_bytes(self, mine, out)
    }

    /// Broadcasts `buf` from rank `root` to every rank.
    fn broadcast<E: Element>(&mut self, buf: &mut [E], root: usize) -> Result<()> {
        broadcast::broadcast(self, buf, root, select::segment_bytes())
    }

    /// Broadcasts a byte buffer of any length from `root` (`buf` is resized on the others).
    fn broadcast_bytes(&mut self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        broadcast::broadcast_bytes(
            self,
            buf,
            root,
            select::segment_bytes(),
            broadcast::DEFAULT_MAX_BROADCAST_BYTES,
        )
    }

    /// Returns once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<()> {
        gather::barrier(self)
    }
}

impl<T: Transport + ?Sized> Collectives for T {}
