//! One LeNet training step on Fashion-MNIST split by phase (batch assembly, forward, backward
//! with the gradient flatten, optimizer, parameter write-back) and one evaluation batch of
//! 500, single process, medians over the measured steps. `lenet_step_torch.py` next to this
//! file measures the same phases in PyTorch.
//!
//! `lenet_step [threads] [steps] [model] [burn]` (defaults 1, 200, lenet; `burn` builds the
//! model with `ModelKind::build_burn`, the burn autodiff reference, for an A/B in one run).
//! Built by `cargo test --workspace --no-run`; the binary is
//! `$CARGO_TARGET_DIR/debug/examples/lenet_step`.
//!
//! It checks that the steps it times train: every loss is finite and, over 20 steps or more,
//! the mean loss of the last ten is below that of the first ten.

use std::time::Instant;

use gradwire_train::data::{default_data_dir, DatasetKind};
use gradwire_train::{ModelKind, OptimizerConfig};

/// This thread's CPU time in ms (Linux `/proc/thread-self/schedstat`; 0 elsewhere): on a
/// loaded machine the CPU time of a phase is steadier than its wall time.
fn cpu_ms() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |ns| ns / 1e6)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = args.first().map_or(Ok(1), |s| s.parse())?;
    let steps: usize = args.get(1).map_or(Ok(200), |s| s.parse())?;
    let kind: ModelKind = args.get(2).map_or("lenet", String::as_str).parse()?;
    let burn = args.get(3).is_some_and(|s| s == "burn");
    gradwire_train::init_threads(threads);
    let data = DatasetKind::FashionMnist.load(&default_data_dir(), 64)?;
    let bs = 64;
    let mut model = if burn {
        kind.build_burn(data.shape(), 42)?
    } else {
        kind.build(data.shape(), 42)?
    };
    let mut opt = OptimizerConfig::sgd(0.05, 0.9).build(model.num_params(), None)?;
    let (mut params, mut grads) = (vec![], vec![]);
    model.params(&mut params);
    let warm = 10;
    let names = ["batch", "forward", "backward", "optim", "write", "step"];
    let mut t: Vec<Vec<f64>> = vec![vec![]; names.len()];
    let mut cpu: Vec<Vec<f64>> = vec![vec![]; names.len()];
    let mut losses = Vec::with_capacity(warm + steps);
    // A fixed pseudo-random order, as a shuffled shard would give.
    let n = data.train.len();
    let idx: Vec<usize> = (0..(warm + steps) * bs).map(|i| (i * 7919) % n).collect();
    for s in 0..warm + steps {
        let (a, ca) = (Instant::now(), cpu_ms());
        let batch = data.train.batch(&idx[s * bs..(s + 1) * bs]);
        let (b, cb) = (Instant::now(), cpu_ms());
        let loss = model.forward_backward(&batch, &mut grads)?;
        let (c, cc) = (Instant::now(), cpu_ms());
        opt.step(&mut params, &grads)?;
        let (d, cd) = (Instant::now(), cpu_ms());
        model.set_params(&params);
        let (e, ce) = (Instant::now(), cpu_ms());
        losses.push(f64::from(loss));
        if s >= warm {
            let [p0, p1, p2] = model.last_pass_times().unwrap_or([b, b, c]);
            let ms = |x: Instant, y: Instant| y.duration_since(x).as_secs_f64() * 1e3;
            for (i, v) in [
                ms(a, b),
                ms(p0, p1),
                ms(p1, p2),
                ms(c, d),
                ms(d, e),
                ms(a, e),
            ]
            .into_iter()
            .enumerate()
            {
                t[i].push(v);
            }
            // CPU time: forward and backward together (one reading inside the pass).
            for (i, v) in [cb - ca, 0.0, cc - cb, cd - cc, ce - cd, ce - ca]
                .into_iter()
                .enumerate()
            {
                cpu[i].push(v);
            }
        }
    }
    let mut ev = vec![];
    let mut ev_cpu = vec![];
    let eidx: Vec<usize> = (0..500).collect();
    for _ in 0..5 {
        let batch = data.test.batch(&eidx);
        let (a, ca) = (Instant::now(), cpu_ms());
        std::hint::black_box(model.evaluate(&batch)?);
        ev.push(a.elapsed().as_secs_f64() * 1e3);
        ev_cpu.push(cpu_ms() - ca);
    }
    let path = if burn { "burn" } else { "build" };
    print!("gradwire {kind} ({path}) threads={threads} batch={bs} median wall ms:");
    for (name, v) in names.iter().zip(t) {
        print!(" {name}={:.3}", median(v));
    }
    println!(" eval500={:.3}", median(ev));
    print!("gradwire {kind} ({path}) threads={threads} batch={bs} median cpu ms: ");
    for (name, v) in names.iter().zip(cpu) {
        if *name != "forward" {
            let name = if *name == "backward" { "fwd+bwd" } else { name };
            print!(" {name}={:.3}", median(v));
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        " eval500={:.3} (mean loss {:.4})",
        median(ev_cpu),
        mean(&losses)
    );
    assert!(
        losses.iter().all(|l| l.is_finite()),
        "a step's loss is not finite"
    );
    if losses.len() >= 20 {
        let (first, last) = (mean(&losses[..10]), mean(&losses[losses.len() - 10..]));
        assert!(
            last < first,
            "{kind}: the loss does not fall: {first:.4} over the first 10 steps, {last:.4} over the last 10"
        );
    }
    Ok(())
}
