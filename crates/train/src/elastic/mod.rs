//! What a rank carries across a change of the world in elastic training (Horovod Elastic's
//! `state.commit()` / `state.restore()`): a [`Commit`] (this rank's state at a step boundary,
//! kept in memory, with the current epoch's sample order), its byte form (rank 0 broadcasts
//! its commit to every rank of a new world, so a joining rank receives the state), and the
//! re-dealing of an epoch's remaining samples over the new world ([`remaining_samples`]).
//!
//! What a new world takes from where:
//! - parameters, optimizer state, epoch, step and the epoch's order: rank 0's commit (the
//!   same on every surviving rank: data-parallel steps leave them identical);
//! - the sync's state (codec residuals, momentum-correction velocity, PowerSGD's `Q`s):
//!   each survivor's own commit, loaded where it fits the new world
//!   ([`gradwire_engine::Engine::load_state_elsewhere`]); a new rank starts with a fresh
//!   one. A lost rank's residual (the gradient it had not yet sent) is lost with it: error
//!   feedback drops that mass once, as if that rank's last few gradients were never
//!   computed.
//! - the epoch's samples: those no rank of the old world had taken by the commit (the dead
//!   rank's included) are dealt to the new world in contiguous, equal slices in their
//!   epoch order; later epochs shard over the new world as usual. No sample is taken twice
//!   in an epoch, and only the remainder of an uneven split is left out (as in every epoch).

mod commit;

#[cfg(fuzzing)]
pub use commit::fuzz_commit;
pub use commit::{Commit, CommitFormatError, EpochOrder};

use crate::data::{epoch_permutation, shard_len};
use crate::error::{Error, Result};

/// The samples of the epoch no rank had taken after `step` steps of it in a world of
/// `world` ranks (each taking `batch` per step), in epoch order: from `order` when the
/// world had already changed within the epoch, else from the epoch's sharding of `n`
/// samples under `seed`. `None` at the epoch's start (`step` 0 without an order: the new
/// world shards the epoch as usual).
pub fn remaining_samples(
    n: usize,
    seed: u64,
    epoch: u64,
    batch: usize,
    world: usize,
    step: usize,
    order: Option<&EpochOrder>,
) -> Result<Option<EpochOrder>> {
    let world = world.max(1);
    // The epoch's permutation (without an order), drawn once for every old rank's shard.
    let perm = match order {
        None => epoch_permutation(n, seed, epoch),
        Some(_) => Vec::new(),
    };
    let shard_of = |r: usize| -> Vec<usize> {
        match order {
            Some(o) => {
                let per = o.samples.len() / world;
                o.samples[r * per..(r + 1) * per]
                    .iter()
                    .map(|&s| s as usize)
                    .collect()
            }
            None => {
                let per = shard_len(n, world);
                perm[r * per..(r + 1) * per].to_vec()
            }
        }
    };
    let taken_steps = match order {
        None if step == 0 => return Ok(None),
        None => step,
        Some(o) => step.checked_sub(o.start_step).ok_or_else(|| {
            Error::Resume(format!(
                "the commit's step {step} is before its order's start {}",
                o.start_step
            ))
        })?,
    };
    let mut samples = Vec::new();
    for r in 0..world {
        let shard = shard_of(r);
        let from = taken_steps.saturating_mul(batch);
        if from > shard.len() {
            return Err(Error::Resume(format!(
                "the commit's step {step} is past the epoch's {} samples per rank",
                shard.len()
            )));
        }
        for &s in &shard[from..] {
            samples
                .push(u32::try_from(s).map_err(|_| Error::Resume("sample index over u32".into()))?);
        }
    }
    Ok(Some(EpochOrder {
        samples,
        start_step: step,
    }))
}

/// Rank `rank` of `world`'s slice of `order` (equal contiguous slices; the remainder left
/// out) and the epoch's step count through it: `start_step` plus the slice's whole
/// batches.
pub(crate) fn order_shard(
    order: &EpochOrder,
    world: usize,
    rank: usize,
    batch: usize,
) -> (Vec<usize>, usize) {
    let per = order.samples.len() / world.max(1);
    let shard: Vec<usize> = order.samples[rank * per..(rank + 1) * per]
        .iter()
        .map(|&s| s as usize)
        .collect();
    let steps = order.start_step + per / batch.max(1);
    (shard, steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::shard_indices;

    /// Against a reference written from the definition: every sample of the epoch is taken
    /// at most once across two world changes, and exactly the untaken ones are dealt.
    #[test]
    fn remaining_samples_are_the_untaken_ones_dealt_once() {
        let (n, seed, epoch, batch) = (103, 7, 1, 2);
        // World 4 takes 5 steps (10 samples per rank) of its 25-sample shards.
        let first = remaining_samples(n, seed, epoch, batch, 4, 5, None)
            .unwrap()
            .unwrap();
        let mut taken: Vec<usize> = (0..4)
            .flat_map(|r| shard_indices(n, 4, r, seed, epoch)[..10].to_vec())
            .collect();
        let untaken: Vec<usize> = (0..4)
            .flat_map(|r| shard_indices(n, 4, r, seed, epoch)[10..].to_vec())
            .collect();
        assert_eq!(
            first
                .samples
                .iter()
                .map(|&s| s as usize)
                .collect::<Vec<_>>(),
            untaken
        );
        assert_eq!(first.start_step, 5);
        // Then world 3 takes 4 more steps of its 20-sample slices.
        let (s0, steps) = order_shard(&first, 3, 0, batch);
        assert_eq!((s0.len(), steps), (20, 15));
        for r in 0..3 {
            taken.extend(order_shard(&first, 3, r, batch).0[..8].iter().copied());
        }
        let second = remaining_samples(n, seed, epoch, batch, 3, 9, Some(&first))
            .unwrap()
            .unwrap();
        assert_eq!(second.start_step, 9);
        let mut all: Vec<usize> = taken.clone();
        all.extend(second.samples.iter().map(|&s| s as usize));
        assert_eq!(all.len(), 100);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 100, "a sample dealt twice");
        // At an epoch's start nothing is re-dealt; a step before the order's start is refused.
        assert_eq!(
            remaining_samples(n, seed, epoch, batch, 4, 0, None).unwrap(),
            None
        );
        assert!(remaining_samples(n, seed, epoch, batch, 3, 2, Some(&first)).is_err());
    }
}
