//! [`CompressedSync`]: gradients through a codec and one of the compressed all-reduces of
//! `gradwire-collective`, chosen per codec (or forced with [`SyncStrategy`]).
//!
//! | strategy | codecs (auto) | bytes per rank per step |
//! |---|---|---|
//! | sparse all-reduce (merge indices while reducing) | topk, dgc, threshold, randomk | ~ k log2 P when index sets overlap |
//! | quantized reduce-scatter + all-gather (Dryden 2016; error feedback on both legs) | fp16, bf16 | ~ 2 (P-1)/P x payload |
//! | gather-then-decode | onebit, signsgd, qsgd, terngrad, powersgd, adaptive, none | (P-1) x payload |

use std::str::FromStr;
use std::time::Instant;

use gradwire_codec::{BuildContext, Codec, CodecConfig, CodecId, Progress};
use gradwire_collective::compressed::{GatherDecode, QuantizedAllReduce, Reduce, SparseAllReduce};
use gradwire_transport::Transport;

use super::{GradientSync, SyncStats};
use crate::error::{Error, Result};

/// Which compressed all-reduce carries the codec's payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncStrategy {
    /// Chosen from the codec (see the module table).
    #[default]
    Auto,
    /// Encode, all-gather the payloads, decode every one.
    Gather,
    /// Quantized ring reduce-scatter + all-gather.
    Quantized,
    /// Sparse all-reduce of (index, value) pairs.
    Sparse,
}

impl FromStr for SyncStrategy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(SyncStrategy::Auto),
            "gather" => Ok(SyncStrategy::Gather),
            "quantized" => Ok(SyncStrategy::Quantized),
            "sparse" => Ok(SyncStrategy::Sparse),
            other => Err(Error::Config(format!(
                "unknown sync strategy '{other}' (auto, gather, quantized, sparse)"
            ))),
        }
    }
}

impl SyncStrategy {
    /// The strategy `Auto` resolves to for a codec.
    pub fn resolve(self, codec: CodecId) -> SyncStrategy {
        match self {
            SyncStrategy::Auto => match codec {
                CodecId::TopK | CodecId::Dgc | CodecId::Threshold | CodecId::RandomK => {
                    SyncStrategy::Sparse
                }
                // 1-bit and signSGD go through gather-decode: through the quantized ring (two
                // compressions, error feedback on both legs) LeNet stayed at 10% after one
                // epoch where gather-decode reached 73.6% (to be investigated).
                CodecId::Fp16 | CodecId::Bf16 => SyncStrategy::Quantized,
                _ => SyncStrategy::Gather,
            },
            s => s,
        }
    }
}

/// Momentum correction (Lin et al., DGC, ICLR 2018, section 3.2) for any codec: each rank
/// keeps its own velocity `u = beta u + g` and the codec compresses `u` (or `g + beta u`,
/// Nesterov) instead of `g`, so that error feedback accumulates velocity, not gradient.
/// The optimizer then takes plain SGD steps on the averaged velocities: since momentum is
/// linear, the average of the ranks' velocities is the velocity of the averaged gradient,
/// and dense training is unchanged; but a biased codec with error feedback (1-bit, top-k,
/// Strom's threshold, adaptive) no longer sees its delayed residual amplified by an optimizer
/// momentum applied after decompression.
#[derive(Debug, Clone)]
struct MomentumCorrection {
    beta: f32,
    nesterov: bool,
    velocity: Vec<f32>,
}

impl MomentumCorrection {
    /// Replaces `g` by what the codec should compress.
    fn apply(&mut self, g: &mut [f32]) {
        if self.velocity.len() != g.len() {
            self.velocity = vec![0.0; g.len()];
        }
        let beta = self.beta;
        for (u, g) in self.velocity.iter_mut().zip(g.iter_mut()) {
            *u = beta * *u + *g;
            *g = if self.nesterov { *g + beta * *u } else { *u };
        }
    }
}

/// Synchronizes gradients through a codec.
pub struct CompressedSync<T: Transport> {
    transport: T,
    config: CodecConfig,
    ctx: BuildContext,
    strategy: SyncStrategy,
    codec: Box<dyn Codec>,
    gather: GatherDecode,
    sparse: SparseAllReduce,
    quantized: Option<QuantizedAllReduce>,
    momentum: Option<MomentumCorrection>,
    steps_per_epoch: u64,
    step: u64,
}

impl<T: Transport> CompressedSync<T> {
    /// Builds the codec for this rank. `layout` lists the model's tensor sizes in flat
    /// order; `steps_per_epoch` turns steps into epochs for schedules such as DGC's warm-up.
    pub fn new(
        transport: T,
        config: CodecConfig,
        strategy: SyncStrategy,
        layout: Vec<usize>,
        seed: u64,
        steps_per_epoch: usize,
    ) -> Self {
        let ctx = BuildContext {
            seed,
            rank: transport.rank(),
            world_size: transport.world_size(),
            layout,
            ..Default::default()
        };
        let strategy = strategy.resolve(config.id());
        let codec = config.build(&ctx);
        CompressedSync {
            transport,
            config,
            ctx,
            strategy,
            codec,
            gather: GatherDecode::new(),
            sparse: SparseAllReduce::new(),
            quantized: None,
            momentum: None,
            steps_per_epoch: steps_per_epoch.max(1) as u64,
            step: 0,
        }
    }

    /// Turns on momentum correction with factor `beta` (DGC section 3.2): the
    /// codec compresses each rank's velocity, and the optimizer must then step without
    /// momentum.
    pub fn with_momentum_correction(mut self, beta: f32, nesterov: bool) -> Self {
        self.momentum = (beta > 0.0).then_some(MomentumCorrection {
            beta,
            nesterov,
            velocity: Vec::new(),
        });
        self
    }

    /// The strategy in use.
    pub fn strategy(&self) -> SyncStrategy {
        self.strategy
    }

    /// The transport, e.g. to read its byte counters.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    fn quantized(&mut self, len: usize) -> &mut QuantizedAllReduce {
        let (rank, world) = (self.transport.rank(), self.transport.world_size());
        if self
            .quantized
            .as_ref()
            .is_none_or(|q| q.chunk(world - 1).end != len)
        {
            let config = self.config.clone();
            let seed = self.ctx.seed;
            self.quantized = Some(QuantizedAllReduce::new(len, rank, world, |leg, chunk| {
                let n = gradwire_collective::chunks::range(len, world, chunk).len();
                let leg_seed = seed ^ ((leg as u64 + 1) << 40) ^ ((chunk as u64) << 20);
                config.build(&BuildContext {
                    seed: leg_seed,
                    rank,
                    world_size: world,
                    layout: vec![n],
                    ..Default::default()
                })
            }));
        }
        self.quantized.as_mut().expect("just built")
    }
}

impl<T: Transport> GradientSync for CompressedSync<T> {
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
        let progress = Progress {
            step: self.step,
            epoch: self.step as f32 / self.steps_per_epoch as f32,
        };
        self.step += 1;
        if let Some(m) = &mut self.momentum {
            m.apply(grads);
        }
        let raw = 4 * grads.len() as u64;
        let encoded = match self.strategy {
            SyncStrategy::Sparse => {
                self.codec.set_progress(progress);
                self.sparse.all_reduce(
                    &mut self.transport,
                    self.codec.as_mut(),
                    grads,
                    Reduce::Mean,
                )?;
                // Each selected pair costs a 4-byte index and a 4-byte value.
                (8 * self.sparse.last_pairs() as u64).max(1)
            }
            SyncStrategy::Quantized => {
                let len = grads.len();
                let world = self.transport.world_size() as u64;
                let q = self.quantized(len);
                let (rs0, ag0) = q.bytes_by_leg();
                // Split borrow: the transport is a separate field.
                let transport = &mut self.transport;
                let q = self.quantized.as_mut().expect("built above");
                q.all_reduce(transport, grads, Reduce::Mean)?;
                let (rs1, ag1) = q.bytes_by_leg();
                // Encoded size of one rank's gradient: what it sent, per hop-equivalent.
                let sent = (rs1 - rs0) + (ag1 - ag0);
                if world > 1 {
                    (sent / (2 * (world - 1)) * world).max(1)
                } else {
                    raw
                }
            }
            SyncStrategy::Gather | SyncStrategy::Auto => {
                self.codec.set_progress(progress);
                self.gather.all_reduce(
                    &mut self.transport,
                    self.codec.as_mut(),
                    grads,
                    Reduce::Mean,
                )?;
                self.gather.payload_len() as u64
            }
        };
        Ok(SyncStats {
            bytes_sent: self.transport.bytes_sent() - before,
            comm_s: t0.elapsed().as_secs_f64(),
            raw_bytes: raw,
            encoded_bytes: encoded,
        })
    }

    fn average_metrics(&mut self, values: &mut [f64]) -> Result<()> {
        super::average_over_ranks(&mut self.transport, values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_transport::local::Local;

    /// With a lossless codec, momentum correction hands the optimizer exactly what SGD with
    /// momentum would step along: the velocity of the averaged gradient (PyTorch's `buf`,
    /// `g + beta buf` for Nesterov).
    #[test]
    fn momentum_correction_equals_optimizer_momentum() {
        let grad = |rank: usize, step: usize| -> Vec<f32> {
            (0..37)
                .map(|i| ((i * 7 + rank * 13 + step * 29) % 17) as f32 - 8.0)
                .collect()
        };
        for nesterov in [false, true] {
            let beta = 0.875f32;
            let got: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
                let hs: Vec<_> = Local::world(3)
                    .into_iter()
                    .map(|t| {
                        s.spawn(move || {
                            let rank = t.rank();
                            let mut sync = CompressedSync::new(
                                t,
                                "none".parse().unwrap(),
                                SyncStrategy::Gather,
                                vec![37],
                                1,
                                10,
                            )
                            .with_momentum_correction(beta, nesterov);
                            (0..5)
                                .map(|step| {
                                    let mut g = grad(rank, step);
                                    sync.sync(&mut g).unwrap();
                                    g
                                })
                                .collect()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let mut buf = [0f32; 37];
            for step in 0..5 {
                let mean: Vec<f32> = (0..37)
                    .map(|i| (0..3).map(|r| grad(r, step)[i]).sum::<f32>() / 3.0)
                    .collect();
                for (b, g) in buf.iter_mut().zip(&mean) {
                    *b = beta * *b + g;
                }
                for (rank, steps) in got.iter().enumerate() {
                    for (i, &v) in steps[step].iter().enumerate() {
                        let want = if nesterov {
                            mean[i] + beta * buf[i]
                        } else {
                            buf[i]
                        };
                        assert!(
                            (v - want).abs() <= 1e-4 * want.abs().max(1.0),
                            "nesterov={nesterov} step {step} rank {rank} [{i}]: {v} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
