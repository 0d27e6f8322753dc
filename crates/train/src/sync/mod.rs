//! The one seam between the trainer and communication: [`GradientSync`] turns this rank's
//! gradient into the gradient to apply (averaged, or decoded from compressed payloads).

mod compressed;
mod dense;

pub use compressed::{CompressedSync, SyncStrategy};
pub use dense::DenseSync;

use gradwire_collective::{Collectives, ReduceOp};
use gradwire_transport::Transport;

use crate::error::Result;

/// Makes every rank's `params` equal to rank 0's (nothing to do alone).
fn broadcast_from_rank0<T: Transport>(t: &mut T, params: &mut [f32]) -> Result<()> {
    if t.world_size() > 1 {
        t.broadcast(params, 0)?;
    }
    Ok(())
}

/// Replaces `values` by their mean over the ranks (nothing to do alone).
fn average_over_ranks<T: Transport>(t: &mut T, values: &mut [f64]) -> Result<()> {
    if t.world_size() > 1 {
        t.all_reduce(values, ReduceOp::Mean)?;
    }
    Ok(())
}

/// What one [`GradientSync::sync`] call cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SyncStats {
    /// Payload bytes this rank sent during the call.
    pub bytes_sent: u64,
    /// Wall-clock seconds spent in the call (encoding, waiting, decoding).
    pub comm_s: f64,
    /// Size of the uncompressed gradient: `4 * grads.len()`.
    pub raw_bytes: u64,
    /// Size of this rank's encoded gradient (`raw_bytes` for a dense sync).
    pub encoded_bytes: u64,
}

impl SyncStats {
    /// Adds another call's costs into this one.
    pub fn merge(&mut self, o: &SyncStats) {
        self.bytes_sent += o.bytes_sent;
        self.comm_s += o.comm_s;
        self.raw_bytes += o.raw_bytes;
        self.encoded_bytes += o.encoded_bytes;
    }

    /// `raw_bytes / encoded_bytes` (1 when nothing was encoded).
    pub fn compression_ratio(&self) -> f64 {
        if self.encoded_bytes == 0 {
            1.0
        } else {
            self.raw_bytes as f64 / self.encoded_bytes as f64
        }
    }
}

/// Synchronizes parameters and gradients across the ranks of a data-parallel job.
///
/// Every rank calls the same methods in the same order with buffers of the same length.
pub trait GradientSync: Send {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn world_size(&self) -> usize;

    /// Makes every rank's `params` equal to rank 0's.
    fn broadcast_params(&mut self, params: &mut [f32]) -> Result<()>;

    /// Takes this rank's gradient in `grads` and leaves there the gradient to apply
    /// (the mean over ranks, exactly or as decoded from compressed payloads).
    fn sync(&mut self, grads: &mut [f32]) -> Result<SyncStats>;

    /// Averages a few metric values (e.g. the epoch's training loss) over the ranks. The
    /// default leaves them local; implementations with a transport should average.
    fn average_metrics(&mut self, values: &mut [f64]) -> Result<()> {
        let _ = values;
        Ok(())
    }
}

impl<S: GradientSync + ?Sized> GradientSync for Box<S> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn broadcast_params(&mut self, params: &mut [f32]) -> Result<()> {
        (**self).broadcast_params(params)
    }
    fn sync(&mut self, grads: &mut [f32]) -> Result<SyncStats> {
        (**self).sync(grads)
    }
    fn average_metrics(&mut self, values: &mut [f64]) -> Result<()> {
        (**self).average_metrics(values)
    }
}
