//! Per-rank sharding of an epoch: every rank draws the same seeded permutation of the
//! training samples and takes its own contiguous, disjoint slice of it.

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Samples each rank gets per epoch: `n / world_size` (the remainder is left out so that
/// every rank takes the same number of steps).
pub fn shard_len(n: usize, world_size: usize) -> usize {
    n / world_size.max(1)
}

/// The permutation of `0..n` for `epoch`, the same on every rank for the same `seed`.
pub fn epoch_permutation(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..n).collect();
    // Mix the epoch into the stream id so that epochs differ but stay reproducible.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(epoch.wrapping_add(0x5eed));
    perm.shuffle(&mut rng);
    perm
}

/// The sample indices rank `rank` of `world_size` visits in `epoch`, in order.
pub fn shard_indices(
    n: usize,
    world_size: usize,
    rank: usize,
    seed: u64,
    epoch: u64,
) -> Vec<usize> {
    let per = shard_len(n, world_size);
    let mut perm = epoch_permutation(n, seed, epoch);
    perm.truncate((rank + 1) * per);
    perm.drain(..rank * per);
    perm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_equal_and_seeded() {
        let n = 103;
        let mut all: Vec<usize> = (0..4).flat_map(|r| shard_indices(n, 4, r, 7, 2)).collect();
        assert_eq!(all.len(), 100);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 100, "shards overlap");
        assert_eq!(shard_indices(n, 4, 1, 7, 2), shard_indices(n, 4, 1, 7, 2));
        assert_ne!(shard_indices(n, 4, 1, 7, 2), shard_indices(n, 4, 1, 7, 3));
        assert_ne!(shard_indices(n, 4, 1, 7, 2), shard_indices(n, 4, 1, 8, 2));
        assert_eq!(shard_indices(n, 1, 0, 7, 2), epoch_permutation(n, 7, 2));
    }
}
