//! A burn network defined outside gradwire (here) trains data-parallel through the adapter:
//! 2 local ranks, gradients through the engine with a codec, the same SGD step on each; the
//! ranks' parameters stay bit-identical, and each rank's loss on its (fixed) batch falls.

use std::thread;

use gradwire_train::burn::{
    self,
    nn::{Linear, LinearConfig},
    prelude::*,
    tensor::activation::tanh,
};
use gradwire_train::data::Batch;
use gradwire_train::model::flat_images;
use gradwire_train::{BurnModel, EngineConfig, EngineSync, GradientSync, Model, ModelKind, Net};
use gradwire_transport::local::Local;
use gradwire_transport::Transport;

use crate::util::image_batch;

/// 784 -> 32 -> tanh -> 10, with a bias-free output: none of gradwire's built-ins.
#[derive(Module, Debug)]
struct Tiny {
    a: Linear,
    b: Linear,
}

impl Net for Tiny {
    fn logits(
        &self,
        batch: &Batch,
        device: &Device,
    ) -> gradwire_train::Result<(Tensor<2>, Tensor<1, Int>)> {
        let (x, y) = flat_images(batch, device).expect("image batches only");
        Ok((self.b.forward(tanh(self.a.forward(x))), y))
    }
}

fn tiny() -> BurnModel<Tiny> {
    let device = Device::flex().autodiff();
    let net = Tiny {
        a: LinearConfig::new(784, 32).init(&device),
        b: LinearConfig::new(32, 10).with_bias(false).init(&device),
    };
    BurnModel::custom(net, device, 0)
}

#[test]
fn a_model_of_ones_own_trains_on_two_ranks_with_identical_parameters() {
    let m = tiny();
    assert_eq!(m.kind(), ModelKind::Custom);
    let names: Vec<String> = m.tensors().iter().map(|t| t.name.clone()).collect();
    assert_eq!(names.len(), 3, "a.weight, a.bias, b.weight: {names:?}");
    assert_eq!(m.num_params(), 784 * 32 + 32 + 32 * 10);
    let handles: Vec<_> = Local::world(2)
        .into_iter()
        .map(|t| {
            thread::spawn(move || {
                let rank = t.rank();
                let mut model = tiny();
                let codec = "topk:ratio=0.05".parse().unwrap();
                let cfg = EngineConfig {
                    codec,
                    ..EngineConfig::default()
                };
                let mut sync = EngineSync::new(t, cfg, &model.tensors(), 1).unwrap();
                let mut params = Vec::new();
                model.params(&mut params);
                // Each rank built its own random initial values: rank 0's win.
                sync.broadcast_params(&mut params).unwrap();
                model.set_params(&params);
                let mut losses = Vec::new();
                let mut grads = Vec::new();
                let batch = image_batch(16, [1, 28, 28], 10, 100 + rank as u64);
                for _ in 0..12 {
                    losses.push(model.forward_backward(&batch, &mut grads).unwrap());
                    sync.sync(&mut grads).unwrap();
                    for (p, g) in params.iter_mut().zip(&grads) {
                        *p -= 0.1 * g;
                    }
                    model.set_params(&params);
                }
                let mut out = Vec::new();
                model.params(&mut out);
                (out, losses)
            })
        })
        .collect();
    let got: Vec<(Vec<f32>, Vec<f32>)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&got[0].0),
        bits(&got[1].0),
        "the ranks' parameters differ"
    );
    let fresh = {
        let mut p = Vec::new();
        tiny().params(&mut p);
        p
    };
    assert_ne!(bits(&got[0].0), bits(&fresh), "training moved nothing");
    for (rank, (_, losses)) in got.iter().enumerate() {
        assert!(
            losses.last().unwrap() < &(0.9 * losses[0]),
            "rank {rank}: the loss did not fall: {losses:?}"
        );
    }
}
