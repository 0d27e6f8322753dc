//! Gather-then-decode: the compressed all-reduce that works with every codec.

use gradwire_codec::Codec;
use gradwire_transport::Transport;

use super::{decode_add_each, Reduce};
use crate::{gather, Algorithm, ReduceOp, Result};

/// Encode, all-gather every rank's payload, `decode_add` each into the output.
///
/// Keeps its buffers (this rank's payload, the gathered payloads) across calls. Each rank
/// sends its payload `P-1` times along the ring, so bytes grow as `P × payload`; decoding
/// goes in rank order, so every rank ends with the same bits.
#[derive(Debug, Default)]
pub struct GatherDecode {
    payload: Vec<u8>,
    gathered: Vec<Vec<u8>>,
}

impl GatherDecode {
    /// An empty one; buffers grow on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces `grad` by the sum (or mean) over ranks of `decode(encode(grad_r))`.
    ///
    /// Codecs that need shared scalars ([`Codec::shared_scalars`], TernGrad's per-tensor
    /// scales) get the element-wise max over ranks first (one small all-reduce).
    pub fn all_reduce<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        codec: &mut dyn Codec,
        grad: &mut [f32],
        reduce: Reduce,
    ) -> Result<()> {
        if let Some(shared) = codec.shared_scalars() {
            let mut v = shared.local_scalars(grad);
            crate::all_reduce(t, &mut v, ReduceOp::Max, Algorithm::RecursiveDoubling, 64)?;
            shared.set_shared_scalars(&v);
        }
        codec.encode(grad, &mut self.payload);
        gather::all_gather_bytes(t, &self.payload, &mut self.gathered)?;
        grad.fill(0.0);
        decode_add_each(codec, self.gathered.iter().map(Vec::as_slice), grad)?;
        reduce.finish(grad, t.world_size());
        Ok(())
    }

    /// Bytes of this rank's last payload (header included).
    pub fn payload_len(&self) -> usize {
        self.payload.len()
    }
}
