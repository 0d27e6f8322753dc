//! Tests over real worlds of ranks: a harness generic over the transport, and the
//! property tests against [`crate::reference`].

use std::time::Duration;

use gradwire_transport::{local::Local, Transport};

mod compressed;
mod dense;
mod feedback;
mod hierarchical;
mod powersgd;
mod real_codecs;
mod state;
mod stripe;

/// LeNet-5's parameters in burn's layouts (Linear weights `[in, out]`), fc1 taking `fc1_in`
/// inputs (16 x 5 x 5 = 400 on 32x32 images, 16 x 4 x 4 = 256 on 28x28 without padding), the
/// last layer's weight and bias as the output layer: the shapes the stripe tests cut columns
/// from, and PowerSGD's.
pub(crate) fn lenet(fc1_in: usize) -> Vec<gradwire_codec::TensorInfo> {
    use gradwire_codec::{TensorInfo, TensorRole::*};
    vec![
        TensorInfo::new([6, 1, 5, 5], ConvWeight),
        TensorInfo::new([6], Bias),
        TensorInfo::new([16, 6, 5, 5], ConvWeight),
        TensorInfo::new([16], Bias),
        TensorInfo::new([fc1_in, 120], LinearWeight),
        TensorInfo::new([120], Bias),
        TensorInfo::new([120, 84], LinearWeight),
        TensorInfo::new([84], Bias),
        TensorInfo::new([84, 10], Output),
        TensorInfo::new([10], Output),
    ]
}

/// A small model with every role: a conv layer, a linear layer of shape `linear` and an
/// output layer of shape `output`, each with its bias.
pub(crate) fn small_model(
    linear: [usize; 2],
    output: [usize; 2],
) -> Vec<gradwire_codec::TensorInfo> {
    use gradwire_codec::{TensorInfo, TensorRole::*};
    vec![
        TensorInfo::new([6, 1, 5, 5], ConvWeight),
        TensorInfo::new([6], Bias),
        TensorInfo::new(linear, LinearWeight),
        TensorInfo::new([linear[1]], Bias),
        TensorInfo::new(output, Output),
        TensorInfo::new([output[1]], Output),
    ]
}

/// Multiples of 0.25 in [-10, 10), a stream per `(rank, step, len)`: every sum of up to 8 of
/// them is exact in f32, in any order.
pub(crate) fn quarters(rank: usize, step: usize, len: usize) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut g = rand::rngs::StdRng::seed_from_u64(((rank * 131 + step) as u64) << 20 | len as u64);
    (0..len)
        .map(|_| g.gen_range(-40i32..40) as f32 * 0.25)
        .collect()
}

/// A world factory: builds `n` connected ranks.
pub(crate) type WorldFactory = dyn Fn(usize) -> Vec<Box<dyn Transport>> + Sync;

/// An in-process world of `n` ranks.
pub(crate) fn local_world(n: usize) -> Vec<Box<dyn Transport>> {
    Local::world(n)
        .into_iter()
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .collect()
}

/// A TCP world on 127.0.0.1 (full mesh, one process).
pub(crate) fn tcp_world(n: usize) -> Vec<Box<dyn Transport>> {
    gradwire_transport::tcp::loopback_world(n)
        .expect("tcp loopback world")
        .into_iter()
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .collect()
}

/// A shared-memory world (rings in /dev/shm, threads of one process).
pub(crate) fn shm_world(n: usize) -> Vec<Box<dyn Transport>> {
    // Small rings, so that most messages stream through in pieces.
    gradwire_transport::shm::local_world(n, 16 << 10)
        .expect("shm world")
        .into_iter()
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .collect()
}

/// A `Local` world behind the link emulator (a fast link: the suite checks that the wrapper
/// is transparent, not its timing).
pub(crate) fn throttled_world(n: usize) -> Vec<Box<dyn Transport>> {
    use gradwire_transport::link::{LinkConfig, Throttled};
    let cfg: LinkConfig = "100gbit,1us,jitter=1us".parse().expect("link spec");
    Throttled::wrap_all(Local::world(n), &cfg)
        .into_iter()
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .collect()
}

/// Runs `f` on every rank of `world`, one thread each, and returns the ranks' results in
/// rank order. A rank's transport is dropped when its `f` returns, so a rank that fails
/// makes its peers fail fast (PeerClosed) instead of waiting for the deadline.
pub(crate) fn run_world<R, F>(world: Vec<Box<dyn Transport>>, f: F) -> Vec<R>
where
    R: Send,
    F: Fn(&mut dyn Transport) -> R + Sync,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = world
            .into_iter()
            .map(|mut t| {
                let f = &f;
                s.spawn(move || {
                    t.set_timeout(Duration::from_secs(20));
                    f(&mut *t)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Instantiates `$body(&factory)` as one `#[test]` per transport, in a module `$name`.
macro_rules! for_each_transport {
    ($name:ident, $body:path) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn local() {
                $body(&$crate::tests::local_world)
            }
            #[test]
            fn tcp() {
                $body(&$crate::tests::tcp_world)
            }
            #[test]
            fn shm() {
                $body(&$crate::tests::shm_world)
            }
            #[test]
            fn throttled() {
                $body(&$crate::tests::throttled_world)
            }
        }
    };
}
pub(crate) use for_each_transport;
