//! Seeded parameter initialization, independent of the framework's global RNG: each model
//! lists one [`ParamInit`] per parameter tensor (in flat order) and the values are drawn from
//! one ChaCha8 stream, so the same seed gives bit-identical parameters in every process and
//! thread.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How one parameter tensor is initialized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamInit {
    /// Uniform in `[-bound, bound)`.
    Uniform(f32),
    /// Normal with mean 0 and this standard deviation.
    Normal(f32),
    /// Every element set to this value.
    Const(f32),
}

impl ParamInit {
    /// PyTorch's default for a linear or conv layer's weight and bias: uniform with bound
    /// `1 / sqrt(fan_in)`.
    pub fn fan_in(fan_in: usize) -> Self {
        ParamInit::Uniform(1.0 / (fan_in.max(1) as f32).sqrt())
    }

    /// He (Kaiming) uniform for a weight followed by a ReLU: bound `sqrt(6 / fan_in)`.
    pub fn he(fan_in: usize) -> Self {
        ParamInit::Uniform((6.0 / fan_in.max(1) as f32).sqrt())
    }
}

/// Fills a flat parameter buffer of the given per-tensor `layout` from `plan` and `seed`.
pub fn init_flat(layout: &[usize], plan: &[ParamInit], seed: u64) -> Vec<f32> {
    assert_eq!(
        layout.len(),
        plan.len(),
        "one init rule per parameter tensor"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(layout.iter().sum());
    for (&n, &rule) in layout.iter().zip(plan) {
        match rule {
            ParamInit::Const(v) => out.extend(std::iter::repeat_n(v, n)),
            ParamInit::Uniform(b) => out.extend((0..n).map(|_| rng.gen_range(-b..b))),
            ParamInit::Normal(s) => out.extend((0..n).map(|_| s * std_normal(&mut rng))),
        }
    }
    out
}

/// One standard normal draw (Box-Muller, deterministic given the stream).
fn std_normal(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = 1.0 - rng.gen::<f64>(); // in (0, 1]
    let u2: f64 = rng.gen();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_and_shaped() {
        let layout = [1000, 3, 20000];
        let plan = [
            ParamInit::Uniform(0.5),
            ParamInit::Const(1.0),
            ParamInit::Normal(2.0),
        ];
        let a = init_flat(&layout, &plan, 1);
        assert_eq!(a, init_flat(&layout, &plan, 1));
        assert_ne!(a, init_flat(&layout, &plan, 2));
        assert!(a[..1000].iter().all(|x| (-0.5..0.5).contains(x)));
        assert_eq!(&a[1000..1003], &[1.0; 3]);
        let n = &a[1003..];
        let mean = n.iter().sum::<f32>() / n.len() as f32;
        let var = n.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n.len() as f32;
        assert!(
            mean.abs() < 0.05 && (var.sqrt() - 2.0).abs() < 0.05,
            "{mean} {var}"
        );
    }
}
