//! A sweep of data-parallel predictions, as `gradwire simulate` makes them: every (link,
//! worker count, codec), in that nesting ([`sweep`]).
//!
//! With the workers sharing `host_cores` cores of one host, each codec's costs are multiplied
//! by `max(1, workers / cores)`; where a whole step of that codec was measured on the host
//! ([`HostStep`]) the prediction starts from it (`crate::predict`'s module doc), and dense's
//! measured step is the speedup's baseline. Efficiency is always against one worker with the
//! machine to itself: the model's compute over the step.

use crate::lockstep::HostStep;
use crate::report::SimResult;
use crate::{
    predict, step, CodecProfile, Error, MeasuredStep, ModelProfile, Network, Prediction, Scenario,
};

/// The codec spec of dense fp32 (no codec).
pub const DENSE: &str = "none";

/// What a sweep predicts over.
#[derive(Debug, Clone, Copy)]
pub struct Sweep<'a> {
    /// The model (its compute per step included).
    pub model: &'a ModelProfile,
    /// The codecs, each with its costs.
    pub codecs: &'a [CodecProfile],
    /// The links: spec as given, and its network.
    pub networks: &'a [(String, Network)],
    /// The worker counts.
    pub workers: &'a [usize],
    /// Fraction of the communication hidden behind compute.
    pub overlap: f64,
    /// The engine's fusion buffer in bytes.
    pub fusion_bytes: usize,
    /// Cores of one host the workers share, if they do.
    pub host_cores: Option<usize>,
    /// Steps measured on that host, per worker count and codec (empty: none measured).
    pub host_steps: &'a [HostStep],
}

/// One prediction of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepRow {
    /// The link spec as given.
    pub link: String,
    /// Number of workers.
    pub workers: usize,
    /// The codec and its costs (unshared).
    pub codec: CodecProfile,
    /// The prediction.
    pub prediction: Prediction,
}

impl SweepRow {
    /// The row as the report's `results` entry.
    pub fn result(&self) -> SimResult {
        SimResult {
            workers: self.workers,
            link: self.link.clone(),
            codec: self.codec.spec.clone(),
            step_s: self.prediction.step.step_s,
            speedup: self.prediction.speedup,
            efficiency: self.prediction.efficiency,
        }
    }
}

/// Every (link, worker count, codec) of `s` predicted (module doc).
pub fn sweep(s: &Sweep) -> Result<Vec<SweepRow>, Error> {
    let mut rows = Vec::new();
    for (spec, net) in s.networks {
        for &workers in s.workers {
            let share = s
                .host_cores
                .map_or(1.0, |cores| (workers as f64 / cores as f64).max(1.0));
            // The step of this codec measured on the shared host, if any.
            let host_of = |codec: &str| {
                let cores = s.host_cores?;
                s.host_steps
                    .iter()
                    .find(|h| h.workers == workers && h.codec == codec)
                    .map(|h| MeasuredStep {
                        cores,
                        compute_s: h.compute.slowest_s,
                        step_s: h.step_s,
                    })
            };
            let at = |host| Scenario {
                workers,
                network: *net,
                overlap: s.overlap,
                fusion_bytes: s.fusion_bytes,
                host,
            };
            for c in s.codecs {
                let shared = CodecProfile {
                    encode_s_per_elem: c.encode_s_per_elem * share,
                    decode_s_per_elem: c.decode_s_per_elem * share,
                    ..c.clone()
                };
                let mut p = predict(s.model, &shared, &at(host_of(&c.spec)))?;
                // On a shared host dense's own measured step is the speedup's baseline.
                if let Some(h) = host_of(DENSE) {
                    p.dense = step(s.model, &CodecProfile::dense(), &at(Some(h)))?;
                    p.speedup = p.dense.step_s / p.step.step_s;
                }
                // Against one worker with the machine to itself.
                p.efficiency = s.model.compute_s / p.step.step_s;
                rows.push(SweepRow {
                    link: spec.clone(),
                    workers,
                    codec: c.clone(),
                    prediction: p,
                });
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lockstep::Lockstep;
    use crate::Strategy;

    fn model() -> ModelProfile {
        ModelProfile {
            name: "m".into(),
            tensors: vec![1_000_000],
            compute_s: 0.01,
        }
    }

    fn codec(spec: &str, e: f64) -> CodecProfile {
        CodecProfile {
            spec: spec.into(),
            strategy: Strategy::Stripe,
            encode_s_per_elem: e,
            decode_s_per_elem: e,
            wire_bytes_per_elem: 1.0,
        }
    }

    #[test]
    fn rows_nest_links_then_workers_then_codecs_and_efficiency_is_against_one_worker() {
        let nets = [
            ("a".to_string(), Network::new(0.0, 1e-9, 0.0).unwrap()),
            ("b".to_string(), Network::new(0.0, 1e-8, 0.0).unwrap()),
        ];
        let codecs = [CodecProfile::dense(), codec("x", 1e-9)];
        let m = model();
        let s = Sweep {
            model: &m,
            codecs: &codecs,
            networks: &nets,
            workers: &[2, 4],
            overlap: 0.0,
            fusion_bytes: 0,
            host_cores: None,
            host_steps: &[],
        };
        let rows = sweep(&s).unwrap();
        let keys: Vec<(&str, usize, &str)> = rows
            .iter()
            .map(|r| (r.link.as_str(), r.workers, r.codec.spec.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("a", 2, "none"),
                ("a", 2, "x"),
                ("a", 4, "none"),
                ("a", 4, "x"),
                ("b", 2, "none"),
                ("b", 2, "x"),
                ("b", 4, "none"),
                ("b", 4, "x")
            ]
        );
        for r in &rows {
            let want = predict(
                &m,
                &r.codec,
                &Scenario {
                    workers: r.workers,
                    network: nets.iter().find(|n| n.0 == r.link).unwrap().1,
                    overlap: 0.0,
                    fusion_bytes: 0,
                    host: None,
                },
            )
            .unwrap();
            assert_eq!(r.prediction.step, want.step);
            assert_eq!(r.prediction.efficiency, 0.01 / want.step.step_s);
            let res = r.result();
            assert_eq!((res.step_s, res.speedup), (want.step.step_s, want.speedup));
        }
    }

    #[test]
    fn shared_cores_scale_codec_costs_and_a_measured_dense_step_is_the_baseline() {
        let nets = [("a".to_string(), Network::new(0.0, 1e-9, 0.0).unwrap())];
        let codecs = [codec("x", 1e-9)];
        let m = model();
        let mut s = Sweep {
            model: &m,
            codecs: &codecs,
            networks: &nets,
            workers: &[4],
            overlap: 0.0,
            fusion_bytes: 0,
            host_cores: Some(2),
            host_steps: &[],
        };
        // 4 workers on 2 cores, nothing measured: the codec costs twice what it did.
        let row = &sweep(&s).unwrap()[0];
        let doubled = codec("x", 2e-9);
        let sc = Scenario {
            workers: 4,
            network: nets[0].1,
            overlap: 0.0,
            fusion_bytes: 0,
            host: None,
        };
        assert_eq!(
            row.prediction.step,
            predict(&m, &doubled, &sc).unwrap().step
        );
        assert_eq!(row.codec, codecs[0], "the row keeps the unshared costs");
        // Dense measured on the host: the speedup is its step over the codec's.
        let compute = Lockstep {
            workers: 4,
            mean_s: 0.02,
            slowest_s: 0.03,
        };
        let steps = [HostStep {
            workers: 4,
            codec: DENSE.into(),
            compute,
            step_s: 0.05,
        }];
        s.host_steps = &steps;
        let row = &sweep(&s).unwrap()[0];
        let h = MeasuredStep {
            cores: 2,
            compute_s: 0.03,
            step_s: 0.05,
        };
        let dense = step(
            &m,
            &CodecProfile::dense(),
            &Scenario {
                host: Some(h),
                ..sc
            },
        )
        .unwrap();
        assert_eq!(row.prediction.dense, dense);
        assert_eq!(
            row.prediction.speedup,
            dense.step_s / row.prediction.step.step_s
        );
    }
}
