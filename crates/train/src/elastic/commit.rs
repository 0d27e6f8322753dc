//! A [`Commit`]'s byte form: what rank 0 broadcasts to every rank of a new world in
//! elastic training. Compiled on its own by the fuzz target `elastic_commit`, so it needs
//! nothing of the crate but the checkpoint format.
//!
//! ```text
//! u64 checkpoint length, the checkpoint (Checkpoint::to_bytes),
//! u8  order flag (0: none, 1: an order follows),
//! u64 the order's start step, u64 count, u32 samples      (all little-endian)
//! ```

use crate::checkpoint::{Checkpoint, CheckpointFormatError};

/// The current epoch's samples once the world changed within it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochOrder {
    /// The epoch's samples no rank had taken when the current world began, in epoch
    /// order; rank `r` of `W` takes the `r`-th of `W` equal contiguous slices.
    pub samples: Vec<u32>,
    /// The epoch's step at which the current world began (the steps before it were taken
    /// in an earlier world).
    pub start_step: usize,
}

/// One rank's state at a step boundary, kept in memory for elastic training.
#[derive(Debug, Clone, PartialEq)]
pub struct Commit {
    /// Parameters, optimizer and sync state, position (rank and world size of the world
    /// that took it).
    pub checkpoint: Checkpoint,
    /// The current epoch's order when the world changed within it (`None`: the epoch's
    /// usual sharding over the commit's world).
    pub order: Option<EpochOrder>,
}

/// Why [`Commit::from_bytes`] refused its input.
#[derive(Debug, thiserror::Error)]
pub enum CommitFormatError {
    /// The input ends before the field.
    #[error("commit truncated in its {0}")]
    Truncated(&'static str),
    /// The embedded checkpoint is refused.
    #[error("commit's checkpoint: {0}")]
    Checkpoint(#[from] CheckpointFormatError),
    /// A field holds an impossible value.
    #[error("commit's {0} is invalid")]
    Invalid(&'static str),
    /// Bytes follow the commit.
    #[error("{0} bytes after the commit")]
    Trailing(usize),
}

/// A little-endian reader that never reads past its input.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(
        &mut self,
        n: usize,
        what: &'static str,
    ) -> std::result::Result<&'a [u8], CommitFormatError> {
        if self.0.len() < n {
            return Err(CommitFormatError::Truncated(what));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u64(&mut self, what: &'static str) -> std::result::Result<u64, CommitFormatError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

impl Commit {
    /// The commit as bytes: `u64` checkpoint length, the checkpoint, a byte (1: an order
    /// follows), then the order: `u64` start step, `u64` count, `u32` samples (little-endian).
    pub fn to_bytes(&self) -> Vec<u8> {
        let ckpt = self.checkpoint.to_bytes();
        let mut out = Vec::with_capacity(ckpt.len() + 32);
        out.extend_from_slice(&(ckpt.len() as u64).to_le_bytes());
        out.extend_from_slice(&ckpt);
        match &self.order {
            None => out.push(0),
            Some(o) => {
                out.push(1);
                out.extend_from_slice(&(o.start_step as u64).to_le_bytes());
                out.extend_from_slice(&(o.samples.len() as u64).to_le_bytes());
                for s in &o.samples {
                    out.extend_from_slice(&s.to_le_bytes());
                }
            }
        }
        out
    }

    /// Reads [`Commit::to_bytes`]'s form. Total: any input gives a commit or an error,
    /// and no allocation is larger than the input.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Commit, CommitFormatError> {
        let mut r = Reader(bytes);
        let len = r.u64("checkpoint length")?;
        let len = usize::try_from(len).map_err(|_| CommitFormatError::Truncated("checkpoint"))?;
        let checkpoint = Checkpoint::from_bytes(r.take(len, "checkpoint")?)?;
        let order = match r.take(1, "order flag")?[0] {
            0 => None,
            1 => {
                let start = r.u64("order's start step")?;
                let start_step =
                    usize::try_from(start).map_err(|_| CommitFormatError::Invalid("start step"))?;
                let n = r.u64("order's count")?;
                let bytes = n
                    .checked_mul(4)
                    .and_then(|b| usize::try_from(b).ok())
                    .ok_or(CommitFormatError::Truncated("order's samples"))?;
                let raw = r.take(bytes, "order's samples")?;
                let samples = raw
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                    .collect();
                Some(EpochOrder {
                    samples,
                    start_step,
                })
            }
            _ => return Err(CommitFormatError::Invalid("order flag")),
        };
        if !r.0.is_empty() {
            return Err(CommitFormatError::Trailing(r.0.len()));
        }
        Ok(Commit { checkpoint, order })
    }
}

/// Fuzzing entry point: [`Commit::from_bytes`] on arbitrary input, and a decoded commit
/// re-encodes to bytes that decode to the same commit.
#[cfg(fuzzing)]
pub fn fuzz_commit(data: &[u8]) {
    if let Ok(c) = Commit::from_bytes(data) {
        let again = Commit::from_bytes(&c.to_bytes()).expect("a re-encoded commit decodes");
        assert_eq!(again.order, c.order);
        assert_eq!(again.checkpoint.global_step, c.checkpoint.global_step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint() -> Checkpoint {
        Checkpoint {
            rank: 1,
            world_size: 4,
            epoch: 2,
            step_in_epoch: 3,
            global_step: 40,
            loss_sum: 1.5,
            config: String::new(),
            software: "test".into(),
            params: vec![1.0, -2.0, 3.5],
            optimizer: vec![9, 8, 7],
            sync: vec![1, 2],
        }
    }

    #[test]
    fn commits_round_trip_and_damage_is_refused() {
        for order in [
            None,
            Some(EpochOrder {
                samples: vec![5, 1, 9, 2],
                start_step: 3,
            }),
        ] {
            let c = Commit {
                checkpoint: checkpoint(),
                order,
            };
            let b = c.to_bytes();
            assert_eq!(Commit::from_bytes(&b).unwrap(), c);
            for cut in 0..b.len() {
                assert!(Commit::from_bytes(&b[..cut]).is_err(), "prefix {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert!(matches!(
                Commit::from_bytes(&long),
                Err(CommitFormatError::Trailing(1))
            ));
        }
        // A count announcing more samples than there are bytes allocates nothing.
        let mut b = Commit {
            checkpoint: checkpoint(),
            order: None,
        }
        .to_bytes();
        b.pop();
        b.push(1);
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Commit::from_bytes(&b).is_err());
    }
}
