//! [`DenseSync`]: the uncompressed baseline, an all-reduce (mean) of the fp32 gradient.

use std::time::Instant;

use gradwire_collective::{Collectives, ReduceOp};
use gradwire_transport::Transport;

use super::{GradientSync, SyncStats};
use crate::error::Result;

/// Averages full fp32 gradients with the collectives' all-reduce (algorithm chosen by size).
#[derive(Debug)]
pub struct DenseSync<T: Transport> {
    transport: T,
}

impl<T: Transport> DenseSync<T> {
    /// Syncs over `transport`.
    pub fn new(transport: T) -> Self {
        DenseSync { transport }
    }

    /// The transport, e.g. to read its byte counters.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Gives the transport back.
    pub fn into_inner(self) -> T {
        self.transport
    }
}

impl<T: Transport> GradientSync for DenseSync<T> {
    fn rank(&self) -> usize {
        self.transport.rank()
    }

    fn world_size(&self) -> usize {
        self.transport.world_size()
    }

    fn broadcast_params(&mut self, params: &mut [f32]) -> Result<()> {
        super::broadcast_from_rank0(&mut self.transport, params)
    }

    fn sync(&mut self, grads: &mut [f32]) -> Result<SyncStats> {
        let before = self.transport.bytes_sent();
        let t0 = Instant::now();
        if self.transport.world_size() > 1 {
            self.transport.all_reduce(grads, ReduceOp::Mean)?;
        }
        let raw = 4 * grads.len() as u64;
        Ok(SyncStats {
            bytes_sent: self.transport.bytes_sent() - before,
            comm_s: t0.elapsed().as_secs_f64(),
            raw_bytes: raw,
            encoded_bytes: raw,
        })
    }

    fn average_metrics(&mut self, values: &mut [f64]) -> Result<()> {
        super::average_over_ranks(&mut self.transport, values)
    }
}
