//! The one seam between the trainer and communication: [`GradientSync`] turns this rank's
//! gradient into the gradient to apply (averaged, or decoded from compressed payloads).
//!
//! # Capabilities
//! What only some syncs can do is a trait of its own, reached through an accessor on
//! [`GradientSync`] that returns `Option<&mut dyn Trait>`, `None` by default (as the codec
//! crate's `Codec::sparse_encode` and the transport's `split_step` do). A sync with the
//! capability implements the trait and overrides the accessor to return `Some(self)`:
//! - [`OverlapSync`] ([`GradientSync::overlap`]): `start_sync`/`finish_sync`, the trainer's
//!   one-step-stale double buffering (`overlap_steps = 1`); [`EngineSync`];
//! - [`CheckpointSync`] ([`GradientSync::checkpoint`]): `save_state`/`load_state` for a
//!   checkpoint and resume; [`EngineSync`];
//! - [`ServerSync`] ([`GradientSync::server`]): `server_step`, an update applied by parameter
//!   servers instead of the trainer's optimizer; [`PsSync`].
//!
//! The trainer asks the accessor; where a capability a run needs is absent it returns
//! [`Error::Unsupported`] naming it, and there is no method that
//! a sync without the capability would have to answer with a run-time refusal.

mod engine;
pub mod ps;

pub use engine::EngineSync;
pub use gradwire_engine::{EngineConfig, MomentumConfig, Phase, Rule, Strategy as SyncStrategy};
pub use ps::{PsConfig, PsSync};

use std::ops::Range;
use std::time::Instant;

use crate::error::{Error, Result};

/// A stand-in weight matrix for checking a codec and strategy pair (an [`EngineConfig`]'s
/// `plan`) before the model exists.
pub fn probe_tensor() -> gradwire_engine::TensorSpec {
    gradwire_engine::TensorSpec::new("probe", [64, 64])
}

/// What [`GradientSync::sync_by_tensor`] calls with each part of the gradient as its result
/// comes in: the part's range in the flat buffer and its values.
pub type OnReady<'a> = dyn FnMut(Range<usize>, &[f32]) -> Result<()> + 'a;

/// What one [`GradientSync::sync`] call cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SyncStats {
    /// Payload bytes this rank sent during the call.
    pub bytes_sent: u64,
    /// Wall-clock seconds spent in the call (encoding, waiting, decoding).
    pub comm_s: f64,
    /// Size of the uncompressed gradient: `4 * grads.len()`.
    pub raw_bytes: u64,
    /// Bytes the gradient collectives sent (for the compression ratio `raw / encoded`).
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
/// What a sync can do beyond averaging is declared by its capability accessors
/// ([`GradientSync::overlap`], [`GradientSync::checkpoint`], [`GradientSync::server`]),
/// `None` by default; see the module doc.
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

    /// [`GradientSync::sync`], calling `on_ready(range, result)` for each part of `grads`
    /// as soon as its result is in (so the caller can update those parameters while the
    /// rest is still on the wire). The default syncs everything, then reports it as one part.
    fn sync_by_tensor(
        &mut self,
        grads: &mut [f32],
        on_ready: &mut OnReady<'_>,
    ) -> Result<SyncStats> {
        let stats = self.sync(grads)?;
        on_ready(0..grads.len(), grads)?;
        Ok(stats)
    }

    /// Records a phase of the step (forward, backward, update) in the timeline, if the
    /// sync keeps one. The default ignores it.
    fn record_phase(&mut self, phase: Phase, start: Instant, end: Instant) {
        let _ = (phase, start, end);
    }

    /// Averages a few metric values (e.g. the epoch's training loss) over the ranks, or
    /// leaves them this rank's own where nothing may wait for the other ranks (say so in the
    /// implementation's doc). No default: every sync decides.
    fn average_metrics(&mut self, values: &mut [f64]) -> Result<()>;

    /// Its one-step-stale double buffering ([`OverlapSync`]), if it has it: [`EngineSync`]
    /// returns `Some(self)`. Default: `None` (the trainer refuses `overlap_steps = 1`).
    fn overlap(&mut self) -> Option<&mut dyn OverlapSync> {
        None
    }

    /// Its state for a checkpoint ([`CheckpointSync`]), if it can be checkpointed:
    /// [`EngineSync`] returns `Some(self)`. Default: `None` (the trainer refuses checkpoints).
    fn checkpoint(&mut self) -> Option<&mut dyn CheckpointSync> {
        None
    }

    /// Its server-side update ([`ServerSync`]), if the sync applies the update itself (a
    /// parameter server): [`PsSync`] returns `Some(self)`. Default: `None` (the trainer calls
    /// [`GradientSync::sync`] and steps its own optimizer).
    fn server(&mut self) -> Option<&mut dyn ServerSync> {
        None
    }
}

/// One-step-stale double buffering: the averaging of step `t`'s gradient travels during step
/// `t+1`'s forward/backward. Returned by [`GradientSync::overlap`].
pub trait OverlapSync {
    /// Starts averaging this rank's `grads` and returns at once. At most one may be in
    /// flight; [`OverlapSync::finish_sync`] collects it.
    fn start_sync(&mut self, grads: &[f32]) -> Result<()>;

    /// Waits for the averaging [`OverlapSync::start_sync`] began and leaves the result in
    /// `out` (the same length); its costs, with `comm_s` the time spent waiting here.
    fn finish_sync(&mut self, out: &mut [f32]) -> Result<SyncStats>;
}

/// What a sync carries from one step to the next, for a checkpoint. Returned by
/// [`GradientSync::checkpoint`].
pub trait CheckpointSync {
    /// Everything this sync carries from one step to the next (codec residuals, momenta,
    /// random streams, progress), as bytes; called between steps.
    fn save_state(&self) -> Result<Vec<u8>>;

    /// Restores [`CheckpointSync::save_state`]'s bytes into a fresh sync, which then
    /// continues as if it had taken `steps_taken` steps.
    fn load_state(&mut self, state: &[u8], steps_taken: u64) -> Result<()>;

    /// Elastic training: restores what fits of `state` (saved by
    /// [`CheckpointSync::save_state`] on another rank or in a world of another size; `None`
    /// for a rank new to the run, which starts fresh) into a fresh sync, which then
    /// continues as if it had taken `steps_taken` steps. The names of the tensors whose
    /// state did not fit and starts afresh. Unsupported unless the sync says otherwise.
    fn load_state_elsewhere(
        &mut self,
        state: Option<&[u8]>,
        steps_taken: u64,
    ) -> Result<Vec<String>> {
        let _ = (state, steps_taken);
        Err(Error::Unsupported {
            what: "move its state to another world (elastic training needs the engine)",
        })
    }
}

/// A sync that applies the update itself (a parameter server). Returned by
/// [`GradientSync::server`].
pub trait ServerSync {
    /// Takes this rank's gradient, leaves in `params` the parameters to continue from, and
    /// returns the step's costs; the trainer's optimizer is then not used.
    fn server_step(&mut self, grads: &[f32], params: &mut [f32]) -> Result<SyncStats>;
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
    fn sync_by_tensor(
        &mut self,
        grads: &mut [f32],
        on_ready: &mut OnReady<'_>,
    ) -> Result<SyncStats> {
        (**self).sync_by_tensor(grads, on_ready)
    }
    fn record_phase(&mut self, phase: Phase, start: Instant, end: Instant) {
        (**self).record_phase(phase, start, end)
    }
    fn overlap(&mut self) -> Option<&mut dyn OverlapSync> {
        (**self).overlap()
    }
    fn checkpoint(&mut self) -> Option<&mut dyn CheckpointSync> {
        (**self).checkpoint()
    }
    fn server(&mut self) -> Option<&mut dyn ServerSync> {
        (**self).server()
    }
}
