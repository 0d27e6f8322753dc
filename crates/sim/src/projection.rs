//! A sweep of model-parallel projections, as `gradwire simulate --model-parallel` makes them:
//! the models checked up front ([`plan`]), then one [`MpRow`] per (model, split, link, K)
//! ([`rows`]) at a partition's rate ([`measured_gflops`] or given).

use crate::report::{MpInputs, MpRow};
use crate::{mp_step, Error, FcNet, MpConfig, Network, Split};

/// Which projection of a [`plan`] cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProjectionError {
    /// A parameter count that does not make a model of `layers` layers.
    #[error("{params} parameters in {layers} layers: {source}")]
    Model {
        /// The parameter count.
        params: f64,
        /// The layers.
        layers: usize,
        /// Why.
        #[source]
        source: Error,
    },
    /// A model that cannot be split over `k` partitions.
    #[error("{k} partitions of {params} parameters ({layers} layers of {width}): {source}")]
    Split {
        /// The partitions.
        k: usize,
        /// The model's parameters.
        params: f64,
        /// Its layers.
        layers: usize,
        /// Its width.
        width: usize,
        /// Why.
        #[source]
        source: Error,
    },
}

/// The fully connected model of each of `params` parameters in `layers` layers, each checked
/// against every split and partition count (at a placeholder rate and link) before anything
/// is measured.
pub fn plan(
    params: &[f64],
    layers: usize,
    splits: &[Split],
    partitions: &[usize],
    batch: usize,
    micro_batches: usize,
    half_rate_dim: f64,
) -> Result<Vec<FcNet>, ProjectionError> {
    let config = MpConfig {
        micro_batches,
        half_rate_dim,
        ..MpConfig::new(batch, 1e9)
    };
    let net = Network {
        alpha: 0.0,
        beta: 0.0,
        gamma: 0.0,
    };
    let mut nets = Vec::new();
    for &p in params {
        let fc = FcNet::from_params(p, layers).map_err(|source| ProjectionError::Model {
            params: p,
            layers,
            source,
        })?;
        for &split in splits {
            for &k in partitions {
                mp_step(&fc, split, k, &config, &net).map_err(|source| ProjectionError::Split {
                    k,
                    params: fc.params(),
                    layers: fc.layers,
                    width: fc.width,
                    source,
                })?;
            }
        }
        nets.push(fc);
    }
    Ok(nets)
}

/// One row per (model, split, link, K), in that nesting, at `inputs`' rate and options.
pub fn rows(
    nets: &[FcNet],
    splits: &[Split],
    partitions: &[usize],
    inputs: &MpInputs,
    networks: &[(String, Network)],
) -> Result<Vec<MpRow>, Error> {
    let config = MpConfig {
        micro_batches: inputs.micro_batches,
        half_rate_dim: inputs.half_rate_dim,
        ..MpConfig::new(inputs.batch, inputs.gflops * 1e9)
    };
    let mut rows = Vec::new();
    for fc in nets {
        for &split in splits {
            for (link, net) in networks {
                for &k in partitions {
                    let s = mp_step(fc, split, k, &config, net)?;
                    rows.push(MpRow {
                        params: fc.params() as u64,
                        layers: fc.layers,
                        width: fc.width,
                        k,
                        split,
                        link: link.clone(),
                        step_s: s.step_s,
                        compute_s: s.compute_s,
                        boundary_bytes: s.boundary_bytes,
                        comm_s: s.comm_s,
                        speedup: s.speedup,
                    });
                }
            }
        }
    }
    Ok(rows)
}

/// The sustained GFLOP/s of a step of a model of `params` parameters on `batch` examples
/// taking `compute_s` (`6 x params x batch / compute`), or `None` for no compute.
pub fn measured_gflops(params: usize, batch: usize, compute_s: f64) -> Option<f64> {
    (compute_s > 0.0).then(|| 6.0 * params as f64 * batch as f64 / compute_s / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_refuse_what_cannot_be_split_and_rows_nest() {
        // 8 layers of width 100: a pipeline has 8 pieces.
        let nets = plan(&[80_000.0], 8, &[Split::Tensor], &[2, 4], 64, 8, 0.0).unwrap();
        assert_eq!((nets[0].layers, nets[0].width), (8, 100));
        let e = plan(&[80_000.0], 8, &[Split::Pipeline], &[16], 64, 8, 0.0).unwrap_err();
        assert!(matches!(e, ProjectionError::Split { k: 16, .. }), "{e}");
        let e = plan(&[80_000.0], 0, &[Split::Tensor], &[2], 64, 8, 0.0).unwrap_err();
        assert!(matches!(e, ProjectionError::Model { layers: 0, .. }), "{e}");
        let inputs = MpInputs {
            batch: 64,
            gflops: 10.0,
            gflops_measured: false,
            micro_batches: 8,
            half_rate_dim: 0.0,
        };
        let net = Network::new(1e-6, 1e-9, 0.0).unwrap();
        let links = [("a".to_string(), net), ("b".to_string(), net)];
        let r = rows(&nets, &[Split::Tensor], &[2, 4], &inputs, &links).unwrap();
        let keys: Vec<(&str, usize)> = r.iter().map(|r| (r.link.as_str(), r.k)).collect();
        assert_eq!(keys, [("a", 2), ("a", 4), ("b", 2), ("b", 4)]);
        let config = MpConfig {
            micro_batches: 8,
            half_rate_dim: 0.0,
            ..MpConfig::new(64, 10e9)
        };
        let want = mp_step(&nets[0], Split::Tensor, 4, &config, &net).unwrap();
        assert_eq!((r[1].step_s, r[1].comm_s), (want.step_s, want.comm_s));
        assert_eq!(r[1].params, 80_000);
    }

    #[test]
    fn the_measured_rate_is_six_flops_per_parameter_and_example() {
        // 1M parameters, batch 50, 0.3 s: 3e8 / 0.3 = 1 GFLOP/s.
        assert_eq!(measured_gflops(1_000_000, 50, 0.3), Some(1.0));
        assert_eq!(measured_gflops(1_000_000, 50, 0.0), None);
    }
}
