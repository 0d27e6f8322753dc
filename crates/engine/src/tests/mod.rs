//! Engine tests over `Local` worlds of threads, against independently written references
//! (naive rank-order sums, the collective layer's compressed all-reduces).

mod accounting;
mod codecs;
mod encoded;
mod hosts;
mod negotiation;
mod shapes;
mod state;
mod topk_global;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gradwire_transport::local::Local;
use gradwire_transport::{Error as TError, Op, Transport};

/// Runs `f(transport)` on every rank of a `Local` world of `n` (deadline 10 s per call).
pub(crate) fn world<R: Send>(n: usize, f: impl Fn(Local) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = Local::world(n)
            .into_iter()
            .map(|mut t| {
                let f = &f;
                t.set_timeout(Duration::from_secs(10));
                s.spawn(move || f(t))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Small f32 values with a fractional part (so summation order matters for rounding).
/// [`world`] over the TCP transport (loopback), each rank's transport boxed.
pub(crate) fn tcp_world<R: Send>(n: usize, f: impl Fn(Box<dyn Transport>) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = gradwire_transport::tcp::loopback_world(n)
            .expect("loopback world")
            .into_iter()
            .map(|mut t| {
                let f = &f;
                t.set_timeout(Duration::from_secs(10));
                s.spawn(move || f(Box::new(t)))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

pub(crate) fn grad(rank: usize, step: usize, tensor: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let h = (i as u64 + 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(((rank * 1009 + step * 97 + tensor * 13) as u64) << 32);
            ((h >> 40) % 2001) as f32 / 997.0 - 1.0
        })
        .collect()
}

/// The engine's canonical mean written naively, element by element: on power-of-two worlds
/// the hypercube tree `T(a, m) = T(a, 2m) + T(a + m, 2m)`, `T(a, P) = g_a` (`(g0 + g2) +
/// (g1 + g3)` on 4 ranks), otherwise rank order `((g0 + g1) + ...) + g_{P-1}`; then `/ P`.
pub(crate) fn naive_mean(inputs: &[Vec<f32>]) -> Vec<f32> {
    fn tree(inputs: &[Vec<f32>], i: usize, a: usize, m: usize) -> f32 {
        if m == inputs.len() {
            inputs[a][i]
        } else {
            tree(inputs, i, a, 2 * m) + tree(inputs, i, a + m, 2 * m)
        }
    }
    let p = inputs.len();
    (0..inputs[0].len())
        .map(|i| {
            let s = if p.is_power_of_two() {
                tree(inputs, i, 0, 1)
            } else {
                let mut s = inputs[0][i];
                for x in &inputs[1..] {
                    s += x[i];
                }
                s
            };
            if p > 1 {
                s / p as f32
            } else {
                s
            }
        })
        .collect()
}

/// Tensors named `t0`, `t1`, ... with these shapes.
pub(crate) fn named_specs(shapes: &[&[usize]]) -> Vec<crate::TensorSpec> {
    shapes
        .iter()
        .enumerate()
        .map(|(i, &s)| crate::TensorSpec::new(format!("t{i}"), s))
        .collect()
}

pub(crate) fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every rank's outputs (`got[rank][step][tensor]`) equal `want(rank)` bit for bit, step by
/// step and tensor by tensor.
pub(crate) fn assert_steps_bitwise<'a>(
    label: &str,
    got: &[Vec<Vec<Vec<f32>>>],
    want: impl Fn(usize) -> &'a [Vec<Vec<f32>>],
) {
    for (r, g) in got.iter().enumerate() {
        let w = want(r);
        assert_eq!(g.len(), w.len(), "{label}: rank {r}, steps");
        for (step, (gs, ws)) in g.iter().zip(w).enumerate() {
            assert_eq!(gs.len(), ws.len(), "{label}: rank {r} step {step}, tensors");
            for (i, (a, b)) in gs.iter().zip(ws).enumerate() {
                assert_eq!(bits(a), bits(b), "{label}: rank {r} step {step} tensor {i}");
            }
        }
    }
}

/// A transport that can be killed: from then on every call fails and the inner `Local` is
/// dropped, so its peers see it gone.
pub(crate) struct Killable {
    inner: Option<Local>,
    kill: Arc<AtomicBool>,
    rank: usize,
    world: usize,
}

impl Killable {
    pub(crate) fn new(t: Local, kill: Arc<AtomicBool>) -> Self {
        Killable {
            rank: t.rank(),
            world: t.world_size(),
            inner: Some(t),
            kill,
        }
    }
    fn live(&mut self, op: Op) -> gradwire_transport::Result<&mut Local> {
        if self.kill.load(Ordering::SeqCst) {
            self.inner = None;
        }
        self.inner.as_mut().ok_or(TError::PeerClosed {
            peer: self.rank,
            op,
        })
    }
}

impl Transport for Killable {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn send(&mut self, to: usize, msg: &[u8]) -> gradwire_transport::Result<()> {
        self.live(Op::Send)?.send(to, msg)
    }
    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> gradwire_transport::Result<()> {
        self.live(Op::Recv)?.recv(from, buf)
    }
    fn send_recv(
        &mut self,
        to: usize,
        msg: &[u8],
        from: usize,
        buf: &mut Vec<u8>,
    ) -> gradwire_transport::Result<()> {
        self.live(Op::Send)?.send_recv(to, msg, from, buf)
    }
    fn timeout(&self) -> Duration {
        self.inner
            .as_ref()
            .map(|t| t.timeout())
            .unwrap_or(Duration::ZERO)
    }
    fn set_timeout(&mut self, timeout: Duration) {
        if let Some(t) = self.inner.as_mut() {
            t.set_timeout(timeout)
        }
    }
    fn bytes_sent(&self) -> u64 {
        self.inner.as_ref().map(|t| t.bytes_sent()).unwrap_or(0)
    }
}
