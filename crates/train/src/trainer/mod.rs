//! The data-parallel training loop, free of any CLI: per step, this rank's shard batch ->
//! forward/backward -> [`GradientSync::sync`] -> optimizer step on the flat parameters ->
//! parameters back into the model (or, for a parameter server, forward/backward ->
//! [`ServerSync::server_step`](crate::sync::ServerSync::server_step), which returns the
//! servers' parameters); per epoch, an evaluation on the held-out split.
//!
//! Deviation, off by default: [`TrainConfig::overlap_steps`] `= 1` is one-step-stale double
//! buffering (CNTK's 1-bit SGD): the gradient of step `t` is averaged during step `t+1`'s
//! forward/backward and applied after it, so each gradient is computed on parameters one
//! update behind (not synchronous SGD).
//!
//! Named option, off by default: [`TrainConfig::local_clip`] clips each rank's own gradient
//! at `C / sqrt(N)` before it is synchronized (DGC's local gradient clipping, Lin et al.
//! 2018 section 3.3), instead of the optimizer clipping the aggregated gradient at `C`. With
//! a sparsifying codec the aggregate holds residuals accumulated over many steps, so a
//! global clip cuts what error feedback saved, and what it cuts is lost for good.

use serde::{Deserialize, Serialize};

use crate::checkpoint::Checkpoint;
use crate::data::{shard_indices, shard_len, Dataset, Split};
use crate::elastic::{order_shard, remaining_samples, Commit, EpochOrder};
use crate::error::{ConfigError, Error, Result};
use crate::model::{Eval, Model};
use crate::optim::{Optimizer, OptimizerConfig, OptimizerState};
use crate::sync::{GradientSync, SyncStats};

mod epoch;

/// [`Error::Unsupported`] for `overlap_steps = 1` without [`GradientSync::overlap`].
const OVERLAP: &str = "overlap steps (--overlap-steps needs the engine)";
/// [`Error::Unsupported`] for a checkpoint or resume without [`GradientSync::checkpoint`].
const CHECKPOINT: &str = "be checkpointed (checkpoints need the engine)";

/// Which ranks evaluate the held-out split at the end of each epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvalMode {
    /// Every rank evaluates every `world`-th sample (rank `r` takes samples `r, r + world,
    /// ...`) and the sums are reduced over the ranks, so every rank reports the whole
    /// split's figures and none waits idle on the others.
    #[default]
    Sharded,
    /// Rank 0 only (parameters are identical on every rank); the others report `None` and
    /// wait for rank 0 at their next collective.
    Rank0,
    /// Every rank.
    All,
    /// No evaluation.
    Off,
}

/// Settings of a training run (the same on every rank).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Samples per step on each rank (the global batch is `world_size` times this).
    pub batch_size: usize,
    /// Epochs to run.
    pub epochs: usize,
    /// Seed of the parameter initialization and the per-epoch shuffles.
    pub seed: u64,
    /// The optimizer.
    pub optimizer: OptimizerConfig,
    /// Cap on steps per epoch (for short runs); `None` runs the whole shard.
    pub max_steps_per_epoch: Option<usize>,
    /// Which ranks evaluate.
    pub eval: EvalMode,
    /// Samples per evaluation batch.
    pub eval_batch_size: usize,
    /// Cap on held-out samples evaluated; `None` evaluates the whole split.
    pub eval_limit: Option<usize>,
    /// 0 (default): synchronous SGD. 1: one-step-stale double buffering (CNTK's 1-bit SGD,
    /// Seide et al. 2014): step `t`'s gradient is averaged while step `t+1`'s
    /// forward/backward runs, and the update applied after step `t+1`'s backward is step
    /// `t`'s averaged gradient — a deviation from synchronous SGD (each gradient is computed
    /// on parameters one update behind). The last gradient of an epoch is applied before the
    /// evaluation. Needs a sync that can overlap steps (the engine). The delay shrinks the
    /// stable learning rates: measured here, LeNet on Fashion-MNIST at `sgd:lr=0.05,
    /// momentum=0.9` stops learning with it, while `lr=0.02` (or no momentum) learns.
    #[serde(default)]
    pub overlap_steps: usize,
    /// Local gradient clipping (DGC section 3.3), `None` (default) off: each rank scales its
    /// own gradient by `(C / sqrt(N)) / ||g||` when `||g|| > C / sqrt(N)` (`N` ranks) before
    /// the sync, so the codec and its error feedback see the clipped gradient. Meant to
    /// replace the optimizer's `clip=C` (which clips the aggregate), not to add to it.
    #[serde(default)]
    pub local_clip: Option<f64>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            batch_size: 64,
            epochs: 1,
            seed: 0,
            optimizer: OptimizerConfig::sgd(0.05, 0.9),
            max_steps_per_epoch: None,
            eval: EvalMode::Sharded,
            eval_batch_size: 500,
            eval_limit: None,
            overlap_steps: 0,
            local_clip: None,
        }
    }
}

/// What one epoch did (the keys the CLI and the reports read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochStats {
    /// 0-based epoch number.
    pub epoch: u64,
    /// Mean training loss over the epoch's steps, averaged over ranks when the sync can.
    pub train_loss: f64,
    /// Top-1 accuracy on the held-out split (next-character accuracy for a language model);
    /// `None` on ranks that did not evaluate.
    pub test_accuracy: Option<f64>,
    /// Perplexity on the validation text (language models only).
    pub val_perplexity: Option<f64>,
    /// Wall-clock seconds of the epoch, evaluation included.
    pub wall_s: f64,
    /// Seconds of the epoch's evaluation (part of `wall_s`; training time is the rest).
    #[serde(default)]
    pub eval_s: f64,
    /// Seconds in forward/backward, the optimizer and the parameter write-back.
    pub compute_s: f64,
    /// Seconds in gradient synchronization.
    pub comm_s: f64,
    /// Bytes this rank sent while synchronizing.
    pub bytes_sent: u64,
    /// Uncompressed gradient bytes over encoded bytes (1 for dense).
    pub compression_ratio: f64,
}

/// What the per-step hook sees (for progress bars and logs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepInfo {
    /// 0-based epoch.
    pub epoch: u64,
    /// 0-based step within the epoch.
    pub step: usize,
    /// Steps in this epoch.
    pub steps: usize,
    /// Steps taken since the start of the run, this one included.
    pub global_step: u64,
    /// This rank's mean loss on the step's batch.
    pub loss: f32,
    /// Learning rate used.
    pub lr: f64,
    /// The step's synchronization costs.
    pub sync: SyncStats,
}

/// Drives one rank of a data-parallel run.
pub struct Trainer<S: GradientSync> {
    model: Box<dyn Model>,
    sync: S,
    optimizer: Optimizer,
    config: TrainConfig,
    params: Vec<f32>,
    grads: Vec<f32>,
    /// With `overlap_steps = 1`: the averaged gradient of the previous step, and whether
    /// its averaging is in flight.
    stale: Vec<f32>,
    in_flight: bool,
    epoch: u64,
    global_step: u64,
    /// The current epoch's progress: steps taken and the sums so far (kept across
    /// [`Trainer::run_epoch_until`]'s pauses).
    part: EpochPart,
    /// The current epoch's samples once the world changed within it (elastic training).
    order: Option<EpochOrder>,
}

/// What an epoch has done so far.
#[derive(Debug, Clone, Default)]
struct EpochPart {
    step: usize,
    loss_sum: f64,
    compute_s: f64,
    total: SyncStats,
    wall_s: f64,
}

impl<S: GradientSync> Trainer<S> {
    /// Sets up a rank: broadcasts rank 0's parameters to all and builds the optimizer.
    /// `train_len` (training samples) sizes the run for a cosine schedule.
    pub fn new(
        mut model: Box<dyn Model>,
        mut sync: S,
        config: TrainConfig,
        train_len: usize,
    ) -> Result<Self> {
        if config.batch_size == 0 || config.eval_batch_size == 0 {
            return Err(ConfigError::BatchSize.into());
        }
        if config.overlap_steps > 1 {
            return Err(ConfigError::OverlapSteps {
                given: config.overlap_steps,
            }
            .into());
        }
        if let Some(c) = config.local_clip {
            if !(c.is_finite() && c > 0.0) {
                return Err(ConfigError::LocalClip { value: c }.into());
            }
        }
        let mut params = Vec::new();
        model.params(&mut params);
        sync.broadcast_params(&mut params)?;
        model.set_params(&params);
        let steps = steps_per_epoch(train_len, sync.world_size(), &config);
        let total = (steps * config.epochs) as u64;
        let optimizer = config.optimizer.build(params.len(), Some(total))?;
        Ok(Trainer {
            grads: Vec::with_capacity(params.len()),
            model,
            sync,
            optimizer,
            config,
            params,
            stale: Vec::new(),
            in_flight: false,
            epoch: 0,
            global_step: 0,
            part: EpochPart::default(),
            order: None,
        })
    }

    /// The model (parameters current).
    pub fn model(&self) -> &dyn Model {
        &*self.model
    }

    /// The current flat parameters.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// The optimizer (state, current learning rate).
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// The optimizer, e.g. to restore its state.
    pub fn optimizer_mut(&mut self) -> &mut Optimizer {
        &mut self.optimizer
    }

    /// The sync.
    pub fn sync(&self) -> &S {
        &self.sync
    }

    /// The sync, e.g. for a collective between steps (a barrier over
    /// [`GradientSync::average_metrics`]).
    pub fn sync_mut(&mut self) -> &mut S {
        &mut self.sync
    }

    /// Steps taken since the start of the run.
    pub fn global_step(&self) -> u64 {
        self.global_step
    }

    /// Steps of the current epoch already taken.
    pub fn step_in_epoch(&self) -> usize {
        self.part.step
    }

    /// This rank's state at the current step boundary, for a checkpoint: parameters,
    /// optimizer and sync state, and the position in the run. `config` (the run's resolved
    /// configuration) and `software` (version and revision) are stored as given. Call it
    /// between steps (after [`Trainer::run_epoch_until`] paused); not with
    /// `overlap_steps = 1`, whose gradient is in flight across steps.
    /// Needs a sync with [`GradientSync::checkpoint`] ([`Error::Unsupported`] otherwise).
    pub fn checkpoint(&mut self, config: String, software: String) -> Result<Checkpoint> {
        if self.in_flight || self.config.overlap_steps != 0 {
            return Err(ConfigError::CheckpointNeedsSynchronous.into());
        }
        Ok(Checkpoint {
            rank: self.sync.rank() as u32,
            world_size: self.sync.world_size() as u32,
            epoch: self.epoch,
            step_in_epoch: self.part.step as u64,
            global_step: self.global_step,
            loss_sum: self.part.loss_sum,
            config,
            software,
            params: self.params.clone(),
            optimizer: self.optimizer.state().to_bytes(),
            sync: self
                .sync
                .checkpoint()
                .ok_or(Error::Unsupported { what: CHECKPOINT })?
                .save_state()?,
        })
    }

    /// Continues from `ckpt` (taken by [`Trainer::checkpoint`] on this rank of a run with
    /// the same settings): parameters, optimizer and sync state, epoch and step. The next
    /// [`Trainer::run_epoch_until`] goes on with the step after the checkpoint's, and the run
    /// then ends bit for bit where the uninterrupted one would. The caller compares the
    /// configuration; this checks rank, world size and the parameter count.
    pub fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
        let (rank, world) = (self.sync.rank(), self.sync.world_size());
        if (ckpt.rank as usize, ckpt.world_size as usize) != (rank, world) {
            return Err(Error::Resume(format!(
                "the checkpoint is rank {} of {}, this is rank {rank} of {world}",
                ckpt.rank, ckpt.world_size
            )));
        }
        if ckpt.params.len() != self.params.len() {
            return Err(Error::Resume(format!(
                "the checkpoint holds {} parameters, the model has {}",
                ckpt.params.len(),
                self.params.len()
            )));
        }
        if self.in_flight || self.config.overlap_steps != 0 {
            return Err(ConfigError::CheckpointNeedsSynchronous.into());
        }
        let state = OptimizerState::from_bytes(&ckpt.optimizer)?;
        self.optimizer.set_state(state)?;
        self.sync
            .checkpoint()
            .ok_or(Error::Unsupported { what: CHECKPOINT })?
            .load_state(&ckpt.sync, ckpt.global_step)?;
        self.params.copy_from_slice(&ckpt.params);
        self.model.set_params(&self.params);
        self.epoch = ckpt.epoch;
        self.global_step = ckpt.global_step;
        self.part = EpochPart {
            step: usize::try_from(ckpt.step_in_epoch)
                .map_err(|_| Error::Resume("step within the epoch out of range".into()))?,
            loss_sum: ckpt.loss_sum,
            ..EpochPart::default()
        };
        Ok(())
    }

    /// Elastic training's `state.commit()`: this rank's state at the current step boundary,
    /// kept in memory ([`Trainer::checkpoint`] with no configuration, and the epoch's order).
    pub fn commit(&mut self) -> Result<Commit> {
        Ok(Commit {
            checkpoint: self.checkpoint(String::new(), String::new())?,
            order: self.order.clone(),
        })
    }

    /// Continues, in a world that may differ from the commit's, from `shared` (rank 0's
    /// commit, the same on every rank of the new world): parameters, optimizer state and
    /// position from it, the epoch's untaken samples dealt over this world; the sync's
    /// state from `own` (this rank's own commit of the same step; `None` for a rank new to
    /// the run, whose codecs start fresh at that step). See [`crate::elastic`]. Returns the
    /// tensors whose sync state did not fit this world and starts afresh.
    pub fn restore_elsewhere(
        &mut self,
        shared: &Commit,
        own: Option<&Commit>,
        train_len: usize,
    ) -> Result<Vec<String>> {
        let ck = &shared.checkpoint;
        if ck.params.len() != self.params.len() {
            return Err(Error::Resume(format!(
                "the commit holds {} parameters, the model has {}",
                ck.params.len(),
                self.params.len()
            )));
        }
        if let Some(o) = own {
            if o.checkpoint.global_step != ck.global_step {
                return Err(Error::Resume(format!(
                    "this rank's commit is of step {}, rank 0's of step {}",
                    o.checkpoint.global_step, ck.global_step
                )));
            }
        }
        if self.in_flight || self.config.overlap_steps != 0 {
            return Err(ConfigError::ElasticNeedsSynchronous.into());
        }
        let step = usize::try_from(ck.step_in_epoch)
            .map_err(|_| Error::Resume("step within the epoch out of range".into()))?;
        let order = remaining_samples(
            train_len,
            self.config.seed,
            ck.epoch,
            self.config.batch_size,
            ck.world_size as usize,
            step,
            shared.order.as_ref(),
        )?;
        let state = OptimizerState::from_bytes(&ck.optimizer)?;
        self.optimizer.set_state(state)?;
        let reset = self
            .sync
            .checkpoint()
            .ok_or(Error::Unsupported { what: CHECKPOINT })?
            .load_state_elsewhere(own.map(|o| o.checkpoint.sync.as_slice()), ck.global_step)?;
        self.params.copy_from_slice(&ck.params);
        self.model.set_params(&self.params);
        self.epoch = ck.epoch;
        self.global_step = ck.global_step;
        self.part = EpochPart {
            step,
            loss_sum: ck.loss_sum,
            ..EpochPart::default()
        };
        self.order = order;
        Ok(reset)
    }

    /// The settings.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// The next epoch to run (0-based).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Steps each rank takes in the current epoch over `train_len` samples (after a change
    /// of the world within the epoch, the steps before it and through the re-dealt rest).
    pub fn steps_per_epoch(&self, train_len: usize) -> usize {
        self.epoch_shard(train_len).2
    }

    /// This rank's samples of the current epoch, the epoch step they start at, and the
    /// epoch's step count (capped by [`TrainConfig::max_steps_per_epoch`]).
    fn epoch_shard(&self, n: usize) -> (Vec<usize>, usize, usize) {
        let (rank, world) = (self.sync.rank(), self.sync.world_size());
        match &self.order {
            None => (
                shard_indices(n, world, rank, self.config.seed, self.epoch),
                0,
                steps_per_epoch(n, world, &self.config),
            ),
            Some(o) => {
                let (shard, steps) = order_shard(o, world, rank, self.config.batch_size);
                (shard, o.start_step, capped(steps, &self.config))
            }
        }
    }

    /// Runs the configured number of epochs; `on_epoch` sees each epoch's stats.
    pub fn fit(
        &mut self,
        data: &Dataset,
        on_step: &mut dyn FnMut(&StepInfo),
        on_epoch: &mut dyn FnMut(&EpochStats),
    ) -> Result<Vec<EpochStats>> {
        let mut all = Vec::with_capacity(self.config.epochs);
        while (self.epoch as usize) < self.config.epochs {
            let s = self.run_epoch(data, on_step)?;
            on_epoch(&s);
            all.push(s);
        }
        Ok(all)
    }

    /// Evaluates the current parameters on `split` (up to `eval_limit` samples, in order).
    pub fn evaluate(&self, split: &Split) -> Result<Eval> {
        evaluate(
            &*self.model,
            split,
            self.config.eval_batch_size,
            self.config.eval_limit,
        )
    }

    /// Evaluates this rank's share of `split` (samples `rank, rank + world, ...` of the
    /// first `eval_limit`) and sums the results over the ranks.
    pub fn evaluate_sharded(&mut self, split: &Split) -> Result<Eval> {
        let (rank, world) = (self.sync.rank(), self.sync.world_size());
        let n = self
            .config
            .eval_limit
            .map_or(split.len(), |l| l.min(split.len()));
        let idx: Vec<usize> = (rank..n).step_by(world.max(1)).collect();
        let mut mine = Eval::default();
        for chunk in idx.chunks(self.config.eval_batch_size.max(1)) {
            mine.merge(&self.model.evaluate(&split.batch(chunk))?);
        }
        let mut sums = [mine.loss_sum, mine.correct as f64, mine.n as f64];
        self.sync.average_metrics(&mut sums)?;
        let w = world as f64;
        Ok(Eval {
            loss_sum: sums[0] * w,
            correct: (sums[1] * w).round() as u64,
            n: (sums[2] * w).round() as u64,
        })
    }

    /// Gives back the model and the sync.
    pub fn into_parts(self) -> (Box<dyn Model>, S) {
        (self.model, self.sync)
    }
}

/// Steps per epoch for `train_len` samples over `world` ranks: each rank's shard over its
/// batch, capped by [`TrainConfig::max_steps_per_epoch`] (what [`Trainer::steps_per_epoch`]
/// gives once a trainer exists; 0 when a shard holds less than a batch).
pub fn steps_per_epoch(train_len: usize, world: usize, config: &TrainConfig) -> usize {
    capped(
        shard_len(train_len, world) / config.batch_size.max(1),
        config,
    )
}

/// `steps` capped by [`TrainConfig::max_steps_per_epoch`]: the one cap of an epoch's step
/// count, with or without a re-dealt order.
fn capped(steps: usize, config: &TrainConfig) -> usize {
    config.max_steps_per_epoch.map_or(steps, |m| steps.min(m))
}

/// Evaluates `model` on the first `limit` samples of `split` (all when `None`) in batches.
pub fn evaluate(
    model: &dyn Model,
    split: &Split,
    batch_size: usize,
    limit: Option<usize>,
) -> Result<Eval> {
    let n = limit.map_or(split.len(), |l| l.min(split.len()));
    let mut total = Eval::default();
    let idx: Vec<usize> = (0..n).collect();
    for chunk in idx.chunks(batch_size.max(1)) {
        total.merge(&model.evaluate(&split.batch(chunk))?);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::{steps_per_epoch, TrainConfig, Trainer};

    /// A trainer's step count (no re-dealt order) is the free function's, which is the
    /// shard over the batch, capped: checked against that arithmetic on one rank.
    #[test]
    fn a_trainers_steps_per_epoch_is_the_free_functions() {
        use crate::data::DataShape;
        use crate::{EngineSync, ModelKind};
        let shape = DataShape::Image {
            shape: [1, 28, 28],
            classes: 10,
        };
        for (len, batch, cap, want) in [
            (1000, 64, None, 15),
            (1000, 64, Some(4), 4),
            (1000, 64, Some(40), 15),
            (63, 64, None, 0),
        ] {
            let config = TrainConfig {
                batch_size: batch,
                max_steps_per_epoch: cap,
                ..TrainConfig::default()
            };
            assert_eq!(steps_per_epoch(len, 1, &config), want);
            let model = ModelKind::Mlp.build(shape, 1).unwrap();
            let t = gradwire_transport::local::Local::world(1).pop().unwrap();
            let sync = EngineSync::dense(t, &model.tensors()).unwrap();
            let tr = Trainer::new(model, sync, config, len).unwrap();
            assert_eq!(
                tr.steps_per_epoch(len),
                want,
                "{len} samples, batch {batch}"
            );
        }
    }
}
