//! The hand-written CPU LeNet (`ModelKind::build`) against burn's LeNet with autodiff
//! (`ModelKind::build_burn`), the independent reference: same parameters and metadata, the
//! same loss and gradients within float rounding on random inputs and parameters, the same
//! trajectory over SGD steps, the same evaluation, and typed errors for bad batches.

use gradwire_train::data::{Batch, DataShape, ImageBatch};
use gradwire_train::{Model, ModelKind, OptimizerConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::util::{image_batch, FMNIST};

fn both(shape: DataShape, seed: u64) -> (Box<dyn Model>, Box<dyn Model>) {
    (
        ModelKind::LeNet.build(shape, seed).unwrap(),
        ModelKind::LeNet.build_burn(shape, seed).unwrap(),
    )
}

fn params(m: &dyn Model) -> Vec<f32> {
    let mut v = Vec::new();
    m.params(&mut v);
    v
}

/// Largest `|a - b| / (1 + |b|)` (absolute near zero, relative for large values).
fn max_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f32::max)
}

#[test]
fn hand_written_lenet_has_burns_params_and_metadata() {
    for (shape, seed) in [
        (FMNIST, 42),
        (
            DataShape::Image {
                shape: [3, 32, 32],
                classes: 10,
            },
            7,
        ),
    ] {
        let (fast, reference) = both(shape, seed);
        assert_eq!(params(&*fast), params(&*reference));
        assert_eq!(fast.layout(), reference.layout());
        assert_eq!(fast.tensors(), reference.tensors());
        assert_eq!(fast.kind(), ModelKind::LeNet);
    }
}

#[test]
fn hand_written_lenet_gradients_equal_burns() {
    // Fashion-MNIST's shape, a 3-channel one, and an odd one whose pools drop a row/column.
    for (img, classes, n) in [
        ([1, 28, 28], 10, 64),
        ([3, 32, 32], 10, 8),
        ([2, 30, 26], 7, 5),
    ] {
        let shape = DataShape::Image {
            shape: img,
            classes,
        };
        for seed in [1u64, 2] {
            let (mut fast, mut reference) = both(shape, seed);
            if seed == 2 {
                // Arbitrary parameters, larger than the init's, so more units are active.
                let mut rng = ChaCha8Rng::seed_from_u64(99);
                let p: Vec<f32> = (0..fast.num_params())
                    .map(|_| rng.gen_range(-0.3..0.3))
                    .collect();
                fast.set_params(&p);
                reference.set_params(&p);
            }
            let batch = image_batch(n, img, classes, seed + 10);
            let (mut gf, mut gr) = (Vec::new(), Vec::new());
            let lf = fast.forward_backward(&batch, &mut gf).unwrap();
            let lr = reference.forward_backward(&batch, &mut gr).unwrap();
            assert!(
                (lf - lr).abs() <= 1e-5 * (1.0 + lr.abs()),
                "{img:?}: loss {lf} vs {lr}"
            );
            let e = max_err(&gf, &gr);
            assert!(e <= 1e-5, "{img:?} seed {seed}: gradient error {e}");
            assert!(gr.iter().any(|&g| g.abs() > 1e-3), "a degenerate reference");
            // Every tensor's gradient is non-trivial (no tensor left out).
            let mut at = 0;
            for len in reference.layout() {
                assert!(
                    gf[at..at + len].iter().any(|&g| g != 0.0),
                    "{img:?} at {at}"
                );
                at += len;
            }
        }
    }
}

#[test]
fn hand_written_lenet_follows_burns_sgd_trajectory() {
    let (mut fast, mut reference) = both(FMNIST, 5);
    let n = fast.num_params();
    let mut of = OptimizerConfig::sgd(0.05, 0.9).build(n, None).unwrap();
    let mut or = OptimizerConfig::sgd(0.05, 0.9).build(n, None).unwrap();
    let (mut pf, mut pr) = (params(&*fast), params(&*reference));
    let (mut gf, mut gr) = (Vec::new(), Vec::new());
    let (mut first, mut last) = (0.0, 0.0);
    for step in 0..30u64 {
        // A learnable task: the label is the brightest of 10 bands of the image.
        let Batch::Images(mut b) = image_batch(32, [1, 28, 28], 10, 100 + step) else {
            unreachable!()
        };
        for (img, label) in b.pixels.chunks_mut(784).zip(&mut b.labels) {
            for (i, px) in img.iter_mut().enumerate() {
                if i * 10 / 784 == usize::from(*label) {
                    *px += 1.0;
                }
            }
        }
        let batch = Batch::Images(b);
        let lf = fast.forward_backward(&batch, &mut gf).unwrap();
        let lr = reference.forward_backward(&batch, &mut gr).unwrap();
        assert!(
            (lf - lr).abs() <= 1e-3 * (1.0 + lr.abs()),
            "step {step}: {lf} vs {lr}"
        );
        of.step(&mut pf, &gf).unwrap();
        or.step(&mut pr, &gr).unwrap();
        fast.set_params(&pf);
        reference.set_params(&pr);
        if step == 0 {
            first = lr;
        }
        last = lr;
    }
    let e = max_err(&pf, &pr);
    assert!(e <= 1e-3, "parameters drifted apart by {e}");
    assert!(
        last < first * 0.5,
        "the reference did not learn: {first} -> {last}"
    );
}

#[test]
fn hand_written_lenet_evaluates_as_burn() {
    let (fast, reference) = both(FMNIST, 3);
    // 300 samples: more than one internal chunk, not a multiple of it.
    let batch = image_batch(300, [1, 28, 28], 10, 4);
    let (ef, er) = (
        fast.evaluate(&batch).unwrap(),
        reference.evaluate(&batch).unwrap(),
    );
    assert_eq!(ef.n, 300);
    assert_eq!(ef.n, er.n);
    assert_eq!(ef.correct, er.correct);
    assert!(
        (ef.loss_sum - er.loss_sum).abs() <= 1e-4 * er.loss_sum.abs(),
        "{ef:?} {er:?}"
    );
}

#[test]
fn hand_written_lenet_refuses_bad_batches() {
    let mut m = ModelKind::LeNet.build(FMNIST, 1).unwrap();
    let mut g = Vec::new();
    let bad_shape = image_batch(2, [1, 28, 27], 10, 1);
    assert!(m.forward_backward(&bad_shape, &mut g).is_err());
    assert!(m.evaluate(&bad_shape).is_err());
    let short = Batch::Images(ImageBatch {
        pixels: vec![0.0; 783],
        labels: vec![0],
        shape: [1, 28, 28],
    });
    assert!(m.forward_backward(&short, &mut g).is_err());
    let bad_label = Batch::Images(ImageBatch {
        pixels: vec![0.0; 784],
        labels: vec![10],
        shape: [1, 28, 28],
    });
    assert!(m.forward_backward(&bad_label, &mut g).is_err());
    assert!(m.evaluate(&bad_label).is_err());
    let empty = Batch::Images(ImageBatch {
        pixels: vec![],
        labels: vec![],
        shape: [1, 28, 28],
    });
    assert!(m.forward_backward(&empty, &mut g).is_err());
    // Still usable after the refusals.
    let ok = image_batch(2, [1, 28, 28], 10, 1);
    assert!(m.forward_backward(&ok, &mut g).unwrap().is_finite());
}
