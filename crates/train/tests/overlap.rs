//! One-step-stale double buffering (`TrainConfig::overlap_steps = 1`, CNTK's 1-bit SGD)
//! against a naive reference built from the model and the optimizer directly: with it on,
//! the update applied after step `t+1`'s backward is the rank-averaged gradient of step `t`;
//! with it off, every step applies its own average (synchronous SGD, unchanged).

use std::thread;

use gradwire_train::data::{shard_indices, Dataset, ImageSet, Split};
use gradwire_train::{EngineSync, EvalMode, GradientSync, Model, ModelKind, TrainConfig, Trainer};
use gradwire_transport::local::Local;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const WORLD: usize = 2;

fn synthetic(train: usize, seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut set = |n: usize| {
        let px = (0..n * 784).map(|_| rng.gen::<u8>()).collect();
        let labels = (0..n).map(|_| rng.gen_range(0..10u8)).collect();
        Split::Images(ImageSet::new(px, labels, [1, 28, 28], 10).unwrap())
    };
    Dataset {
        name: "synthetic".into(),
        train: set(train),
        test: set(8),
        vocab: None,
    }
}

fn config(overlap_steps: usize) -> TrainConfig {
    TrainConfig {
        batch_size: 8,
        epochs: 1,
        seed: 5,
        optimizer: "sgd:lr=0.05,momentum=0.9".parse().unwrap(),
        eval: EvalMode::Off,
        overlap_steps,
        ..TrainConfig::default()
    }
}

/// Every rank's parameters after one epoch of the trainer over the engine.
fn trained(data: &Dataset, config: TrainConfig) -> Vec<Vec<f32>> {
    let hs: Vec<_> = Local::world(WORLD)
        .into_iter()
        .map(|t| {
            let (data, config) = (data.clone(), config.clone());
            thread::spawn(move || {
                let model = ModelKind::Mlp.build(data.shape(), config.seed).unwrap();
                let sync: Box<dyn GradientSync> =
                    Box::new(EngineSync::dense(t, &model.tensors()).unwrap());
                let mut tr = Trainer::new(model, sync, config, data.train.len()).unwrap();
                tr.run_epoch(&data, &mut |_| {}).unwrap();
                tr.params().to_vec()
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// The naive run: per step, every rank's gradient at the current parameters on its shard's
/// batch, averaged in rank order; applied at once (`stale = false`) or one step late.
fn reference(data: &Dataset, config: &TrainConfig, stale: bool) -> Vec<f32> {
    let n = data.train.len();
    let bs = config.batch_size;
    let steps = n / WORLD / bs;
    let mut models: Vec<Box<dyn Model>> = (0..WORLD)
        .map(|_| ModelKind::Mlp.build(data.shape(), config.seed).unwrap())
        .collect();
    let mut params = Vec::new();
    models[0].params(&mut params);
    let mut opt = config
        .optimizer
        .build(params.len(), Some(steps as u64))
        .unwrap();
    let shards: Vec<Vec<usize>> = (0..WORLD)
        .map(|r| shard_indices(n, WORLD, r, config.seed, 0))
        .collect();
    let mut previous: Option<Vec<f32>> = None;
    for step in 0..steps {
        let mut grads: Vec<Vec<f32>> = Vec::new();
        for (r, m) in models.iter_mut().enumerate() {
            m.set_params(&params);
            let batch = data.train.batch(&shards[r][step * bs..(step + 1) * bs]);
            let mut g = Vec::new();
            m.forward_backward(&batch, &mut g).unwrap();
            grads.push(g);
        }
        let mean: Vec<f32> = (0..params.len())
            .map(|i| {
                let mut s = grads[0][i];
                for g in &grads[1..] {
                    s += g[i];
                }
                s / WORLD as f32
            })
            .collect();
        if stale {
            if let Some(p) = previous.replace(mean) {
                opt.step(&mut params, &p).unwrap();
            }
        } else {
            opt.step(&mut params, &mean).unwrap();
        }
    }
    if let Some(p) = previous {
        opt.step(&mut params, &p).unwrap();
    }
    params
}

#[test]
fn overlap_applies_each_average_one_step_late_and_off_is_synchronous() {
    let data = synthetic(WORLD * 8 * 5, 17);
    let want_stale = reference(&data, &config(1), true);
    let want_sync = reference(&data, &config(0), false);
    assert_ne!(
        want_stale, want_sync,
        "the data must make a one-step delay visible"
    );
    for (r, p) in trained(&data, config(1)).iter().enumerate() {
        assert!(
            p == &want_stale,
            "overlap on, rank {r}: not the one-step-stale reference"
        );
    }
    for (r, p) in trained(&data, config(0)).iter().enumerate() {
        assert!(
            p == &want_sync,
            "overlap off, rank {r}: not synchronous SGD"
        );
    }
}

#[test]
fn overlap_beyond_one_step_is_refused() {
    let data = synthetic(16, 1);
    let t = Local::world(1).pop().unwrap();
    let model = ModelKind::Mlp.build(data.shape(), 1).unwrap();
    let sync = EngineSync::dense(t, &model.tensors()).unwrap();
    let err = Trainer::new(model, sync, config(2), 16)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("overlap_steps 2"), "{err}");
}

/// A sync with no capabilities (one rank, nothing to average): `overlap_steps = 1` and a
/// checkpoint are refused with the typed [`Error::Unsupported`], synchronous steps run.
#[test]
fn a_sync_without_the_capability_is_refused_by_type() {
    use gradwire_train::sync::SyncStats;
    use gradwire_train::Error;

    struct Alone;
    impl GradientSync for Alone {
        fn rank(&self) -> usize {
            0
        }
        fn world_size(&self) -> usize {
            1
        }
        fn broadcast_params(&mut self, _: &mut [f32]) -> gradwire_train::Result<()> {
            Ok(())
        }
        fn sync(&mut self, _: &mut [f32]) -> gradwire_train::Result<SyncStats> {
            Ok(SyncStats::default())
        }
        fn average_metrics(&mut self, _: &mut [f64]) -> gradwire_train::Result<()> {
            Ok(())
        }
    }

    let data = synthetic(32, 3);
    let build = |overlap| {
        let config = config(overlap);
        let model = ModelKind::Mlp.build(data.shape(), config.seed).unwrap();
        Trainer::new(model, Alone, config, data.train.len()).unwrap()
    };
    let err = build(1).run_epoch(&data, &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("overlap steps"), "{err}");

    let mut tr = build(0);
    tr.run_epoch(&data, &mut |_| {}).unwrap();
    let err = tr.checkpoint(String::new(), String::new()).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("checkpointed"), "{err}");
}
