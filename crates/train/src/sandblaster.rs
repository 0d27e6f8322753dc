//! A model of this crate as a Sandblaster L-BFGS objective
//! ([`gradwire_ps::sandblaster::Objective`]), so DistBelief's batch L-BFGS runs on the real
//! models and data sets.
//!
//! - **Vector**: the model's flat `f32` parameters ([`Model::params`] order).
//! - **Full batch**: a fixed set of training examples, the whole training split or a seeded
//!   sample of it ([`ModelObjective::new`]'s `batch`), in a seeded order.
//! - **Work unit**: a contiguous slice of `unit_size` examples of the batch (the last one
//!   shorter). Its loss and gradient are the model's mean loss and mean gradient over the
//!   slice ([`Model::forward_backward`]) times the slice's length, so the units add up to
//!   the batch sums Sandblaster divides by the batch size.
//! - **Loss**: the model's own training loss (cross-entropy for the classifiers); no
//!   regularizer (λ = 0).
//! - **Threads**: a worker thread takes a model from a pool (built on first use from the
//!   same kind, data shape and seed, so as many exist as units run at once), writes the
//!   unit's parameters into it, and gives it back.
//! - **Errors**: the trait cannot fail, so a model error (none is expected on a valid
//!   split) makes the unit's loss NaN and is kept for [`ModelObjective::take_error`].

use std::sync::Mutex;

use gradwire_ps::sandblaster::Objective;

use crate::data::{epoch_permutation, DataShape, Split};
use crate::error::{ConfigError, Error, Result};
use crate::model::{Model, ModelKind};

/// A model and a full batch of a training split, as a Sandblaster objective.
pub struct ModelObjective {
    kind: ModelKind,
    shape: DataShape,
    seed: u64,
    split: Split,
    batch: Vec<usize>,
    unit_size: usize,
    dim: usize,
    init: Vec<f32>,
    pool: Mutex<Vec<Box<dyn Model>>>,
    error: Mutex<Option<Error>>,
}

impl ModelObjective {
    /// `kind` built for `shape` with `seed` (its initial parameters are
    /// [`ModelObjective::initial_params`]); the full batch is `batch` examples of `split`
    /// (all of them when `None` or larger), drawn with the seeded permutation of epoch 0;
    /// units of `unit_size` examples.
    pub fn new(
        kind: ModelKind,
        shape: DataShape,
        seed: u64,
        split: Split,
        batch: Option<usize>,
        unit_size: usize,
    ) -> Result<Self> {
        if split.is_empty() {
            return Err(ConfigError::EmptySplit.into());
        }
        if batch == Some(0) || unit_size == 0 {
            return Err(ConfigError::SandblasterSize.into());
        }
        let mut order = epoch_permutation(split.len(), seed, 0);
        order.truncate(batch.unwrap_or(usize::MAX).min(split.len()));
        let model = kind.build(shape, seed)?;
        let mut init = Vec::new();
        model.params(&mut init);
        Ok(ModelObjective {
            kind,
            shape,
            seed,
            split,
            batch: order,
            unit_size,
            dim: model.num_params(),
            init,
            pool: Mutex::new(vec![model]),
            error: Mutex::new(None),
        })
    }

    /// The model's initial parameters (from the seed).
    pub fn initial_params(&self) -> &[f32] {
        &self.init
    }

    /// Examples per unit.
    pub fn unit_size(&self) -> usize {
        self.unit_size
    }

    /// The first model error a unit met, if any (taken: a second call gives `None`).
    pub fn take_error(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn keep(&self, e: Error) {
        let mut slot = self.error.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(e);
    }

    fn model(&self) -> Result<Box<dyn Model>> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match pooled {
            Some(m) => Ok(m),
            None => self.kind.build(self.shape, self.seed),
        }
    }
}

impl Objective for ModelObjective {
    fn dim(&self) -> usize {
        self.dim
    }

    fn units(&self) -> usize {
        self.batch.len().div_ceil(self.unit_size)
    }

    fn examples(&self) -> usize {
        self.batch.len()
    }

    fn l2(&self) -> f64 {
        0.0
    }

    fn unit_loss_grad(&self, u: usize, w: &[f32], grad: &mut [f64]) -> f64 {
        let lo = (u * self.unit_size).min(self.batch.len());
        let hi = (lo + self.unit_size).min(self.batch.len());
        if lo == hi {
            return 0.0;
        }
        let mut model = match self.model() {
            Ok(m) => m,
            Err(e) => {
                self.keep(e);
                return f64::NAN;
            }
        };
        model.set_params(w);
        let mut g = Vec::new();
        let result = model.forward_backward(&self.split.batch(&self.batch[lo..hi]), &mut g);
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(model);
        match result {
            Ok(loss) => {
                let n = (hi - lo) as f64;
                for (a, b) in grad.iter_mut().zip(&g) {
                    *a += n * f64::from(*b);
                }
                n * f64::from(loss)
            }
            Err(e) => {
                self.keep(e);
                f64::NAN
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ImageSet;

    /// 50 random 28x28 images in 10 classes.
    fn split() -> Split {
        let n = 50;
        let px: Vec<u8> = (0..n * 784).map(|i| (i * 37 % 251) as u8).collect();
        let labels: Vec<u8> = (0..n).map(|i| (i * 7 % 10) as u8).collect();
        Split::Images(ImageSet::new(px, labels, [1, 28, 28], 10).unwrap())
    }

    /// The units add up to the model's own mean loss and gradient over the whole batch,
    /// computed in one forward/backward (times the batch size).
    #[test]
    fn units_add_up_to_the_full_batch() {
        crate::init_threads(1);
        let shape = DataShape::Image {
            shape: [1, 28, 28],
            classes: 10,
        };
        let kind: ModelKind = "mlp:hidden=16".parse().unwrap();
        let obj = ModelObjective::new(kind, shape, 3, split(), Some(40), 7).unwrap();
        assert_eq!((obj.examples(), obj.units()), (40, 6));
        let w = obj.initial_params().to_vec();
        let mut g = vec![0.0f64; obj.dim()];
        let loss: f64 = (0..obj.units())
            .map(|u| obj.unit_loss_grad(u, &w, &mut g))
            .sum();
        let mut model = kind.build(shape, 3).unwrap();
        let mut reference = Vec::new();
        let batch = split().batch(&epoch_permutation(50, 3, 0)[..40]);
        let mean = model.forward_backward(&batch, &mut reference).unwrap();
        assert!(
            (loss / 40.0 - f64::from(mean)).abs() < 1e-5,
            "{loss} vs {mean}"
        );
        let worst = g
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a / 40.0 - f64::from(*b)).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-5, "largest gradient difference {worst}");
        assert!(obj.take_error().is_none());
        assert!(ModelObjective::new(kind, shape, 3, split(), Some(0), 7).is_err());
    }
}
