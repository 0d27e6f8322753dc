//! Every model: gradient length, finite loss, exact parameter round trip, seeded init.

use gradwire_train::data::DataShape;
use gradwire_train::ModelKind;

use crate::util::{image_batch, text_batch, FMNIST};

fn shape_for(kind: ModelKind) -> DataShape {
    if kind.is_language_model() {
        DataShape::Text { vocab: 30 }
    } else {
        FMNIST
    }
}

#[test]
fn every_model_trains_one_step_and_round_trips() {
    for kind in ModelKind::ALL {
        let mut m = kind.build(shape_for(kind), 7).unwrap();
        assert_eq!(m.kind(), kind);
        let n = m.num_params();
        assert_eq!(m.layout().iter().sum::<usize>(), n, "{kind}");
        let batch = if kind.is_language_model() {
            text_batch(4, 8, 30, 1)
        } else {
            image_batch(4, [1, 28, 28], 10, 1)
        };
        let mut grads = Vec::new();
        let loss = m.forward_backward(&batch, &mut grads).unwrap();
        assert!(loss.is_finite() && loss > 0.0, "{kind}: loss {loss}");
        assert_eq!(grads.len(), n, "{kind}");
        assert!(grads.iter().all(|g| g.is_finite()), "{kind}");
        assert!(grads.iter().any(|&g| g != 0.0), "{kind}: all-zero gradient");
        // Exact round trip of arbitrary values.
        let vals: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 0.1).collect();
        m.set_params(&vals);
        let mut back = Vec::new();
        m.params(&mut back);
        assert_eq!(back, vals, "{kind}: params did not round-trip");
        // Still trainable after an overwrite; evaluation counts every target.
        m.forward_backward(&batch, &mut grads).unwrap();
        assert_eq!(grads.len(), n);
        let e = m.evaluate(&batch).unwrap();
        let targets = if kind.is_language_model() { 32 } else { 4 };
        assert_eq!(e.n, targets, "{kind}");
        assert!(e.loss_sum.is_finite() && e.correct <= e.n);
        // The wrong kind of batch is an error, not a panic.
        let wrong = if kind.is_language_model() {
            image_batch(2, [1, 28, 28], 10, 1)
        } else {
            text_batch(2, 4, 30, 1)
        };
        assert!(m.forward_backward(&wrong, &mut grads).is_err());
    }
}

#[test]
fn same_seed_same_params() {
    for kind in ModelKind::ALL {
        let (mut a, mut b, mut c) = (vec![], vec![], vec![]);
        kind.build(shape_for(kind), 3).unwrap().params(&mut a);
        kind.build(shape_for(kind), 3).unwrap().params(&mut b);
        kind.build(shape_for(kind), 4).unwrap().params(&mut c);
        assert_eq!(a, b, "{kind}");
        assert_ne!(a, c, "{kind}");
    }
}

#[test]
fn known_sizes_and_names() {
    let count = |k: ModelKind| k.build(shape_for(k), 0).unwrap().num_params();
    assert_eq!(
        count(ModelKind::Mlp),
        784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
    );
    assert_eq!(count(ModelKind::LeNet), 61_706);
    for k in ModelKind::ALL {
        assert_eq!(k.name().parse::<ModelKind>().unwrap(), k);
    }
    assert!("vgg".parse::<ModelKind>().is_err());
    assert!(ModelKind::CharLstm.build(FMNIST, 0).is_err());
    assert!(ModelKind::LeNet
        .build(DataShape::Text { vocab: 5 }, 0)
        .is_err());
    // Other image shapes (CIFAR's) build too.
    let cifar = DataShape::Image {
        shape: [3, 32, 32],
        classes: 10,
    };
    for k in [ModelKind::Mlp, ModelKind::LeNet, ModelKind::ResNet8] {
        let mut m = k.build(cifar, 0).unwrap();
        let mut g = vec![];
        m.forward_backward(&image_batch(2, [3, 32, 32], 10, 0), &mut g)
            .unwrap();
        assert_eq!(g.len(), m.num_params());
    }
}

/// Tensor names, burn shapes and roles, as the codecs need them (per-column 1-bit SGD and
/// adaptive quantization, TernGrad's float output layer, DGC's dense 1-D tensors).
#[test]
fn tensors_carry_names_shapes_and_roles() {
    use gradwire_train::TensorRole::*;
    let lenet = ModelKind::LeNet.build(FMNIST, 0).unwrap();
    let got: Vec<(String, Vec<usize>, gradwire_train::TensorRole)> = lenet
        .tensors()
        .into_iter()
        .map(|t| (t.name, t.shape, t.role))
        .collect();
    let want = [
        ("conv1.weight", vec![6, 1, 5, 5], ConvWeight),
        ("conv1.bias", vec![6], Bias),
        ("conv2.weight", vec![16, 6, 5, 5], ConvWeight),
        ("conv2.bias", vec![16], Bias),
        ("fc1.weight", vec![400, 120], LinearWeight),
        ("fc1.bias", vec![120], Bias),
        ("fc2.weight", vec![120, 84], LinearWeight),
        ("fc2.bias", vec![84], Bias),
        ("fc3.weight", vec![84, 10], Output),
        ("fc3.bias", vec![10], Output),
    ];
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((g.0.as_str(), &g.1, g.2), (w.0, &w.1, w.2));
    }
    for kind in ModelKind::ALL {
        let m = kind.build(shape_for(kind), 0).unwrap();
        let t = m.tensors();
        assert_eq!(
            t.iter().map(|t| t.len()).collect::<Vec<_>>(),
            m.layout(),
            "{kind}"
        );
        let outputs = t.iter().filter(|t| t.role == Output).count();
        assert_eq!(
            outputs, 2,
            "{kind}: the last linear layer's weight and bias"
        );
        assert_eq!(t.last().unwrap().role, Output, "{kind}");
        let mut names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), t.len(), "{kind}: names are unique");
    }
    let lstm = ModelKind::CharLstm
        .build(DataShape::Text { vocab: 65 }, 0)
        .unwrap();
    let roles: Vec<_> = lstm
        .tensors()
        .into_iter()
        .map(|t| (t.name, t.role))
        .collect();
    assert!(
        roles.iter().any(|(n, r)| n == "w_ih" && *r == LinearWeight),
        "{roles:?}"
    );
    assert!(
        roles
            .iter()
            .any(|(n, r)| n.starts_with("embed") && *r == Other),
        "{roles:?}"
    );
}

/// `--model lstm:hidden=N`: the parameter count by hand (embedding 64, gates fused 4H wide,
/// output layer over the vocabulary) for the default and a smaller hidden size.
#[test]
fn lstm_hidden_size_sets_the_parameter_count() {
    let count = |v: usize, h: usize| v * 64 + 64 * 4 * h + h * 4 * h + 4 * h + h * v + v;
    for (spec, h) in [
        ("lstm", 256),
        ("lstm:hidden=128", 128),
        ("lstm:hidden=32", 32),
    ] {
        let kind: ModelKind = spec.parse().unwrap();
        let n = kind
            .build(DataShape::Text { vocab: 65 }, 0)
            .unwrap()
            .num_params();
        assert_eq!(n, count(65, h), "{spec}");
    }
}

/// The wide MLP of `--model mlp:hidden=...`: parameter count by hand, tensor names, shapes
/// and roles, one training step, and the spec's text round trip.
#[test]
fn wide_mlp_sizes_names_and_one_step() {
    use gradwire_train::TensorRole::*;
    // 784-2048-2048-2048-10, counted by hand: weights plus biases per layer.
    let paper: ModelKind = "mlp:hidden=2048x3".parse().unwrap();
    let n = paper.build(FMNIST, 0).unwrap().num_params();
    assert_eq!(
        n,
        (784 * 2048 + 2048) + 2 * (2048 * 2048 + 2048) + (2048 * 10 + 10)
    );
    assert_eq!(n, 10_020_874);
    assert_eq!("mlp:wide".parse::<ModelKind>().unwrap(), paper);
    assert_eq!(paper.to_string(), "mlp:hidden=2048x3");
    assert_eq!(paper.name(), "mlp");

    let kind: ModelKind = "mlp:hidden=40-24x2".parse().unwrap();
    let mut m = kind.build(FMNIST, 5).unwrap();
    assert_eq!(m.kind(), kind);
    let got: Vec<_> = m
        .tensors()
        .into_iter()
        .map(|t| (t.name, t.shape, t.role))
        .collect();
    let want = [
        ("hidden.0.weight", vec![784, 40], LinearWeight),
        ("hidden.0.bias", vec![40], Bias),
        ("hidden.1.weight", vec![40, 24], LinearWeight),
        ("hidden.1.bias", vec![24], Bias),
        ("hidden.2.weight", vec![24, 24], LinearWeight),
        ("hidden.2.bias", vec![24], Bias),
        ("out.weight", vec![24, 10], Output),
        ("out.bias", vec![10], Output),
    ];
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(&want) {
        assert_eq!((g.0.as_str(), &g.1, g.2), (w.0, &w.1, w.2));
    }
    let mut grads = Vec::new();
    let loss = m
        .forward_backward(&image_batch(4, [1, 28, 28], 10, 1), &mut grads)
        .unwrap();
    assert!(loss.is_finite() && loss > 0.0);
    assert_eq!(grads.len(), m.num_params());
    assert!(grads.iter().any(|&g| g != 0.0));
    assert!(m
        .forward_backward(&text_batch(2, 4, 30, 1), &mut grads)
        .is_err());
    // Same seed, same parameters.
    let (mut a, mut b) = (vec![], vec![]);
    kind.build(FMNIST, 9).unwrap().params(&mut a);
    kind.build(FMNIST, 9).unwrap().params(&mut b);
    assert_eq!(a, b);
    // Not for text data.
    assert!(kind.build(DataShape::Text { vocab: 5 }, 0).is_err());
}
