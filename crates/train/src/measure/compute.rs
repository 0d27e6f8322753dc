//! A model's compute per step, as the trainer counts it, measured on this machine.
//!
//! This file owns the training pass that is timed (forward, backward, an SGD-with-momentum
//! update over every parameter, the parameters handed back to the model) and the synthetic
//! batch it runs on, so that no data set has to be loaded to measure a model.

use std::time::Instant;

use super::{median_of_passes, MeasureError, Result};
use crate::data::{Batch, ImageBatch};
use crate::Model;

/// The gradient of one step and the median compute seconds per step
/// ([`median_of_passes`]), as the trainer counts it: forward, backward, an
/// SGD-with-momentum update over every parameter and handing the parameters back to the
/// model (`set_params`). The update's rate is zero (hidden from the compiler), so the model,
/// and the gradient returned, stay those of the initial weights.
pub fn measure_compute(model: &mut dyn Model, batch: &Batch) -> Result<(Vec<f32>, f64)> {
    let mut grad = Vec::new();
    let mut params = Vec::new();
    model.params(&mut params);
    let mut velocity = vec![0f32; params.len()];
    let lr = std::hint::black_box(0.0f32);
    let compute = median_of_passes::<MeasureError>(|| {
        let t = Instant::now();
        model
            .forward_backward(batch, &mut grad)
            .map_err(MeasureError::Model)?;
        for ((p, v), g) in params.iter_mut().zip(&mut velocity).zip(&grad) {
            *v = 0.9 * *v + g;
            *p -= lr * *v;
        }
        model.set_params(&params);
        Ok(t.elapsed().as_secs_f64())
    })?;
    Ok((grad, compute))
}

/// A deterministic batch of `n` images of `shape` (channels, height, width) with 10 classes:
/// pixels in [-1, 1] and labels from an xorshift generator seeded with `seed`.
pub fn synthetic_batch(n: usize, shape: [usize; 3], seed: u64) -> Batch {
    let px = shape.iter().product::<usize>() * n;
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    Batch::Images(ImageBatch {
        pixels: (0..px)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect(),
        labels: (0..n).map(|_| (next() % 10) as u8).collect(),
        shape,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(b: Batch) -> ImageBatch {
        match b {
            Batch::Images(i) => i,
            _ => panic!("an image batch"),
        }
    }

    #[test]
    fn synthetic_batches_are_deterministic_images_in_range() {
        let a = images(synthetic_batch(3, [1, 4, 5], 7));
        assert_eq!(a.shape, [1, 4, 5]);
        assert_eq!(a.pixels.len(), 3 * 20);
        assert_eq!(a.labels.len(), 3);
        assert!(a.pixels.iter().all(|p| (-1.0..=1.0).contains(p)));
        assert!(a.labels.iter().all(|&l| l < 10));
        let b = images(synthetic_batch(3, [1, 4, 5], 7));
        assert_eq!((a.pixels.clone(), a.labels.clone()), (b.pixels, b.labels));
        let c = images(synthetic_batch(3, [1, 4, 5], 8));
        assert_ne!(a.pixels, c.pixels);
    }
}
