//! The split models against the unpartitioned ones ([`ModelKind::build`], an independent
//! implementation: burn's autodiff for the MLPs, the hand-written LeNet), one thread per
//! partition over `Local` or TCP loopback worlds.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use gradwire_transport::{local::Local, Transport};

use super::*;
use crate::data::{Batch, DataShape, ImageBatch};
use crate::optim::OptimizerConfig;

const SEED: u64 = 11;

fn small_images() -> DataShape {
    DataShape::Image {
        shape: [1, 6, 6],
        classes: 5,
    }
}

fn lenet_images() -> DataShape {
    DataShape::Image {
        shape: [1, 16, 16],
        classes: 10,
    }
}

fn batch(shape: DataShape, n: usize, seed: u64) -> Batch {
    let DataShape::Image { shape, classes } = shape else {
        unreachable!("image shapes only")
    };
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let per: usize = shape.iter().product();
    Batch::Images(ImageBatch {
        pixels: (0..n * per).map(|_| rng.gen_range(-1.0..1.0)).collect(),
        labels: (0..n).map(|_| rng.gen_range(0..classes) as u8).collect(),
        shape,
    })
}

fn local(k: usize) -> Vec<Box<dyn Transport>> {
    Local::world(k)
        .into_iter()
        .map(|t| Box::new(t) as Box<dyn Transport>)
        .collect()
}

/// Runs `f` on every partition of `spec`, one thread each, and returns their results in
/// partition order.
fn on_partitions<R: Send>(
    spec: &PartitionSpec,
    world: Vec<Box<dyn Transport>>,
    f: impl Fn(&mut PartitionedModel) -> R + Sync,
) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = world
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let f = &f;
                s.spawn(move || {
                    let mut m = spec.build(i, t).expect("build partition");
                    f(&mut m)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("partition thread"))
            .collect()
    })
}

/// `got` within `rel` of `want`, tensor by tensor, relative to the tensor's largest value.
fn assert_close(plan: &PartitionPlan, got: &[f32], want: &[f32], rel: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut at = 0;
    for t in &plan.tensors {
        let (g, w) = (&got[at..at + t.elements], &want[at..at + t.elements]);
        let scale = w.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
        let worst = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= rel * scale,
            "{what}: tensor {} differs by {worst} (scale {scale})",
            t.name
        );
        at += t.elements;
    }
}

/// One step on the partitions and on the whole model: the same loss on every partition
/// and the same gradient once put together.
fn same_step(spec: PartitionSpec, n: usize) {
    let b = batch(spec.shape, n, 5);
    let mut whole = spec.kind.build(spec.shape, spec.seed).unwrap();
    let mut want = Vec::new();
    let want_loss = whole.forward_backward(&b, &mut want).unwrap();
    let plan = spec.plan(n).unwrap();
    let got = on_partitions(&spec, local(spec.partitions), |m| {
        let mut g = Vec::new();
        let loss = m.forward_backward(&b, &mut g).unwrap();
        assert_eq!(g.len(), m.num_params());
        assert_eq!(m.layout().iter().sum::<usize>(), m.num_params());
        (loss, g)
    });
    for (i, (loss, _)) in got.iter().enumerate() {
        assert!(
            (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
            "{spec:?}: partition {i} loss {loss} vs {want_loss}"
        );
    }
    let grads: Vec<Vec<f32>> = got.into_iter().map(|(_, g)| g).collect();
    let grads = plan.assemble(&grads).unwrap();
    assert_close(&plan, &grads, &want, 1e-5, &format!("{spec:?} gradient"));
}

fn spec(kind: &str, shape: DataShape, split: Split, k: usize) -> PartitionSpec {
    PartitionSpec {
        kind: kind.parse().unwrap(),
        shape,
        seed: SEED,
        split,
        partitions: k,
    }
}

#[test]
fn tensor_split_gives_the_whole_mlps_loss_and_gradient() {
    for k in [2, 3] {
        // Four layers (two pairs) and three (a lone first layer, then a pair).
        for kind in ["mlp:hidden=24x3", "mlp:hidden=24x2"] {
            same_step(spec(kind, small_images(), Split::Tensor, k), 9);
        }
    }
}

#[test]
fn pipeline_gives_the_whole_models_loss_and_gradient() {
    for k in [2, 3] {
        for micro_batches in [1, 2, 4] {
            let split = Split::Pipeline { micro_batches };
            same_step(spec("mlp:hidden=24x3", small_images(), split, k), 10);
            same_step(spec("lenet", lenet_images(), split, k), 6);
        }
    }
}

#[test]
fn micro_batches_agree_with_each_other() {
    // Bit-for-bit is not promised (the sums run in another order); 1e-6 is.
    let b = batch(lenet_images(), 7, 3);
    let mut results = Vec::new();
    for micro_batches in [1, 2, 4] {
        let s = spec(
            "lenet",
            lenet_images(),
            Split::Pipeline { micro_batches },
            3,
        );
        let got = on_partitions(&s, local(3), |m| {
            let mut g = Vec::new();
            (m.forward_backward(&b, &mut g).unwrap(), g)
        });
        let plan = s.plan(7).unwrap();
        let loss = got[0].0;
        let grads: Vec<Vec<f32>> = got.into_iter().map(|(_, g)| g).collect();
        results.push((plan.clone(), loss, plan.assemble(&grads).unwrap()));
    }
    let (plan, loss1, g1) = &results[0];
    for (_, loss, g) in &results[1..] {
        assert!((loss - loss1).abs() <= 1e-6 * loss1.abs());
        assert_close(plan, g, g1, 1e-6, "micro-batches");
    }
}

/// Twenty SGD steps (momentum 0.9) with the crate's optimizer, each partition on its own
/// parameters: the same parameters as the whole model's after them.
fn same_after_sgd(spec: PartitionSpec, n: usize) {
    const STEPS: u64 = 20;
    let cfg = OptimizerConfig::sgd(0.05, 0.9);
    let mut whole = spec.kind.build(spec.shape, spec.seed).unwrap();
    let mut opt = cfg.build(whole.num_params(), None).unwrap();
    let (mut p, mut g) = (Vec::new(), Vec::new());
    for step in 0..STEPS {
        whole
            .forward_backward(&batch(spec.shape, n, step), &mut g)
            .unwrap();
        whole.params(&mut p);
        opt.step(&mut p, &g).unwrap();
        whole.set_params(&p);
    }
    whole.params(&mut p);
    let parts = on_partitions(&spec, local(spec.partitions), |m| {
        let mut opt = cfg.build(m.num_params(), None).unwrap();
        let (mut p, mut g) = (Vec::new(), Vec::new());
        for step in 0..STEPS {
            m.forward_backward(&batch(spec.shape, n, step), &mut g)
                .unwrap();
            m.params(&mut p);
            opt.step(&mut p, &g).unwrap();
            m.set_params(&p);
        }
        m.params(&mut p);
        p
    });
    let plan = spec.plan(n).unwrap();
    let got = plan.assemble(&parts).unwrap();
    assert_close(
        &plan,
        &got,
        &p,
        1e-4,
        &format!("{spec:?} after {STEPS} steps"),
    );
}

#[test]
fn partition_sgd_steps_end_at_the_whole_models_parameters() {
    for k in [2, 3] {
        same_after_sgd(spec("mlp:hidden=24x3", small_images(), Split::Tensor, k), 8);
        same_after_sgd(spec("mlp:hidden=24x2", small_images(), Split::Tensor, k), 8);
        let split = Split::Pipeline { micro_batches: 2 };
        same_after_sgd(spec("mlp:hidden=24x3", small_images(), split, k), 8);
        same_after_sgd(spec("lenet", lenet_images(), split, k), 4);
    }
}

#[test]
fn partitions_evaluate_as_the_whole_model() {
    let b = batch(small_images(), 300, 9); // More than one evaluation chunk.
    let lb = batch(lenet_images(), 20, 9);
    for (s, b) in [
        (
            spec("mlp:hidden=24x3", small_images(), Split::Tensor, 3),
            &b,
        ),
        (
            spec("mlp:hidden=24x2", small_images(), Split::Tensor, 2),
            &b,
        ),
        (
            spec(
                "mlp:hidden=24x3",
                small_images(),
                Split::Pipeline { micro_batches: 4 },
                3,
            ),
            &b,
        ),
        (
            spec(
                "lenet",
                lenet_images(),
                Split::Pipeline { micro_batches: 1 },
                2,
            ),
            &lb,
        ),
    ] {
        let want = s.kind.build(s.shape, s.seed).unwrap().evaluate(b).unwrap();
        for got in on_partitions(&s, local(s.partitions), |m| m.evaluate(b).unwrap()) {
            assert_eq!((got.n, got.correct), (want.n, want.correct), "{s:?}");
            assert!((got.loss_sum - want.loss_sum).abs() <= 1e-5 * want.loss_sum.abs());
        }
    }
}

#[test]
fn partition_plan_names_slices_and_counts_bytes() {
    let s = PartitionSpec {
        kind: "mlp:hidden=2048x3".parse().unwrap(),
        shape: DataShape::Image {
            shape: [1, 28, 28],
            classes: 10,
        },
        seed: 0,
        split: Split::Tensor,
        partitions: 2,
    };
    let plan = s.plan(64).unwrap();
    let names: Vec<&str> = plan.parts[0]
        .tensors
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "hidden.0.weight[cols 0..1024]",
            "hidden.0.bias[cols 0..1024]",
            "hidden.1.weight[rows 0..1024]",
            "hidden.1.bias",
            "hidden.2.weight[cols 0..1024]",
            "hidden.2.bias[cols 0..1024]",
            "out.weight[rows 0..1024]",
            "out.bias",
        ]
    );
    assert_eq!(
        plan.parts[1].tensors[3].name,
        "hidden.2.weight[cols 1024..2048]"
    );
    // Every parameter is held exactly once.
    let whole: usize = plan.tensors.iter().map(|t| t.elements).sum();
    assert_eq!(plan.parts.iter().map(|p| p.elements).sum::<usize>(), whole);
    // Two pairs: two forward all-reduces (64 x 2048, 64 x 10), one backward (64 x 2048).
    assert_eq!(plan.exchanges.len(), 3);
    assert_eq!(plan.exchanges[0].values, 64 * 2048);
    assert_eq!(plan.exchanges[0].bytes, 2 * (4 * 64 * 2048 + 2));
    let text = plan.to_string();
    assert!(text.contains("hidden.0.weight[cols 0..1024]"), "{text}");
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["split"], "tensor");
    assert_eq!(json["parts"][1]["tensors"][0]["cols"][0], 1024);

    // A pipeline: whole tensors, activations and gradients at each boundary.
    let p = PartitionSpec {
        kind: ModelKind::LeNet,
        split: Split::Pipeline { micro_batches: 4 },
        partitions: 3,
        ..s
    }
    .plan(64)
    .unwrap();
    assert!(p
        .parts
        .iter()
        .all(|x| x.tensors.iter().all(|t| !t.name.contains('['))));
    let fwd: Vec<&Exchange> = p
        .exchanges
        .iter()
        .filter(|e| matches!(e.pattern, Pattern::Send { .. }))
        .collect();
    assert_eq!(fwd.len(), 4, "{p}");
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["split"]["pipeline"]["micro_batches"], 4);
    // Slicing and putting together are inverse.
    let whole: Vec<f32> = (0..p.tensors.iter().map(|t| t.elements).sum::<usize>())
        .map(|i| i as f32)
        .collect();
    let parts: Vec<Vec<f32>> = (0..3).map(|i| p.slice(i, &whole).unwrap()).collect();
    assert_eq!(p.assemble(&parts).unwrap(), whole);
}

#[test]
fn partition_specs_refuse_what_cannot_be_split() {
    let err = |s: PartitionSpec| s.plan(8).expect_err("refused").to_string();
    let base = spec("mlp:hidden=24x3", small_images(), Split::Tensor, 2);
    assert!(err(PartitionSpec {
        partitions: 30,
        ..base
    })
    .contains("units"));
    let lenet = spec("lenet", lenet_images(), Split::Tensor, 2);
    assert!(err(lenet).contains("not fully connected"));
    let deep = PartitionSpec {
        split: Split::Pipeline { micro_batches: 1 },
        partitions: 6,
        ..lenet
    };
    assert!(err(deep).contains("5 layers"));
    let zero = PartitionSpec {
        split: Split::Pipeline { micro_batches: 0 },
        ..base
    };
    assert!(err(zero).contains("micro-batches"));
    // The transport must be the replica's.
    let e = base.build(1, local(3).remove(1)).err().expect("refused");
    assert!(e.to_string().contains("world of 3"), "{e}");
    for (s, split) in [
        ("tensor", Split::Tensor),
        ("pipeline", Split::Pipeline { micro_batches: 1 }),
        (
            "pipeline:micro_batches=8",
            Split::Pipeline { micro_batches: 8 },
        ),
    ] {
        assert_eq!(s.parse::<Split>().unwrap(), split);
        assert_eq!(split.to_string(), s);
    }
    assert!("pipeline:stages=2".parse::<Split>().is_err());
}

/// The partition every survivor names.
fn lost(r: Result<f32>) -> usize {
    match r {
        Err(Error::PartitionLost { partition, .. }) => partition,
        other => panic!("expected a lost partition, got {other:?}"),
    }
}

/// A world of 3 over `Local` or TCP loopback, every call under `deadline`.
fn world3(tcp: bool, deadline: Duration) -> Vec<Box<dyn Transport>> {
    let mut w = if tcp {
        gradwire_transport::tcp::loopback_world(3)
            .unwrap()
            .into_iter()
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .collect()
    } else {
        local(3)
    };
    for t in &mut w {
        t.set_timeout(deadline);
    }
    w
}

/// Steps every partition of `s` but `dead`, which drops its transport at once (`stall`
/// false) or holds it without stepping until the others are done; returns what each
/// survivor named and when.
fn survivors(
    s: &PartitionSpec,
    world: Vec<Box<dyn Transport>>,
    dead: usize,
    stall: bool,
) -> Vec<(usize, usize, Duration)> {
    let b = batch(s.shape, 8, 1);
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let wait = std::sync::Mutex::new(wait);
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        let hs: Vec<_> = world
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let (b, wait) = (&b, &wait);
                sc.spawn(move || {
                    if i == dead {
                        if stall {
                            let _ = wait.lock().unwrap().recv_timeout(Duration::from_secs(30));
                        }
                        drop(t);
                        return None;
                    }
                    let mut m = s.build(i, t).unwrap();
                    let r = m.forward_backward(b, &mut Vec::new());
                    Some((i, lost(r), t0.elapsed()))
                })
            })
            .collect();
        let mut out = Vec::new();
        for (i, h) in hs.into_iter().enumerate() {
            if i != dead {
                out.push(h.join().unwrap());
            }
        }
        release.send(()).unwrap();
        out.into_iter().flatten().collect()
    })
}

/// Survivor `i` named `dead`, over the local and the TCP transport alike.
fn check_named(tcp: bool, split: Split, i: usize, named: usize, dead: usize) {
    assert_eq!(named, dead, "{split} tcp {tcp}: partition {i}, {dead} dead");
}

#[test]
fn a_dropped_partition_is_named_by_every_other() {
    for tcp in [false, true] {
        for split in [Split::Tensor, Split::Pipeline { micro_batches: 2 }] {
            for dead in 0..3 {
                let s = spec("mlp:hidden=24x3", small_images(), split, 3);
                let world = world3(tcp, Duration::from_secs(10));
                for (i, named, after) in survivors(&s, world, dead, false) {
                    check_named(tcp, split, i, named, dead);
                    assert!(after < Duration::from_secs(5), "{after:?}");
                }
            }
        }
    }
}

#[test]
fn a_stalled_partition_is_named_within_the_deadline() {
    const DEADLINE: Duration = Duration::from_millis(300);
    for tcp in [false, true] {
        for split in [Split::Tensor, Split::Pipeline { micro_batches: 1 }] {
            for stalled in [0, 2] {
                let s = spec("mlp:hidden=24x3", small_images(), split, 3);
                let world = world3(tcp, DEADLINE);
                for (i, named, after) in survivors(&s, world, stalled, true) {
                    check_named(tcp, split, i, named, stalled);
                    assert!(after < 8 * DEADLINE, "{split}: named after {after:?}");
                }
            }
        }
    }
}

#[test]
fn a_malformed_message_is_a_typed_error_naming_its_sender() {
    let s = spec(
        "mlp:hidden=24x3",
        small_images(),
        Split::Pipeline { micro_batches: 1 },
        2,
    );
    let b = batch(s.shape, 4, 1);
    for garbage in [
        vec![7u8, 1, 2],
        vec![0u8, 1, 2],
        vec![1u8, 9, 0, 0, 0],
        vec![],
    ] {
        let mut world = local(2);
        let mut fake = world.pop().unwrap();
        let real = world.pop().unwrap();
        let r = std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                let mut m = s.build(0, real).unwrap();
                m.forward_backward(&b, &mut Vec::new())
            });
            let mut buf = Vec::new();
            fake.recv(0, &mut buf).unwrap(); // The activations.
            fake.send(0, &garbage).unwrap(); // Not a loss.
            let r = h.join().unwrap();
            drop(fake);
            r
        });
        assert_eq!(lost(r), 1, "{garbage:?}");
    }
}

#[test]
fn partition_plan_prints_every_partition_and_exchange() {
    let s = spec(
        "lenet",
        lenet_images(),
        Split::Pipeline { micro_batches: 2 },
        3,
    );
    let plan = s.plan(64).unwrap();
    let text = plan.to_string();
    for needle in [
        "model lenet split pipeline:micro_batches=2 over 3 partitions (batch 64)",
        "partition 2: 18814 parameters",
        "conv1 output             0 -> 1",
        "loss                     2 -> all",
        "conv1 output gradient    1 -> 0",
        "total 224.0 KiB per step",
    ] {
        assert!(text.contains(needle), "{needle:?} in\n{text}");
    }
}
