//! Measures step times and runs a short real training run.
//!
//! `cargo run -p gradwire-train --example measure -- steptime [threads]`
//! `cargo run -p gradwire-train --example measure -- run MODEL EPOCHS [STEPS] [OPTIMIZER]`
//!
//! Both check that the model trains: every step's loss is finite and, in `run` over 10 steps
//! or more, the mean loss of the last fifth of the steps is below that of the first fifth.

use std::time::Instant;

use gradwire_train::data::{default_data_dir, DatasetKind};
use gradwire_train::{EngineSync, ModelKind, OptimizerConfig, TrainConfig, Trainer};
use gradwire_transport::local::Local;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        _ => steptime(args.get(1).map_or(Ok(1), |s| s.parse())?),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn steptime(threads: usize) -> Result<(), Box<dyn std::error::Error>> {
    gradwire_train::init_threads(threads);
    println!("threads: {}", gradwire_train::num_threads());
    let fm = DatasetKind::FashionMnist.load(&default_data_dir(), 64)?;
    let sh = DatasetKind::Shakespeare.load(&default_data_dir(), 64)?;
    println!(
        "fashion-mnist: {} train; 4 workers x batch 64 -> {} steps/epoch",
        fm.train.len(),
        fm.train.len() / 4 / 64
    );
    for kind in ModelKind::ALL {
        let data = if kind.is_language_model() { &sh } else { &fm };
        let bs = if kind.is_language_model() { 32 } else { 64 };
        let mut model = kind.build(data.shape(), 1)?;
        let mut opt = OptimizerConfig::sgd(0.01, 0.9).build(model.num_params(), None)?;
        let (mut params, mut grads) = (vec![], vec![]);
        model.params(&mut params);
        let (warm, n) = if kind.is_language_model() {
            (2, 10)
        } else {
            (5, 40)
        };
        let mut fb = vec![];
        let mut total = vec![];
        let mut losses = vec![];
        for s in 0..warm + n {
            let idx: Vec<usize> = (s * bs..(s + 1) * bs).collect();
            let batch = data.train.batch(&idx);
            let t0 = Instant::now();
            losses.push(model.forward_backward(&batch, &mut grads)?);
            let t1 = Instant::now();
            opt.step(&mut params, &grads)?;
            model.set_params(&params);
            if s >= warm {
                fb.push(t1.duration_since(t0).as_secs_f64() * 1e3);
                total.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        println!(
            "{kind:>6}: {:>8} params, batch {bs}: forward+backward {:.2} ms, full step {:.2} ms (median of {n})",
            model.num_params(),
            median(fb),
            median(total)
        );
        assert!(
            losses.iter().all(|l| l.is_finite()),
            "{kind}: a step's loss is not finite: {losses:?}"
        );
    }
    Ok(())
}

fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    gradwire_train::init_threads(1);
    let kind: ModelKind = args.first().map_or("lenet", String::as_str).parse()?;
    let epochs: usize = args.get(1).map_or(Ok(1), |s| s.parse())?;
    let max_steps: Option<usize> = args.get(2).map(|s| s.parse()).transpose()?;
    let opt: OptimizerConfig = args
        .get(3)
        .map_or("sgd:lr=0.05,momentum=0.9", String::as_str)
        .parse()?;
    let dk = if kind.is_language_model() {
        DatasetKind::Shakespeare
    } else {
        DatasetKind::FashionMnist
    };
    let data = dk.load(&default_data_dir(), 64)?;
    let config = TrainConfig {
        batch_size: if kind.is_language_model() { 32 } else { 64 },
        epochs,
        seed: 1,
        optimizer: opt,
        max_steps_per_epoch: max_steps,
        eval_limit: if kind.is_language_model() {
            Some(2000)
        } else {
            None
        },
        ..TrainConfig::default()
    };
    let model = kind.build(data.shape(), 1)?;
    let sync = EngineSync::dense(Local::world(1).pop().expect("one rank"), &model.tensors())?;
    let mut tr = Trainer::new(model, sync, config, data.train.len())?;
    println!(
        "{kind} on {}: {} steps/epoch",
        data.name,
        tr.steps_per_epoch(data.train.len())
    );
    let mut losses = Vec::new();
    tr.fit(
        &data,
        &mut |s| {
            losses.push(f64::from(s.loss));
            if s.step % 200 == 0 {
                println!(
                    "epoch {} step {}/{} loss {:.4} lr {:.4}",
                    s.epoch, s.step, s.steps, s.loss, s.lr
                );
            }
        },
        &mut |e| println!("{}", serde_json::to_string(e).expect("serializable")),
    )?;
    assert!(
        losses.iter().all(|l| l.is_finite()),
        "a step's loss is not finite"
    );
    if losses.len() >= 10 {
        let k = losses.len() / 5;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (first, last) = (mean(&losses[..k]), mean(&losses[losses.len() - k..]));
        assert!(
            last < first,
            "{kind}: the loss does not fall: {first:.4} over the first {k} steps, {last:.4} over the last {k}"
        );
    }
    Ok(())
}
