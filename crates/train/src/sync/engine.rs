//! [`EngineSync`]: every gradient tensor through `gradwire-engine` — named, negotiated,
//! fused, compressed per the engine's per-tensor policy, and handed back tensor by tensor so
//! that the optimizer updates each tensor as soon as its result is in.
//!
//! Per step the tensors are submitted in reverse flat order (the order a backward pass
//! produces them: output layer first) as one burst, and waited for in the same order; the
//! trainer's update of a finished tensor overlaps the communication of the rest. The step
//! and epoch reach the engine first, so every codec under every strategy sees training
//! progress (DGC's warm-up).
//!
//! One-step-stale double buffering ([`OverlapSync::start_sync`] /
//! [`OverlapSync::finish_sync`], the trainer's `overlap_steps = 1`): the same burst, waited
//! for a step later, so the engine's progress thread moves it while the next forward/backward
//! runs.
//!
//! Bytes: `bytes_sent` is every byte this rank's engine sent since the previous call
//! (gradients, negotiation rounds, idle rounds between steps), so a run's sum is exactly
//! what its transport sent; `encoded_bytes` is the bytes sent by the gradient collectives
//! alone, and the compression ratio is `raw_bytes / encoded_bytes` (the engine's
//! definition: for a dense ring all-reduce on P ranks it is P / (2 (P - 1)), below 1).

use std::ops::Range;
use std::path::Path;
use std::time::{Duration, Instant};

use gradwire_engine::{ByteStats, Engine, EngineConfig, EngineStats, Handle, Phase, TensorSpec};
use gradwire_transport::Transport;

use super::{CheckpointSync, GradientSync, OnReady, OverlapSync, SyncStats};
use crate::error::{ConfigError, Error, Result};
use crate::model::ParamTensor;

/// Name of the parameter broadcast at start.
const PARAMS: &str = "gradwire.params";
/// Name of the metric all-gathers.
const METRICS: &str = "gradwire.metrics";

/// Gradient synchronization through the engine (dense or compressed, per its config).
pub struct EngineSync {
    engine: Option<Engine>,
    rank: usize,
    world: usize,
    names: Vec<String>,
    ranges: Vec<Range<usize>>,
    steps_per_epoch: u64,
    step: u64,
    /// Everything the engine had sent at the end of the previous call.
    sent: u64,
    /// The averaging [`OverlapSync::start_sync`] began: tensor indices and their handles,
    /// in submission order, and the wire bytes before it.
    in_flight: Option<(Vec<(usize, Handle)>, u64)>,
    /// The buffers the engine handed back last step, one per tensor, refilled by the next
    /// submit: a step allocates nothing of the gradient's size (freed and re-faulted pages
    /// cost as much as a copy).
    spare: Vec<Vec<f32>>,
}

fn total_sent(b: &ByteStats) -> u64 {
    b.wire_bytes + b.negotiation_bytes + b.other_bytes
}

impl EngineSync {
    /// Starts an engine on `transport` for the model's `tensors` (names, shapes, roles, in
    /// flat order). `steps_per_epoch` turns steps into epochs for schedules such as DGC's
    /// warm-up. Fails before anything runs on an invalid config (an impossible codec and
    /// strategy pair, a rule naming no tensor), and within a round on a rank whose tensors
    /// differ.
    pub fn new<T: Transport + 'static>(
        transport: T,
        config: EngineConfig,
        tensors: &[ParamTensor],
        steps_per_epoch: usize,
    ) -> Result<Self> {
        let (rank, world) = (transport.rank(), transport.world_size());
        let specs: Vec<TensorSpec> = tensors.iter().map(ParamTensor::spec).collect();
        let engine = Engine::start(transport, config, &specs)?;
        let mut ranges = Vec::with_capacity(tensors.len());
        let mut off = 0;
        for t in tensors {
            ranges.push(off..off + t.len());
            off += t.len();
        }
        let sent = total_sent(&engine.bytes());
        Ok(EngineSync {
            engine: Some(engine),
            rank,
            world,
            names: tensors.iter().map(|t| t.name.clone()).collect(),
            ranges,
            steps_per_epoch: steps_per_epoch.max(1) as u64,
            step: 0,
            sent,
            in_flight: None,
            spare: vec![Vec::new(); tensors.len()],
        })
    }

    /// Exact dense averaging (the engine's default config).
    pub fn dense<T: Transport + 'static>(transport: T, tensors: &[ParamTensor]) -> Result<Self> {
        Self::new(transport, EngineConfig::default(), tensors, 1)
    }

    /// The engine (stats, policies, stall reports, timeline).
    pub fn engine(&self) -> &Engine {
        self.engine.as_ref().expect("engine present until shutdown")
    }

    /// The engine's counters.
    pub fn stats(&self) -> EngineStats {
        self.engine().stats()
    }

    /// Writes this rank's timeline (Chrome trace JSON) to `path`; the engine records spans
    /// only when its config asked for a timeline.
    pub fn write_timeline(&self, path: &Path) -> Result<()> {
        Ok(self.engine().write_timeline(path)?)
    }

    /// Stops the engine once every rank has asked to.
    pub fn shutdown(mut self) -> Result<()> {
        if let Some(e) = self.engine.take() {
            e.shutdown()?;
        }
        Ok(())
    }
}

impl EngineSync {
    /// Submits every tensor of `grads` (output layer first, as a backward pass produces
    /// them) as one burst, flushed when the caller goes on computing (`flush`; otherwise the
    /// caller's first wait runs the round); the handles wait in `in_flight`.
    fn submit(&mut self, grads: &[f32], flush: bool) -> Result<()> {
        let total: usize = self.ranges.last().map_or(0, |r| r.end);
        Error::check_len("gradients", total, grads.len())?;
        let engine = self.engine.as_ref().expect("engine present until shutdown");
        engine.set_progress(self.step, self.step as f32 / self.steps_per_epoch as f32);
        self.step += 1;
        let wire_before = engine.bytes().wire_bytes;
        let order: Vec<usize> = (0..self.ranges.len()).rev().collect();
        let (names, ranges, spare) = (&self.names, &self.ranges, &mut self.spare);
        let batch = order.iter().map(|&i| {
            let mut buf = std::mem::take(&mut spare[i]);
            buf.clear();
            buf.extend_from_slice(&grads[ranges[i].clone()]);
            (names[i].as_str(), buf)
        });
        let handles = if flush {
            engine.all_reduce_batch(batch)
        } else {
            engine.all_reduce_batch_unflushed(batch)
        };
        self.in_flight = Some((order.into_iter().zip(handles).collect(), wire_before));
        Ok(())
    }

    /// Waits for the submitted tensors in submission order, writing each into `out` and
    /// handing it to `on_ready`; the costs since `t0`, less the time in `on_ready`.
    fn collect(
        &mut self,
        out: &mut [f32],
        on_ready: &mut OnReady<'_>,
        t0: Instant,
    ) -> Result<SyncStats> {
        let total: usize = self.ranges.last().map_or(0, |r| r.end);
        Error::check_len("gradients", total, out.len())?;
        let (handles, wire_before) = self.in_flight.take().expect("checked by the callers");
        let mut in_callbacks = Duration::ZERO;
        for (i, h) in handles {
            let got = h.wait()?;
            let r = self.ranges[i].clone();
            out[r.clone()].copy_from_slice(&got);
            let c0 = Instant::now();
            on_ready(r.clone(), &out[r])?;
            in_callbacks += c0.elapsed();
            self.spare[i] = got;
        }
        let engine = self.engine.as_ref().expect("engine present until shutdown");
        let bytes = engine.bytes();
        let sent = total_sent(&bytes);
        let bytes_sent = sent.saturating_sub(self.sent);
        self.sent = sent;
        Ok(SyncStats {
            bytes_sent,
            comm_s: t0.elapsed().saturating_sub(in_callbacks).as_secs_f64(),
            raw_bytes: 4 * total as u64,
            encoded_bytes: bytes.wire_bytes.saturating_sub(wire_before),
        })
    }
}

impl GradientSync for EngineSync {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn broadcast_params(&mut self, params: &mut [f32]) -> Result<()> {
        if self.world > 1 {
            let got = self.engine().broadcast(PARAMS, params.to_vec(), 0).wait()?;
            params.copy_from_slice(&got);
        }
        Ok(())
    }

    fn sync(&mut self, grads: &mut [f32]) -> Result<SyncStats> {
        self.sync_by_tensor(grads, &mut |_, _| Ok(()))
    }

    fn sync_by_tensor(
        &mut self,
        grads: &mut [f32],
        on_ready: &mut OnReady<'_>,
    ) -> Result<SyncStats> {
        if self.in_flight.is_some() {
            return Err(ConfigError::SyncInFlight.into());
        }
        let t0 = Instant::now();
        self.submit(grads, false)?;
        self.collect(grads, on_ready, t0)
    }

    fn average_metrics(&mut self, values: &mut [f64]) -> Result<()> {
        if self.world == 1 {
            return Ok(());
        }
        // Gathered (not reduced) so the sum runs in f64, in rank order, the same everywhere.
        let mine: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        let all = self.engine().all_gather(METRICS, mine).wait()?;
        let n = values.len();
        Error::check_len("gathered metrics", n * self.world, all.len())?;
        for (i, v) in values.iter_mut().enumerate() {
            *v = (0..self.world)
                .map(|r| f64::from(all[r * n + i]))
                .sum::<f64>()
                / self.world as f64;
        }
        Ok(())
    }

    fn overlap(&mut self) -> Option<&mut dyn OverlapSync> {
        Some(self)
    }

    fn checkpoint(&mut self) -> Option<&mut dyn CheckpointSync> {
        Some(self)
    }

    fn record_phase(&mut self, phase: Phase, start: Instant, end: Instant) {
        let e = self.engine();
        let now = gradwire_engine::now_us();
        let ago = |t: Instant| now.saturating_sub(t.elapsed().as_micros() as u64);
        e.record_span("step", phase, ago(start), ago(end));
    }
}

impl OverlapSync for EngineSync {
    fn start_sync(&mut self, grads: &[f32]) -> Result<()> {
        if self.in_flight.is_some() {
            return Err(ConfigError::StartSyncInFlight.into());
        }
        self.submit(grads, true)
    }

    fn finish_sync(&mut self, out: &mut [f32]) -> Result<SyncStats> {
        if self.in_flight.is_none() {
            return Err(ConfigError::FinishWithoutStart.into());
        }
        self.collect(out, &mut |_, _| Ok(()), Instant::now())
    }
}

impl CheckpointSync for EngineSync {
    fn save_state(&self) -> Result<Vec<u8>> {
        if self.in_flight.is_some() {
            return Err(ConfigError::CheckpointInFlight.into());
        }
        Ok(self.engine().save_state()?.to_bytes())
    }

    fn load_state(&mut self, state: &[u8], steps_taken: u64) -> Result<()> {
        let state =
            gradwire_engine::EngineState::from_bytes(state).map_err(|e| Error::Engine(e.into()))?;
        self.engine().load_state(&state)?;
        self.step = steps_taken;
        Ok(())
    }

    fn load_state_elsewhere(
        &mut self,
        state: Option<&[u8]>,
        steps_taken: u64,
    ) -> Result<Vec<String>> {
        let reset = match state {
            Some(bytes) => {
                let state = gradwire_engine::EngineState::from_bytes(bytes)
                    .map_err(|e| Error::Engine(e.into()))?;
                self.engine().load_state_elsewhere(&state)?
            }
            None => Vec::new(),
        };
        self.step = steps_taken;
        Ok(reset)
    }
}
