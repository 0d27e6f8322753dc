//! Data-parallel runs over the in-process `Local` transport.

use std::thread;

use gradwire_train::data::{Dataset, DatasetKind, Split};
use gradwire_train::{
    EngineConfig, EngineSync, EvalMode, GradientSync, ModelKind, MomentumConfig, OptimizerConfig,
    TrainConfig, Trainer,
};
use gradwire_transport::local::Local;
use gradwire_transport::Transport;

use crate::util::{image_batch, real_data, FMNIST};

/// 4 ranks each with a quarter of a global batch, dense-synced, give the gradient (and the
/// SGD step) of one process on the whole batch.
#[test]
fn dense_sync_over_4_ranks_matches_one_process() {
    let global = image_batch(32, [1, 28, 28], 10, 11);
    let gradwire_train::data::Batch::Images(g) = &global else {
        unreachable!()
    };
    let quarter = |r: usize| {
        gradwire_train::data::Batch::Images(gradwire_train::data::ImageBatch {
            pixels: g.pixels[r * 8 * 784..(r + 1) * 8 * 784].to_vec(),
            labels: g.labels[r * 8..(r + 1) * 8].to_vec(),
            shape: g.shape,
        })
    };
    for kind in [ModelKind::Mlp, ModelKind::LeNet] {
        let mut single = kind.build(FMNIST, 5).unwrap();
        let mut want = vec![];
        single.forward_backward(&global, &mut want).unwrap();
        let handles: Vec<_> = Local::world(4)
            .into_iter()
            .map(|t| {
                let b = quarter(t.rank());
                thread::spawn(move || {
                    let mut m = kind.build(FMNIST, 5).unwrap();
                    let mut sync = EngineSync::dense(t, &m.tensors()).unwrap();
                    let mut grads = vec![];
                    m.forward_backward(&b, &mut grads).unwrap();
                    sync.sync(&mut grads).unwrap();
                    grads
                })
            })
            .collect();
        let got: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for r in &got[1..] {
            assert_eq!(r, &got[0], "{kind}: ranks disagree after the all-reduce");
        }
        let scale = want.iter().fold(0f32, |a, &x| a.max(x.abs()));
        let err = want
            .iter()
            .zip(&got[0])
            .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(
            err <= 1e-5 * scale.max(1.0),
            "{kind}: max |diff| {err} (scale {scale})"
        );
    }
}

fn run_world(
    world: usize,
    data: &Dataset,
    kind: ModelKind,
    config: TrainConfig,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    run_world_with(world, data, kind, config, None)
}

/// Trains on `world` ranks, dense or through `codec` (a spec, with momentum correction when
/// the second field is set); returns each rank's final parameters and losses.
fn run_world_with(
    world: usize,
    data: &Dataset,
    kind: ModelKind,
    config: TrainConfig,
    codec: Option<(&str, bool)>,
) -> Vec<(Vec<f32>, Vec<f32>)> {
    let handles: Vec<_> = Local::world(world)
        .into_iter()
        .map(|t| {
            let data = data.clone();
            let config = config.clone();
            let codec = codec.map(|(s, mc)| (s.to_string(), mc));
            thread::spawn(move || {
                let model = kind.build(data.shape(), config.seed).unwrap();
                let steps = data.train.len() / world / config.batch_size;
                let sync: Box<dyn GradientSync> = match &codec {
                    None => Box::new(EngineSync::dense(t, &model.tensors()).unwrap()),
                    Some((spec, mc)) => {
                        let engine = EngineConfig {
                            codec: spec.parse().unwrap(),
                            momentum: mc.then_some(MomentumConfig {
                                beta: 0.9,
                                nesterov: false,
                                masking: true,
                            }),
                            seed: config.seed,
                            ..EngineConfig::default()
                        };
                        Box::new(EngineSync::new(t, engine, &model.tensors(), steps).unwrap())
                    }
                };
                let mut tr = Trainer::new(model, sync, config, data.train.len()).unwrap();
                let mut losses = vec![];
                tr.fit(&data, &mut |s| losses.push(s.loss), &mut |_| {})
                    .unwrap();
                (tr.params().to_vec(), losses)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn mean(x: &[f32]) -> f32 {
    x.iter().sum::<f32>() / x.len() as f32
}

/// A short 4-rank run on real Fashion-MNIST: the loss falls and every rank ends with
/// bit-identical parameters; a second run with the same seed is bit-identical too.
#[test]
fn four_ranks_on_real_fashion_mnist_learn_and_agree() {
    let Some(mut data) = real_data(DatasetKind::FashionMnist, 0) else {
        return;
    };
    data.truncate(4 * 32 * 40, 1000);
    let config = TrainConfig {
        batch_size: 32,
        epochs: 2,
        seed: 9,
        optimizer: "sgd:lr=0.05,momentum=0.9".parse().unwrap(),
        eval: EvalMode::All,
        ..TrainConfig::default()
    };
    let out = run_world(4, &data, ModelKind::Mlp, config.clone());
    for (p, _) in &out[1..] {
        assert!(p == &out[0].0, "ranks ended with different parameters");
    }
    let losses = &out[0].1;
    assert_eq!(losses.len(), 80);
    let (first, last) = (mean(&losses[..10]), mean(&losses[70..]));
    assert!(last < 0.7 * first, "loss did not fall: {first} -> {last}");
    let again = run_world(4, &data, ModelKind::Mlp, config);
    assert!(
        again[0].0 == out[0].0,
        "same seed gave different parameters"
    );
}

/// The same short run through four codecs, one per compressed all-reduce (sparse, gather,
/// quantized ring) and DGC's own momentum: the loss falls, ranks agree bit for bit, and a
/// rerun with the same seed (stochastic codecs included) is identical.
#[test]
fn codecs_on_real_fashion_mnist_learn_and_agree() {
    let Some(mut data) = real_data(DatasetKind::FashionMnist, 0) else {
        return;
    };
    data.truncate(4 * 32 * 30, 500);
    for (spec, optimizer, mc) in [
        ("topk:ratio=0.01", "sgd:lr=0.05", true),
        ("qsgd:bits=4", "sgd:lr=0.05,momentum=0.9", false),
        ("fp16", "sgd:lr=0.05,momentum=0.9", false),
        ("onebit", "sgd:lr=0.05", true),
        ("dgc:ratio=0.01,warmup_epochs=0", "sgd:lr=0.05", false),
    ] {
        let config = TrainConfig {
            batch_size: 32,
            epochs: 2,
            seed: 3,
            optimizer: optimizer.parse().unwrap(),
            eval: EvalMode::All,
            ..TrainConfig::default()
        };
        let out = run_world_with(4, &data, ModelKind::Mlp, config.clone(), Some((spec, mc)));
        for (p, _) in &out[1..] {
            assert!(
                p == &out[0].0,
                "{spec}: ranks ended with different parameters"
            );
        }
        let losses = &out[0].1;
        assert_eq!(losses.len(), 60, "{spec}");
        let (first, last) = (mean(&losses[..10]), mean(&losses[50..]));
        assert!(
            last < 0.8 * first,
            "{spec}: loss did not fall: {first} -> {last}"
        );
        let again = run_world_with(4, &data, ModelKind::Mlp, config, Some((spec, mc)));
        assert!(
            again[0].0 == out[0].0,
            "{spec}: same seed gave different parameters"
        );
    }
}

/// One epoch of LeNet on real data with the trainer's statistics filled in.
#[test]
fn epoch_stats_on_real_data() {
    let Some(mut data) = real_data(DatasetKind::FashionMnist, 0) else {
        return;
    };
    data.truncate(2 * 64 * 10, 500);
    let handles: Vec<_> = Local::world(2)
        .into_iter()
        .map(|t| {
            let data = data.clone();
            thread::spawn(move || {
                let config = TrainConfig {
                    batch_size: 64,
                    seed: 1,
                    optimizer: OptimizerConfig::sgd(0.05, 0.9),
                    ..TrainConfig::default()
                };
                let model = ModelKind::LeNet.build(data.shape(), 1).unwrap();
                let sync = EngineSync::dense(t, &model.tensors()).unwrap();
                let mut tr = Trainer::new(model, sync, config, data.train.len()).unwrap();
                let mut steps = 0;
                let s = tr.run_epoch(&data, &mut |_| steps += 1).unwrap();
                (tr.sync().rank(), steps, s)
            })
        })
        .collect();
    for h in handles {
        let (rank, steps, s) = h.join().unwrap();
        assert_eq!(steps, 10);
        assert!(s.train_loss.is_finite() && s.train_loss > 0.0);
        // Sharded evaluation: every rank reports the whole split's accuracy.
        assert!(s.test_accuracy.is_some(), "rank {rank}");
        assert!(s.val_perplexity.is_none());
        assert!(s.bytes_sent > 0 && s.comm_s >= 0.0 && s.compute_s > 0.0);
        // Dense, 2 ranks: the canonical all-reduce sends the whole gradient once
        // (reduce-scatter half, all-gather half), so raw / wire is 1 (to the odd element).
        assert!(
            (s.compression_ratio - 1.0).abs() < 1e-3,
            "{}",
            s.compression_ratio
        );
        let json = serde_json::to_value(&s).unwrap();
        for key in [
            "epoch",
            "train_loss",
            "test_accuracy",
            "val_perplexity",
            "wall_s",
            "compute_s",
            "comm_s",
            "bytes_sent",
            "compression_ratio",
        ] {
            assert!(json.get(key).is_some(), "missing key {key}");
        }
    }
}

/// The char-LSTM on a slice of real Shakespeare reports a validation perplexity.
#[test]
fn lstm_on_real_shakespeare_reports_perplexity() {
    let Some(mut data) = real_data(DatasetKind::Shakespeare, 32) else {
        return;
    };
    data.truncate(16 * 8, 64);
    let vocab = data.vocab.as_ref().unwrap().len();
    assert!(vocab > 60, "vocab {vocab}");
    let config = TrainConfig {
        batch_size: 16,
        seed: 2,
        optimizer: "adam:lr=3e-3,clip=5".parse().unwrap(),
        ..TrainConfig::default()
    };
    let model = ModelKind::CharLstm.build(data.shape(), 2).unwrap();
    let sync = EngineSync::dense(Local::world(1).pop().unwrap(), &model.tensors()).unwrap();
    let mut tr = Trainer::new(model, sync, config, data.train.len()).unwrap();
    let s = tr.run_epoch(&data, &mut |_| {}).unwrap();
    let ppl = s.val_perplexity.unwrap();
    assert!(
        ppl.is_finite() && ppl > 1.0 && ppl < vocab as f64 * 1.5,
        "perplexity {ppl}"
    );
    if let Split::Text(t) = &data.test {
        assert_eq!(t.seq_len(), 32);
    }
}
