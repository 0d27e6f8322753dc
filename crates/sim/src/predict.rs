//! Step time per strategy: compute, codec and communication of one training step on `P`
//! workers, hence the speedup over dense and the scaling efficiency.
//!
//! Per rank and step, with `n` the gradient's elements, `w` the codec's wire bytes per element
//! (measured from its output), `e` / `d` its encode / decode seconds per element (measured),
//! and tensors fused into groups of at most `fusion_bytes` raw f32 bytes as the engine does:
//!
//! | strategy | codec time | communication |
//! |---|---|---|
//! | dense | 0 | the engine's canonical all-reduce of each group's `4 n_g` bytes |
//! | gather | `e n + P d n` (every rank's payload decoded) | per group, ring all-gather of `w n_g` bytes each |
//! | sparse | `e n + d n` | per group, recursive doubling over pairs: step `s` carries `min(k 2^s, n_g)` entries (`k = w n_g / 8` pairs, 8 bytes each; dense f32 once denser than 1/3), merged at `γ` per byte |
//! | stripe | `e n (1 + 1/P) + 2 d n` | per tensor, exchange then all-gather of stripes: `2 [(P-1) α + (P-1)/P w n_t β]` |
//! | powersgd | `e n + d n` | per tensor, two all-reduces (`P` then `Q`) of `w n_t / 2` bytes each, algorithm by size |
//!
//! Sparse assumes the ranks' index sets are disjoint (the all-gather-like worst case; when
//! they coincide the pairs stay at `k` per step). Stripe and PowerSGD are never fused (as in
//! the engine). Overlap: a fraction `overlap` of the communication hides behind compute (at
//! most the compute time): `step = compute + codec + comm - overlap * min(comm, compute)`.
//! The engine here receives the gradient after the whole backward pass, so the measured
//! overlap is near 0 (the default); a framework that starts all-reducing during backward
//! (Horovod, PyTorch DDP) gets closer to 1.
//!
//! Ranks sharing a host (`Scenario::host`, validation on one machine): their CPU work is not
//! modelled but measured, as one whole step of the `P` ranks on the host's `N` cores without
//! a link ([`MeasuredStep`]: compute, codec, the engine and the TCP stack, with the ranks
//! contending for the cores). The prediction is that step plus the link's communication,
//! less what of it hides behind the other ranks' CPU work: `compute = measured compute`,
//! `sync = measured step - measured compute`, `comm` as above, and
//! `hidden += min(comm - hidden, sync (1 - N/P))` when `N < P`. While a rank waits on its
//! link, the cores run the other ranks' sync work (encoding, decoding, reducing, copying),
//! which makes up `1 - N/P` of the measured sync (the cores ran `P/N` ranks' work for each
//! rank's own); the rank's own share stays in line with its messages (it encodes before it
//! sends and decodes after it receives). The compute hides nothing: every collective here is a
//! chain of duplex steps, so the last rank to finish computing still sends and receives all
//! of its messages after it (a model that hid wire behind compute, validated at `513327c` and
//! `910f55f` on 2026-12-04, over-corrected once the compute was measured right:
//! docs/results/cost-model).
//!
//! Scaling efficiency is weak scaling (fixed batch per worker, as Horovod reports it): the
//! one-worker step time without any communication over the `P`-worker step time.
//! Speedup is the dense step time over the codec's step time at the same `P` and link.

use gradwire_engine::Strategy;

use crate::collective::{allreduce, canonical_allreduce, ring_allgather};
use crate::{check, Error, Network};

/// What the model costs: its tensors' element counts (in the engine's order) and the
/// measured compute time of one step on one worker (forward, backward, optimizer).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelProfile {
    /// The model's spec (`mlp:hidden=2048x3`).
    pub name: String,
    /// Element count of each gradient tensor, in flat order.
    pub tensors: Vec<usize>,
    /// Seconds of compute per step on one worker.
    pub compute_s: f64,
}

impl ModelProfile {
    /// Total gradient elements.
    pub fn elements(&self) -> usize {
        self.tensors.iter().sum()
    }
}

/// What a codec costs, measured on this model's gradient.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CodecProfile {
    /// The codec's spec (`dgc:ratio=0.001`, `none` for dense).
    pub spec: String,
    /// The strategy the engine carries it with (resolved: never `auto`).
    #[serde(with = "strategy_text")]
    pub strategy: Strategy,
    /// Encode seconds per gradient element.
    pub encode_s_per_elem: f64,
    /// Decode (`decode_add`) seconds per gradient element, per payload decoded.
    pub decode_s_per_elem: f64,
    /// Bytes on the wire per gradient element for one rank's contribution (4 for dense f32;
    /// for sparse, 8 bytes per selected pair times the density).
    pub wire_bytes_per_elem: f64,
}

impl CodecProfile {
    /// Plain fp32 all-reduce: no codec cost, 4 bytes per element.
    pub fn dense() -> CodecProfile {
        CodecProfile {
            spec: "none".into(),
            strategy: Strategy::Dense,
            encode_s_per_elem: 0.0,
            decode_s_per_elem: 0.0,
            wire_bytes_per_elem: 4.0,
        }
    }
}

/// Serde of a [`Strategy`] as its text (`dense`, `sparse`, ...).
mod strategy_text {
    use gradwire_engine::Strategy;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(s: &Strategy, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_str(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(de: D) -> Result<Strategy, D::Error> {
        let s = String::deserialize(de)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Where the step runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scenario {
    /// Number of workers (data-parallel ranks).
    pub workers: usize,
    /// The link between any two of them.
    pub network: Network,
    /// Fraction of the communication hidden behind compute, in `[0, 1]`.
    pub overlap: f64,
    /// The engine's fusion buffer size in raw f32 bytes (tensors packed up to this).
    pub fusion_bytes: usize,
    /// The workers' CPU work measured on the one host they share (`None`: modelled, a host
    /// each); see the module doc.
    pub host: Option<MeasuredStep>,
}

/// One step of the `P` ranks measured on the host they share, without a link.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MeasuredStep {
    /// The host's cores the ranks share.
    pub cores: usize,
    /// Seconds of compute per step (the slowest rank's: forward, backward, update).
    pub compute_s: f64,
    /// Seconds per step: compute, then the engine's sync with the codec, no link.
    pub step_s: f64,
}

/// One step's time, split.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct StepBreakdown {
    /// Compute (forward, backward, optimizer).
    pub compute_s: f64,
    /// Encoding and decoding.
    pub codec_s: f64,
    /// Communication, including the reduction arithmetic.
    pub comm_s: f64,
    /// Communication hidden behind compute (`overlap`), plus, on a shared host, behind the
    /// other ranks' sync work.
    pub hidden_s: f64,
    /// `compute + codec + comm - hidden`.
    pub step_s: f64,
}

/// The prediction for one codec on one scenario.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Prediction {
    /// The codec's step.
    pub step: StepBreakdown,
    /// Dense fp32's step on the same scenario.
    pub dense: StepBreakdown,
    /// Dense step time over the codec's.
    pub speedup: f64,
    /// One worker's compute-only step time over the codec's step time on `P` workers.
    pub efficiency: f64,
}

/// Groups of consecutive tensors of at most `fusion_bytes` raw f32 bytes (a bigger tensor
/// goes alone), as element counts.
fn fuse(tensors: &[usize], fusion_bytes: usize) -> Vec<usize> {
    let cap = (fusion_bytes / 4).max(1);
    let mut groups = Vec::new();
    let mut cur = 0usize;
    for &t in tensors {
        if cur > 0 && cur + t > cap {
            groups.push(cur);
            cur = 0;
        }
        cur += t;
    }
    if cur > 0 {
        groups.push(cur);
    }
    groups
}

/// The sparse all-reduce's time for one group of `n` elements with `k` pairs per rank.
fn sparse_allreduce(net: &Network, n: f64, k: f64, p: usize) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let steps = usize::BITS - 1 - p.leading_zeros();
    let entry_bytes = |entries: f64| {
        if entries * 3.0 > n {
            4.0 * n
        } else {
            8.0 * entries
        }
    };
    let mut t = 0.0;
    for s in 0..steps {
        let bytes = entry_bytes((k * 2f64.powi(s as i32)).min(n));
        t += net.alpha + bytes * (net.beta + net.gamma);
    }
    if !p.is_power_of_two() {
        // Fold in (k pairs) and out (the final sum).
        let last = entry_bytes((k * 2f64.powi(steps as i32)).min(n));
        t += 2.0 * net.alpha + (entry_bytes(k) + last) * net.beta + entry_bytes(k) * net.gamma;
    }
    t
}

/// The time of one step of `model` with `codec` on `scenario`.
pub fn step(
    model: &ModelProfile,
    codec: &CodecProfile,
    scenario: &Scenario,
) -> Result<StepBreakdown, Error> {
    let p = scenario.workers;
    if p == 0 {
        return Err(Error::NoWorkers);
    }
    let compute = check("compute_s", model.compute_s)?;
    let e = check("encode_s_per_elem", codec.encode_s_per_elem)?;
    let d = check("decode_s_per_elem", codec.decode_s_per_elem)?;
    let w = check("wire_bytes_per_elem", codec.wire_bytes_per_elem)?;
    let overlap = check("overlap", scenario.overlap)?.min(1.0);
    let net = &scenario.network;
    let n = model.elements() as f64;
    let pf = p as f64;
    let groups = fuse(&model.tensors, scenario.fusion_bytes);
    let (codec_s, comm_s) = match codec.strategy {
        Strategy::Dense => (
            0.0,
            groups
                .iter()
                .map(|&g| canonical_allreduce(net, 4.0 * g as f64, p))
                .sum(),
        ),
        Strategy::Gather => (
            e * n + pf * d * n,
            groups
                .iter()
                .map(|&g| ring_allgather(net, w * g as f64, p))
                .sum(),
        ),
        Strategy::Sparse => (
            e * n + d * n,
            groups
                .iter()
                .map(|&g| sparse_allreduce(net, g as f64, w * g as f64 / 8.0, p))
                .sum(),
        ),
        Strategy::Stripe => {
            let m = (p - 1) as f64;
            let comm: f64 = model
                .tensors
                .iter()
                .map(|&t| {
                    if p == 1 {
                        0.0
                    } else {
                        2.0 * (m * net.alpha + m / pf * w * t as f64 * net.beta)
                    }
                })
                .sum();
            (e * n * (1.0 + 1.0 / pf) + 2.0 * d * n, comm)
        }
        Strategy::PowerSgd => (
            e * n + d * n,
            model
                .tensors
                .iter()
                .map(|&t| {
                    // The factors go by the ring's volume (`factor_algorithm`), whatever size.
                    let algo = gradwire_collective::compressed::factor_algorithm(p);
                    2.0 * allreduce(net, w * t as f64 / 2.0, p, algo)
                })
                .sum(),
        ),
        s @ (Strategy::Auto | Strategy::Quantized) => return Err(Error::Strategy(s)),
    };
    // `base` is the step before the link: compute plus codec work, or the measured step itself
    // (so a prediction never rounds below the step it was built on).
    let (compute, codec_s, others, base) = match scenario.host {
        Some(h) => {
            if h.cores == 0 {
                return Err(Error::NoCores);
            }
            let c = check("host compute_s", h.compute_s)?;
            let measured = check("host step_s", h.step_s)?;
            let sync = (measured - c).max(0.0);
            // The other ranks' share of the measured sync work (module doc).
            let others = sync * (1.0 - h.cores as f64 / pf).max(0.0);
            (c, sync, others, measured.max(c))
        }
        None => (compute, codec_s, 0.0, compute + codec_s),
    };
    let mut hidden = overlap * comm_s.min(compute);
    hidden += (comm_s - hidden).min(others);
    Ok(StepBreakdown {
        compute_s: compute,
        codec_s,
        comm_s,
        hidden_s: hidden,
        step_s: base + (comm_s - hidden).max(0.0),
    })
}

/// The codec's step, dense's step, the speedup and the scaling efficiency.
pub fn predict(
    model: &ModelProfile,
    codec: &CodecProfile,
    scenario: &Scenario,
) -> Result<Prediction, Error> {
    let s = step(model, codec, scenario)?;
    let dense = step(model, &CodecProfile::dense(), scenario)?;
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 1.0 };
    Ok(Prediction {
        step: s,
        dense,
        speedup: ratio(dense.step_s, s.step_s),
        efficiency: ratio(model.compute_s, s.step_s),
    })
}

#[cfg(test)]
mod tests;
