//! Alpha-beta-gamma times of the collectives, per rank, for `n` bytes on `p` ranks (the
//! standard formulas of Thakur, Rabenseifner and Gropp, IJHPCA 2005; Hockney's model):
//!
//! | algorithm | time |
//! |---|---|
//! | ring all-reduce | `2(p-1) α + 2(p-1)/p n β + (p-1)/p n γ` |
//! | recursive doubling | `log2 p (α + n β + n γ)` |
//! | Rabenseifner | `2 log2 p α + 2(p-1)/p n β + (p-1)/p n γ` |
//! | canonical (engine default) | Rabenseifner on powers of two; else `2(p-1) α + 2(p-1)/p n β + (p-1)/p n γ` |
//! | ring all-gather (`c` bytes each) | `(p-1) α + (p-1) c β` |
//!
//! Recursive doubling and Rabenseifner on a world that is not a power of two run on the
//! largest power of two `q <= p` and fold the others in and out (`collective::fold`): two
//! more messages of `n` bytes and one more reduction, `2 (α + n β) + n γ`. The canonical
//! all-reduce is Rabenseifner's on power-of-two worlds (the hypercube tree), and off them a
//! pairwise-exchange reduce-scatter and the ring all-gather, `2(p-1)` messages. Segmenting
//! (pieces of 256 KiB) is not modelled: on an emulated link it pipelines, costing no extra
//! latency beyond the per-message software cost that calibration folds into `α`.

use gradwire_collective::{Algorithm, CollectiveConfig};

use crate::Network;

/// `log2` of the largest power of two not above `p` (0 for `p <= 1`).
fn log2_floor(p: usize) -> f64 {
    if p <= 1 {
        0.0
    } else {
        f64::from(usize::BITS - 1 - p.leading_zeros())
    }
}

/// The fold's extra cost on a world that is not a power of two (0 on one that is).
fn fold(net: &Network, n: f64, p: usize) -> f64 {
    if p <= 1 || p.is_power_of_two() {
        0.0
    } else {
        2.0 * (net.alpha + n * net.beta) + n * net.gamma
    }
}

/// Ring all-reduce (reduce-scatter then all-gather, `2(p-1)` steps).
pub fn ring_allreduce(net: &Network, n: f64, p: usize) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let (pf, m) = (p as f64, (p - 1) as f64);
    2.0 * m * net.alpha + 2.0 * m / pf * n * net.beta + m / pf * n * net.gamma
}

/// Recursive doubling (full-buffer exchanges, `log2 p` steps).
pub fn recursive_doubling(net: &Network, n: f64, p: usize) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    log2_floor(p) * (net.alpha + n * net.beta + n * net.gamma) + fold(net, n, p)
}

/// Rabenseifner (recursive-halving reduce-scatter, recursive-doubling all-gather).
pub fn rabenseifner(net: &Network, n: f64, p: usize) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let l = log2_floor(p);
    let q = 2f64.powf(l);
    2.0 * l * net.alpha
        + 2.0 * (q - 1.0) / q * n * net.beta
        + (q - 1.0) / q * n * net.gamma
        + fold(net, n, p)
}

/// The engine's canonical dense all-reduce: Rabenseifner's on powers of two (the hypercube
/// tree); otherwise a pairwise-exchange reduce-scatter (`p-1` messages), owner sums, then the
/// ring all-gather (`p-1`).
pub fn canonical_allreduce(net: &Network, n: f64, p: usize) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    if p.is_power_of_two() {
        return rabenseifner(net, n, p);
    }
    let (pf, m) = (p as f64, (p - 1) as f64);
    2.0 * m * net.alpha + 2.0 * m / pf * n * net.beta + m / pf * n * net.gamma
}

/// All-reduce of `n` bytes with `algo` (`Auto` resolves by size and world as the collective
/// layer does, ignoring the environment).
pub fn allreduce(net: &Network, n: f64, p: usize, algo: Algorithm) -> f64 {
    let algo = CollectiveConfig {
        algo,
        ..CollectiveConfig::default()
    }
    .resolve(n as usize, p);
    match algo {
        Algorithm::RecursiveDoubling => recursive_doubling(net, n, p),
        Algorithm::Rabenseifner => rabenseifner(net, n, p),
        Algorithm::Ring | Algorithm::Auto => ring_allreduce(net, n, p),
    }
}

/// Ring all-gather of `c` bytes from each rank (`p-1` steps of `c` bytes).
pub fn ring_allgather(net: &Network, c: f64, p: usize) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let m = (p - 1) as f64;
    m * net.alpha + m * c * net.beta
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
    }

    // alpha 10 us, 1 Gbit/s (8 ns per byte), gamma 1 ns per byte: hand-computed values.
    const NET: Network = Network {
        alpha: 10e-6,
        beta: 8e-9,
        gamma: 1e-9,
    };

    #[test]
    fn ring_by_hand() {
        // p = 4, n = 1 MB: 6 alpha = 60 us; 1.5 MB on the wire = 12 ms; 0.75 MB reduced = 0.75 ms.
        close(ring_allreduce(&NET, 1e6, 4), 60e-6 + 12e-3 + 0.75e-3);
        close(ring_allreduce(&NET, 1e6, 1), 0.0);
    }

    #[test]
    fn recursive_doubling_by_hand() {
        // p = 8: 3 steps of (10 us + 8 ms + 1 ms) for 1 MB.
        close(
            recursive_doubling(&NET, 1e6, 8),
            3.0 * (10e-6 + 8e-3 + 1e-3),
        );
        // p = 6: 2 steps on 4 ranks, plus the fold: 2 (10 us + 8 ms) + 1 ms.
        close(
            recursive_doubling(&NET, 1e6, 6),
            2.0 * (10e-6 + 8e-3 + 1e-3) + 2.0 * (10e-6 + 8e-3) + 1e-3,
        );
    }

    #[test]
    fn rabenseifner_by_hand() {
        // p = 8, 1 MB: 6 alpha; 2 * 7/8 MB = 1.75 MB -> 14 ms; 7/8 MB reduced -> 0.875 ms.
        close(rabenseifner(&NET, 1e6, 8), 60e-6 + 14e-3 + 0.875e-3);
    }

    #[test]
    fn canonical_by_hand() {
        // p = 4: Rabenseifner's 2 + 2 messages; same bytes as the ring.
        close(canonical_allreduce(&NET, 1e6, 4), 40e-6 + 12e-3 + 0.75e-3);
        // p = 3: 2 + 2 messages; 2 * 2/3 MB on the wire, 2/3 MB reduced.
        close(
            canonical_allreduce(&NET, 3e6, 3),
            40e-6 + 4e6 * 8e-9 + 2e6 * 1e-9,
        );
    }

    #[test]
    fn allgather_by_hand() {
        // p = 5, 1 kB each: 4 (10 us + 8 us).
        close(ring_allgather(&NET, 1e3, 5), 4.0 * 18e-6);
    }

    #[test]
    fn auto_picks_as_the_collective_layer_does() {
        // 4 KiB on 8 ranks: recursive doubling; 64 MiB on 8 ranks: ring.
        close(
            allreduce(&NET, 4096.0, 8, Algorithm::Auto),
            recursive_doubling(&NET, 4096.0, 8),
        );
        close(
            allreduce(&NET, 64.0 * 1048576.0, 8, Algorithm::Auto),
            ring_allreduce(&NET, 64.0 * 1048576.0, 8),
        );
        close(
            allreduce(&NET, 1e6, 8, Algorithm::Rabenseifner),
            rabenseifner(&NET, 1e6, 8),
        );
    }
}
