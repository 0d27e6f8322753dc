//! One epoch of [`Trainer`]: the step loop (forward/backward, local clipping, the
//! synchronization and update of the run's mode, the parameters back into the model), the
//! pause at a checkpoint's step boundary, and the epoch's end (the last overlapped gradient,
//! the mean loss over ranks, the evaluation).

use std::time::Instant;

use super::{EpochPart, EpochStats, EvalMode, StepInfo, Trainer, OVERLAP};
use crate::data::Dataset;
use crate::error::{ConfigError, Error, Result};
use crate::sync::{GradientSync, Phase, SyncStats};

impl<S: GradientSync> Trainer<S> {
    /// Runs one epoch over this rank's shard, calling `on_step` after every step, then
    /// evaluates per [`EvalMode`].
    pub fn run_epoch(
        &mut self,
        data: &Dataset,
        on_step: &mut dyn FnMut(&StepInfo),
    ) -> Result<EpochStats> {
        loop {
            if let Some(stats) = self.run_epoch_until(data, on_step, None)? {
                return Ok(stats);
            }
        }
    }

    /// [`Trainer::run_epoch`] from the epoch's current step, pausing (`Ok(None)`) at the
    /// step boundary where the run's global step reaches `pause_at` (for a checkpoint); the
    /// next call goes on from there. A pause after the epoch's last step comes before its
    /// evaluation. `Ok(Some(stats))` once the epoch is done.
    pub fn run_epoch_until(
        &mut self,
        data: &Dataset,
        on_step: &mut dyn FnMut(&StepInfo),
        pause_at: Option<u64>,
    ) -> Result<Option<EpochStats>> {
        let t_epoch = Instant::now();
        let world = self.sync.world_size();
        let n = data.train.len();
        let (shard, first, steps) = self.epoch_shard(n);
        if steps == 0 && self.order.is_none() {
            return Err(ConfigError::NoFullBatch {
                samples: n,
                ranks: world,
                batch: self.config.batch_size,
            }
            .into());
        }
        let bs = self.config.batch_size;
        let mut part = std::mem::take(&mut self.part);
        let started = part.step;
        for step in started..steps {
            if self.pause_due(pause_at) {
                part.step = step;
                part.wall_s += t_epoch.elapsed().as_secs_f64();
                self.part = part;
                return Ok(None);
            }
            let at = (step - first) * bs;
            let batch = data.train.batch(&shard[at..at + bs]);
            let t0 = Instant::now();
            let loss = self.model.forward_backward(&batch, &mut self.grads)?;
            part.compute_s += t0.elapsed().as_secs_f64();
            if !loss.is_finite() {
                return Err(Error::Diverged {
                    epoch: self.epoch,
                    step,
                    loss,
                });
            }
            if let Some(c) = self.config.local_clip {
                clip_local(&mut self.grads, c, world);
            }
            if let Some([start, fwd, bwd]) = self.model.last_pass_times() {
                self.sync.record_phase(Phase::Forward, start, fwd);
                self.sync.record_phase(Phase::Backward, fwd, bwd);
            }
            let (stats, lr, update_s) = self.sync_and_update()?;
            part.total.merge(&stats);
            let t1 = Instant::now();
            self.model.set_params(&self.params);
            self.sync.record_phase(Phase::Update, t1, Instant::now());
            part.compute_s += t1.elapsed().as_secs_f64() + update_s;
            part.loss_sum += f64::from(loss);
            self.global_step += 1;
            on_step(&StepInfo {
                epoch: self.epoch,
                step,
                steps,
                global_step: self.global_step,
                loss,
                lr,
                sync: stats,
            });
        }
        part.wall_s += t_epoch.elapsed().as_secs_f64();
        if self.pause_due(pause_at) && started < steps {
            // Paused after the epoch's last step, before its evaluation.
            part.step = steps;
            self.part = part;
            return Ok(None);
        }
        self.finish_epoch(data, part, steps).map(Some)
    }

    /// Whether a run pausing at `pause_at` pauses at this step boundary (never with a
    /// gradient in flight).
    fn pause_due(&self, pause_at: Option<u64>) -> bool {
        pause_at.is_some_and(|p| self.global_step >= p) && !self.in_flight
    }

    /// The step's synchronization and update, by the run's mode: a parameter server's
    /// step, the one-step-stale overlap, per-tensor updates as each tensor's average
    /// arrives, or the whole average then one optimizer step. The sync's stats, the
    /// learning rate and the update's seconds.
    fn sync_and_update(&mut self) -> Result<(SyncStats, f64, f64)> {
        if self.config.overlap_steps != 1 {
            if let Some(s) = self.sync.server() {
                // A parameter server applied the update; `params` hold its result.
                let stats = s.server_step(&self.grads, &mut self.params)?;
                return Ok((stats, self.optimizer.current_lr(), 0.0));
            }
        }
        if self.config.overlap_steps == 1 {
            // One-step-stale: apply the previous step's average (if any), then start this
            // step's, which travels during the next forward/backward.
            let applied = self.apply_in_flight()?;
            self.sync
                .overlap()
                .ok_or(Error::Unsupported { what: OVERLAP })?
                .start_sync(&self.grads)?;
            self.in_flight = true;
            Ok(applied)
        } else if self.optimizer.updates_by_part() {
            // Each tensor is updated as soon as its reduced gradient is in, while the others
            // are still on the wire.
            let (optimizer, params) = (&mut self.optimizer, &mut self.params);
            let mut update_s = 0.0;
            let stats = self.sync.sync_by_tensor(&mut self.grads, &mut |r, g| {
                let u0 = Instant::now();
                let start = r.start;
                optimizer.step_part(&mut params[r], g, start)?;
                update_s += u0.elapsed().as_secs_f64();
                Ok(())
            })?;
            Ok((stats, self.optimizer.finish_step(), update_s))
        } else {
            let stats = self.sync.sync(&mut self.grads)?;
            let u0 = Instant::now();
            let lr = self.optimizer.step(&mut self.params, &self.grads)?;
            Ok((stats, lr, u0.elapsed().as_secs_f64()))
        }
    }

    /// The epoch's end: the last in-flight gradient applied, the mean loss over ranks, the
    /// evaluation per [`EvalMode`], and the epoch's stats; the next epoch starts afresh.
    fn finish_epoch(
        &mut self,
        data: &Dataset,
        mut part: EpochPart,
        steps: usize,
    ) -> Result<EpochStats> {
        let t_epoch = Instant::now();
        if self.in_flight {
            // The epoch's last gradient, applied before the evaluation.
            let (stats, _, update_s) = self.apply_in_flight()?;
            part.total.merge(&stats);
            let t1 = Instant::now();
            self.model.set_params(&self.params);
            part.compute_s += update_s + t1.elapsed().as_secs_f64();
        }
        let mut mean_loss = [part.loss_sum / steps.max(1) as f64];
        self.sync.average_metrics(&mut mean_loss)?;
        let t_eval = Instant::now();
        let eval = match self.config.eval {
            EvalMode::All => Some(self.evaluate(&data.test)?),
            EvalMode::Rank0 if self.sync.rank() == 0 => Some(self.evaluate(&data.test)?),
            EvalMode::Rank0 | EvalMode::Off => None,
            EvalMode::Sharded => Some(self.evaluate_sharded(&data.test)?),
        };
        let eval_s = t_eval.elapsed().as_secs_f64();
        let (mut test_accuracy, mut val_perplexity) = (None, None);
        if let Some(e) = eval {
            test_accuracy = Some(e.accuracy());
            if self.model.kind().is_language_model() {
                val_perplexity = Some(e.perplexity());
            }
        }
        let stats = EpochStats {
            epoch: self.epoch,
            train_loss: mean_loss[0],
            test_accuracy,
            val_perplexity,
            wall_s: part.wall_s + t_epoch.elapsed().as_secs_f64(),
            eval_s,
            compute_s: part.compute_s,
            comm_s: part.total.comm_s,
            bytes_sent: part.total.bytes_sent,
            compression_ratio: part.total.compression_ratio(),
        };
        self.epoch += 1;
        self.order = None;
        Ok(stats)
    }

    /// With a gradient averaging in flight (`overlap_steps = 1`): waits for it and applies
    /// it; the stats of that wait, the learning rate and the update's seconds. Nothing in
    /// flight: no update (zero stats, the current learning rate).
    fn apply_in_flight(&mut self) -> Result<(SyncStats, f64, f64)> {
        if !self.in_flight {
            return Ok((SyncStats::default(), self.optimizer.current_lr(), 0.0));
        }
        self.in_flight = false;
        self.stale.resize(self.grads.len(), 0.0);
        let stats = self
            .sync
            .overlap()
            .ok_or(Error::Unsupported { what: OVERLAP })?
            .finish_sync(&mut self.stale)?;
        let u0 = Instant::now();
        let lr = self.optimizer.step(&mut self.params, &self.stale)?;
        Ok((stats, lr, u0.elapsed().as_secs_f64()))
    }
}

/// Local gradient clipping (DGC section 3.3): scales `grads` so that its L2 norm is at most
/// `clip / sqrt(world)`; leaves it as it is when already within.
fn clip_local(grads: &mut [f32], clip: f64, world: usize) {
    let max = clip / (world.max(1) as f64).sqrt();
    let norm = crate::optim::l2_norm(grads);
    if norm > max {
        let s = (max / norm) as f32;
        grads.iter_mut().for_each(|g| *g *= s);
    }
}

#[cfg(test)]
mod tests {
    use super::clip_local;

    #[test]
    fn local_clip_scales_to_clip_over_sqrt_world() {
        // ||(3, 4)|| = 5; clip 4 over 4 ranks allows 4 / 2 = 2: the result is (1.2, 1.6).
        let mut g = [3.0f32, 4.0];
        clip_local(&mut g, 4.0, 4);
        assert!(
            (g[0] - 1.2).abs() < 1e-6 && (g[1] - 1.6).abs() < 1e-6,
            "{g:?}"
        );
        // Within the bound: untouched, bit for bit.
        let mut g = [0.3f32, -0.4];
        clip_local(&mut g, 1.0, 1);
        assert_eq!(g, [0.3, -0.4]);
        // One rank: the bound is the clip itself.
        let mut g = [0.0f32, 10.0];
        clip_local(&mut g, 5.0, 1);
        assert!((g[1] - 5.0).abs() < 1e-6, "{g:?}");
    }
}
