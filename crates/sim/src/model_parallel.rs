//! Model parallelism as DistBelief ran it (Dean et al., "Large Scale Distributed Deep
//! Networks", NIPS 2012, Figure 3): one replica's model split over `K` partitions (ranks), whose
//! step is the compute split `K` ways plus the traffic that crosses the partitions'
//! boundaries; the speedup is the one-partition step over the `K`-partition step.
//!
//! The model is a fully connected network of `L` layers of width `H` ([`FcNet`]: `L` weight
//! matrices of `H x H`, so `L H²` parameters; biases, the input and the output layers are left
//! out), trained on a batch of `B` examples per step ([`MpConfig`]). With `F` the sustained
//! floating-point rate of one partition and `s = 4` bytes per f32 activation:
//!
//! * **One partition**: `C₁ = 6 L H² B / F` (2 flops per weight and example forward, 4 backward:
//!   the input's gradient and the weight's). Every split below has step `C₁` at `K = 1`.
//! * **Tensor (vertical) split, Megatron-style** ([`Split::Tensor`]): each layer's matrix is
//!   cut into `K` slices of `h = ⌈H/K⌉` columns (rows, for the second layer of a pair), so a
//!   partition computes `C₁ h / H`, which is `C₁ / K` when `K` divides `H`. The layers go in
//!   pairs (column-parallel, then row-parallel; a lone last layer counts as a pair), and each
//!   pair costs one all-reduce of the `B x H` activation block forward and one of its gradient
//!   backward among the `K` partitions: `comm = 2 ⌈L/2⌉ AR(s B H, K)`, with `AR` the ring
//!   all-reduce the training side's partitions run (`gradwire_train::model::partition`;
//!   [`crate::collective::ring_allreduce`]: `2(K-1) α + 2(K-1)/K n β + (K-1)/K n γ`). The
//!   bytes the partitions send together are `2 ⌈L/2⌉ 2(K-1) s B H`.
//! * **Pipeline** ([`Split::Pipeline`], GPipe, Huang et al. 2019): partition `i` holds a stage
//!   of `l = ⌈L/K⌉` consecutive layers, and the batch goes through in `m` micro-batches of
//!   `b = ⌈B/m⌉` examples. Forward and backward each take `m + K - 1` slots; in each slot a
//!   stage computes one micro-batch (`C₁ l / (L m)` for both directions together) and sends
//!   one block of `b x H` activations forward (or their gradient backward) over its boundary,
//!   so `compute = (m + K - 1) C₁ l / (L m)`, that is `C₁/K` stretched by the bubble: a
//!   fraction `(K-1)/(m+K-1)` of it is idle, and `comm = 2 (m + K - 1) (α + s b H β)`. The
//!   bytes crossing the `K - 1` boundaries are `2 (K-1) s B H`.
//! * **Step** `= compute + comm`: nothing overlaps (a partition waits for the activations it
//!   needs, as the engine's default `overlap` of 0 assumes for data parallelism), and
//!   `speedup = C₁ / step`.
//!
//! Splitting a matrix product makes it smaller, and small products run below the machine's
//! rate. That is the named option [`MpConfig::half_rate_dim`] (`D`, 0 and off by default): a
//! product whose split dimension is `d` (the columns `h` of a tensor slice; the rows `b` of a
//! micro-batch) runs at `e(d) = d / (d + D)` of the rate, so a split's compute is multiplied
//! by `e(full) / e(split)`: `e(H) / e(h)` for tensor, `e(B) / e(b)` for pipeline.
//!
//! Assumptions stated where the code makes them: the partitions are identical machines with
//! the same link between any two ([`Network`]); the work splits evenly up to the rounding of
//! `⌈H/K⌉` and `⌈L/K⌉` (the slowest partition sets the pace); the optimizer's update is part of
//! the 6 flops per weight (it is `O(H²)` per step, not `O(B H²)`); a pipeline's weights update
//! once per batch (GPipe's synchronous schedule), and nothing is recomputed.

use std::fmt;
use std::str::FromStr;

use crate::collective::ring_allreduce;
use crate::{check, Error, Network};

/// Bytes per activation on the wire (f32).
pub const ACTIVATION_BYTES: f64 = 4.0;

/// Flops per weight per example of one training step: 2 forward (a multiply and an add), 4
/// backward (the input's gradient and the weight's).
pub const FLOPS_PER_WEIGHT: f64 = 6.0;

/// A fully connected network of `layers` weight matrices of `width x width`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FcNet {
    /// Number of weight matrices (`L`).
    pub layers: usize,
    /// Width of every layer (`H`).
    pub width: usize,
}

impl FcNet {
    /// `layers` matrices of `width x width`; both at least 1.
    pub fn new(layers: usize, width: usize) -> Result<FcNet, Error> {
        if layers == 0 {
            return Err(Error::EmptyNetwork { what: "layers" });
        }
        if width == 0 {
            return Err(Error::EmptyNetwork { what: "width" });
        }
        Ok(FcNet { layers, width })
    }

    /// The network of `layers` layers closest to `params` parameters: width
    /// `H = round(sqrt(params / layers))`, which must be at least 1.
    pub fn from_params(params: f64, layers: usize) -> Result<FcNet, Error> {
        let params = check("params", params)?;
        if layers == 0 {
            return Err(Error::EmptyNetwork { what: "layers" });
        }
        let width = (params / layers as f64).sqrt().round();
        FcNet::new(layers, width as usize)
    }

    /// Its parameters, `L H²`.
    pub fn params(&self) -> f64 {
        self.layers as f64 * (self.width as f64).powi(2)
    }

    /// Flops of one training step on `batch` examples: `6 L H² B`.
    pub fn flops_per_step(&self, batch: usize) -> f64 {
        FLOPS_PER_WEIGHT * self.params() * batch as f64
    }
}

/// How the model is cut across partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Split {
    /// Every layer's matrix cut into `K` slices (Megatron-style): all-reduces of activations.
    Tensor,
    /// Consecutive layers per partition (GPipe): activations passed stage to stage.
    Pipeline,
}

impl Split {
    /// Both splits, in the order the CLI lists them.
    pub const ALL: [Split; 2] = [Split::Tensor, Split::Pipeline];

    /// Its name: `tensor` or `pipeline`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Tensor => "tensor",
            Split::Pipeline => "pipeline",
        }
    }
}

impl fmt::Display for Split {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Split {
    type Err = Error;

    fn from_str(s: &str) -> Result<Split, Error> {
        Split::ALL
            .into_iter()
            .find(|k| k.name() == s.trim())
            .ok_or_else(|| Error::UnknownSplit(s.to_string()))
    }
}

impl serde::Serialize for Split {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(self.name())
    }
}

/// The training set-up shared by every partitioning: batch, the machine's rate, the
/// pipeline's micro-batches and the small-product efficiency.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct MpConfig {
    /// Examples per step of the replica (`B`).
    pub batch: usize,
    /// Sustained flops per second of one partition (`F`).
    pub flops_per_s: f64,
    /// GPipe micro-batches per step (`m`; pipeline only), at most `batch`.
    pub micro_batches: usize,
    /// The split dimension at which a matrix product runs at half the machine's rate (`D`);
    /// 0 (the default) models every product at full rate.
    pub half_rate_dim: f64,
}

impl MpConfig {
    /// A set-up with `micro_batches` 1 and no small-product penalty.
    pub fn new(batch: usize, flops_per_s: f64) -> MpConfig {
        MpConfig {
            batch,
            flops_per_s,
            micro_batches: 1,
            half_rate_dim: 0.0,
        }
    }

    /// The checked set-up: batch and micro-batches at least 1, `micro_batches <= batch`, a
    /// positive finite rate, a finite non-negative `half_rate_dim`.
    fn checked(&self) -> Result<MpConfig, Error> {
        if self.batch == 0 {
            return Err(Error::EmptyNetwork { what: "batch" });
        }
        if self.micro_batches == 0 || self.micro_batches > self.batch {
            return Err(Error::MicroBatches {
                micro_batches: self.micro_batches,
                batch: self.batch,
            });
        }
        let rate = check("flops_per_s", self.flops_per_s)?;
        if rate == 0.0 {
            return Err(Error::BadCost {
                what: "flops_per_s",
                value: rate,
            });
        }
        check("half_rate_dim", self.half_rate_dim)?;
        Ok(*self)
    }

    /// The fraction of the machine's rate a product whose split dimension is `d` runs at.
    fn efficiency(&self, d: usize) -> f64 {
        let d = d as f64;
        d / (d + self.half_rate_dim)
    }
}

/// One partitioned step, split.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct MpStep {
    /// The unsplit step on one partition (`C₁`).
    pub single_s: f64,
    /// The slowest partition's compute, with the pipeline's bubble.
    pub compute_s: f64,
    /// Boundary communication on the step's critical path.
    pub comm_s: f64,
    /// Bytes the partitions send one another per step, all partitions together.
    pub boundary_bytes: f64,
    /// `compute + comm`.
    pub step_s: f64,
    /// `single / step`.
    pub speedup: f64,
}

/// The step of `net` split over `k` partitions by `split`, on `network` (module doc).
pub fn mp_step(
    net: &FcNet,
    split: Split,
    k: usize,
    config: &MpConfig,
    network: &Network,
) -> Result<MpStep, Error> {
    let c = config.checked()?;
    let net = FcNet::new(net.layers, net.width)?;
    if k == 0 {
        return Err(Error::NoWorkers);
    }
    // The most partitions the split can give work to.
    let max = match split {
        Split::Tensor => net.width,
        Split::Pipeline => net.layers,
    };
    if k > max {
        return Err(Error::TooManyPartitions { k, split, max });
    }
    let single = net.flops_per_step(c.batch) / c.flops_per_s;
    if k == 1 {
        return Ok(MpStep {
            single_s: single,
            compute_s: single,
            comm_s: 0.0,
            boundary_bytes: 0.0,
            step_s: single,
            speedup: 1.0,
        });
    }
    let (h, l, kf) = (net.width as f64, net.layers as f64, k as f64);
    let block = ACTIVATION_BYTES * c.batch as f64 * h;
    let (compute, comm, bytes) = match split {
        Split::Tensor => {
            let slice = net.width.div_ceil(k);
            let compute = single * slice as f64 / h * c.efficiency(net.width) / c.efficiency(slice);
            let collectives = 2.0 * net.layers.div_ceil(2) as f64;
            let comm = collectives * ring_allreduce(network, block, k);
            (compute, comm, collectives * 2.0 * (kf - 1.0) * block)
        }
        Split::Pipeline => {
            let stage = net.layers.div_ceil(k) as f64;
            let m = c.micro_batches as f64;
            let micro = c.batch.div_ceil(c.micro_batches);
            let slots = m + kf - 1.0;
            let per_slot = single * stage / (l * m) * c.efficiency(c.batch) / c.efficiency(micro);
            let send = network.alpha + ACTIVATION_BYTES * micro as f64 * h * network.beta;
            (
                slots * per_slot,
                2.0 * slots * send,
                2.0 * (kf - 1.0) * block,
            )
        }
    };
    let step = compute + comm;
    Ok(MpStep {
        single_s: single,
        compute_s: compute,
        comm_s: comm,
        boundary_bytes: bytes,
        step_s: step,
        speedup: single / step,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
    }

    // 1 Gbit/s (8 ns per byte), 10 us per message, 1 ns per byte reduced.
    const NET: Network = Network {
        alpha: 10e-6,
        beta: 8e-9,
        gamma: 1e-9,
    };

    /// 4 layers of 1000, batch 10, 1 GFLOP/s: 6 * 4e6 * 10 = 2.4e8 flops, 0.24 s.
    fn small() -> (FcNet, MpConfig) {
        (FcNet::new(4, 1000).unwrap(), MpConfig::new(10, 1e9))
    }

    #[test]
    fn one_partition_is_the_unsplit_compute() {
        let (net, cfg) = small();
        for split in Split::ALL {
            let cfg = MpConfig {
                micro_batches: 5,
                half_rate_dim: 64.0,
                ..cfg
            };
            let s = mp_step(&net, split, 1, &cfg, &NET).unwrap();
            close(s.single_s, 0.24);
            close(s.compute_s, 0.24);
            close(s.step_s, 0.24);
            assert_eq!((s.comm_s, s.boundary_bytes, s.speedup), (0.0, 0.0, 1.0));
        }
    }

    #[test]
    fn tensor_split_by_hand() {
        let (net, cfg) = small();
        // K = 4: compute 0.24 / 4 = 60 ms. Two layer pairs: 4 all-reduces of 10 x 1000 f32 =
        // 40 kB each, a ring on 4: 6 alpha = 60 us, 2 * 3/4 * 40 kB = 60 kB on the wire =
        // 480 us, 3/4 * 40 kB = 30 kB reduced = 30 us; 570 us each, 2.28 ms in all.
        let s = mp_step(&net, Split::Tensor, 4, &cfg, &NET).unwrap();
        close(s.compute_s, 0.06);
        close(s.comm_s, 4.0 * 570e-6);
        close(s.step_s, 0.06228);
        close(s.speedup, 0.24 / 0.06228);
        // 4 all-reduces, each 2 * 3 * 40 kB sent by the 4 partitions together.
        close(s.boundary_bytes, 4.0 * 240e3);
    }

    #[test]
    fn tensor_split_rounds_slices_up_and_pairs_lone_layers() {
        // 3 layers of 10 on 4 partitions: slices of 3 columns, 3/10 of 6 * 300 * 2 / 1e3 s.
        let net = FcNet::new(3, 10).unwrap();
        let cfg = MpConfig::new(2, 1e3);
        let s = mp_step(&net, Split::Tensor, 4, &cfg, &NET).unwrap();
        close(s.single_s, 3.6);
        close(s.compute_s, 3.6 * 0.3);
        // A pair and a lone layer: 4 all-reduces of 2 x 10 f32 = 80 bytes.
        let ar = 6.0 * 10e-6 + 1.5 * 80.0 * 8e-9 + 0.75 * 80.0 * 1e-9;
        close(s.comm_s, 4.0 * ar);
    }

    #[test]
    fn pipeline_by_hand() {
        let (net, cfg) = small();
        let cfg = MpConfig {
            micro_batches: 5,
            ..cfg
        };
        // K = 2, m = 5: 6 slots; a stage of 2 layers computes 0.24 / 2 / 5 = 24 ms per
        // micro-batch, 144 ms in all (the bubble is 1/6 of it). Each slot sends 2 x 1000 f32
        // = 8 kB forward and back: 2 * 6 * (10 us + 64 us) = 888 us.
        let s = mp_step(&net, Split::Pipeline, 2, &cfg, &NET).unwrap();
        close(s.compute_s, 0.144);
        close(s.comm_s, 888e-6);
        close(s.step_s, 0.144888);
        // One boundary, 10 x 1000 f32 each way.
        close(s.boundary_bytes, 80e3);
        // Without micro-batches the stages take turns: no faster than one partition.
        let one = MpConfig {
            micro_batches: 1,
            ..cfg
        };
        let s = mp_step(&net, Split::Pipeline, 4, &one, &NET).unwrap();
        close(s.compute_s, 0.24);
        assert!(s.speedup < 1.0);
    }

    #[test]
    fn small_products_run_below_the_rate() {
        let (net, cfg) = small();
        // D = 250: the full width runs at 1000/1250 = 0.8, a slice of 250 at 0.5; the
        // slice's compute is 0.06 * 0.8 / 0.5 = 96 ms.
        let cfg = MpConfig {
            half_rate_dim: 250.0,
            ..cfg
        };
        let s = mp_step(&net, Split::Tensor, 4, &cfg, &NET).unwrap();
        close(s.compute_s, 0.096);
        // Pipeline, m = 5: micro-batches of 2 rows at 2/252 against 10/260 of the rate.
        let cfg = MpConfig {
            micro_batches: 5,
            ..cfg
        };
        let s = mp_step(&net, Split::Pipeline, 2, &cfg, &NET).unwrap();
        close(s.compute_s, 0.144 * (10.0 / 260.0) / (2.0 / 252.0));
    }

    #[test]
    fn width_from_a_parameter_count() {
        // 1.7e9 / 8 = 2.125e8, whose root is 14577.4: width 14577.
        let net = FcNet::from_params(1.7e9, 8).unwrap();
        assert_eq!(net, FcNet::new(8, 14577).unwrap());
        close(net.params(), 8.0 * 14577.0 * 14577.0);
        close(net.flops_per_step(2), 12.0 * net.params());
    }

    #[test]
    fn speedup_saturates_on_a_slow_link() {
        // 100M parameters over 8 layers (width 3536), batch 64, 50 GFLOP/s, 1 Gbit/s: the
        // compute shrinks as 1/K while the all-reduced volume tends to 2 blocks per all-reduce.
        let net = FcNet::from_params(1e8, 8).unwrap();
        let cfg = MpConfig::new(64, 50e9);
        let speedups: Vec<f64> = [1, 2, 4, 8, 16, 32]
            .iter()
            .map(|&k| mp_step(&net, Split::Tensor, k, &cfg, &NET).unwrap().speedup)
            .collect();
        assert!(speedups.windows(2).all(|w| w[1] > w[0]), "{speedups:?}");
        // The step tends to 8 all-reduces of 2 * 905 kB at 8 ns per byte, about 124 ms,
        // against 0.768 s on one partition: below 6.6.
        assert!(
            speedups[5] < 6.6 && speedups[5] / speedups[4] < 1.3,
            "{speedups:?}"
        );
    }

    #[test]
    fn bad_inputs_are_errors() {
        let (net, cfg) = small();
        let run = |net: &FcNet, split, k, cfg: &MpConfig| mp_step(net, split, k, cfg, &NET);
        assert_eq!(run(&net, Split::Tensor, 0, &cfg), Err(Error::NoWorkers));
        assert_eq!(
            run(&net, Split::Pipeline, 5, &cfg),
            Err(Error::TooManyPartitions {
                k: 5,
                split: Split::Pipeline,
                max: 4
            })
        );
        assert!(matches!(
            run(&net, Split::Tensor, 1001, &cfg),
            Err(Error::TooManyPartitions { max: 1000, .. })
        ));
        let zero_batch = MpConfig { batch: 0, ..cfg };
        assert_eq!(
            run(&net, Split::Tensor, 2, &zero_batch),
            Err(Error::EmptyNetwork { what: "batch" })
        );
        let too_many = MpConfig {
            micro_batches: 11,
            ..cfg
        };
        assert_eq!(
            run(&net, Split::Pipeline, 2, &too_many),
            Err(Error::MicroBatches {
                micro_batches: 11,
                batch: 10
            })
        );
        for rate in [0.0, -1.0, f64::NAN] {
            let bad = MpConfig {
                flops_per_s: rate,
                ..cfg
            };
            assert!(matches!(
                run(&net, Split::Tensor, 2, &bad),
                Err(Error::BadCost {
                    what: "flops_per_s",
                    ..
                })
            ));
        }
        let bad = MpConfig {
            half_rate_dim: -1.0,
            ..cfg
        };
        assert!(run(&net, Split::Tensor, 2, &bad).is_err());
        assert_eq!(
            FcNet::new(0, 10),
            Err(Error::EmptyNetwork { what: "layers" })
        );
        assert_eq!(
            FcNet::from_params(0.1, 4),
            Err(Error::EmptyNetwork { what: "width" })
        );
        assert!(FcNet::from_params(f64::INFINITY, 4).is_err());
        // A hand-made network is checked too.
        let empty = FcNet {
            layers: 2,
            width: 0,
        };
        assert!(run(&empty, Split::Tensor, 1, &cfg).is_err());
        assert_eq!(
            "ring".parse::<Split>(),
            Err(Error::UnknownSplit("ring".into()))
        );
        assert_eq!("pipeline".parse::<Split>(), Ok(Split::Pipeline));
    }
}
