//! The alpha-beta-gamma parameters of one link, from a `--link` spec or from measurement.

use gradwire_transport::link::LinkSpec;

use crate::{check, Error};

/// Seconds per byte reduced when not measured (10 GB/s of f32 adds).
pub const DEFAULT_GAMMA: f64 = 0.1e-9;

/// The cost of moving and reducing bytes between two ranks: a message of `n` bytes costs
/// `alpha + n * beta` on the wire, and reducing `n` bytes (f32 sum) costs `n * gamma`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Network {
    /// Seconds per message: link latency plus the software's per-message cost.
    pub alpha: f64,
    /// Seconds per byte on the wire (the inverse of the bandwidth in bytes per second).
    pub beta: f64,
    /// Seconds per byte reduced (adding received f32s into the local buffer).
    pub gamma: f64,
}

impl Network {
    /// A checked network (every cost finite and non-negative).
    pub fn new(alpha: f64, beta: f64, gamma: f64) -> Result<Network, Error> {
        Ok(Network {
            alpha: check("alpha", alpha)?,
            beta: check("beta", beta)?,
            gamma: check("gamma", gamma)?,
        })
    }

    /// The network a [`LinkSpec`] describes: `alpha` = its latency plus its per-message
    /// overhead bytes on the wire plus `software_alpha` (the per-message cost of the stack,
    /// measured or 0), `beta` = 8 / bandwidth in bits per second, and the given `gamma`.
    pub fn from_link(spec: &LinkSpec, software_alpha: f64, gamma: f64) -> Result<Network, Error> {
        let beta = 8.0 / spec.bandwidth.bits_per_sec() as f64;
        let alpha = spec.latency.as_secs_f64() + f64::from(spec.overhead) * beta + software_alpha;
        Network::new(alpha, beta, gamma)
    }

    /// [`Network::from_link`] with the software stack's per-byte cost `software_beta` added to
    /// the link's wire time (the copies and the wire do not overlap).
    pub fn from_link_with_stack(
        spec: &LinkSpec,
        software_alpha: f64,
        software_beta: f64,
        gamma: f64,
    ) -> Result<Network, Error> {
        let wire = Network::from_link(spec, software_alpha, gamma)?;
        Network::new(wire.alpha, wire.beta + software_beta, gamma)
    }

    /// Bandwidth in bits per second (infinite for `beta == 0`).
    pub fn bits_per_sec(&self) -> f64 {
        8.0 / self.beta
    }
}
