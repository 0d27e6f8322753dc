//! The learning rate at each step: linear warm-up over the first steps, then a decay.

use super::config::{LrDecay, OptimizerConfig};

impl OptimizerConfig {
    /// The learning rate of the 0-based optimizer step `step`; `total_steps` is the run
    /// length (used by cosine decay when the config leaves it open).
    pub fn lr_at(&self, step: u64, total_steps: Option<u64>) -> f64 {
        let base = self.lr;
        if step < self.warmup_steps {
            return base * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let s = step - self.warmup_steps;
        match self.decay {
            LrDecay::Constant => base,
            LrDecay::Step { every, gamma } => {
                base * gamma.powi((s / every.max(1)).min(i32::MAX as u64) as i32)
            }
            LrDecay::Cosine {
                total_steps: own,
                min_lr,
            } => {
                let Some(total) = own.or(total_steps) else {
                    return base;
                };
                let span = total.saturating_sub(self.warmup_steps).max(1);
                let frac = s.min(span) as f64 / span as f64;
                min_lr + (base - min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * frac).cos())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_decay() {
        let mut c: OptimizerConfig = "sgd:lr=1,warmup=4".parse().unwrap();
        let lrs: Vec<f64> = (0..6).map(|s| c.lr_at(s, None)).collect();
        assert_eq!(lrs, vec![0.25, 0.5, 0.75, 1.0, 1.0, 1.0]);
        c.decay = LrDecay::Step {
            every: 2,
            gamma: 0.1,
        };
        let lrs: Vec<f64> = (4..10).map(|s| c.lr_at(s, None)).collect();
        let want = [1.0, 1.0, 0.1, 0.1, 0.01, 0.01];
        for (a, b) in lrs.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{lrs:?}");
        }
        c.decay = LrDecay::Cosine {
            total_steps: None,
            min_lr: 0.0,
        };
        assert_eq!(c.lr_at(4, Some(14)), 1.0);
        assert!((c.lr_at(9, Some(14)) - 0.5).abs() < 1e-12);
        assert!(c.lr_at(14, Some(14)).abs() < 1e-12);
        assert!(c.lr_at(100, Some(14)).abs() < 1e-12);
        assert_eq!(c.lr_at(9, None), 1.0);
    }
}
