//! Sandblaster L-BFGS on synthetic logistic regression and on a small tanh MLP (XOR data):
//! vector ops on the shards, small work units, backup copies; checked against locally
//! computed losses and, for the MLP, a finite-difference gradient.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{addrs, shards};
use gradwire_ps::sandblaster::{run, LogisticRegression, Objective, SandblasterConfig};

#[test]
fn lbfgs_decreases_the_loss_and_the_shards_hold_what_the_coordinator_computed() {
    let servers = shards(2, 5, |_| {});
    let obj = Arc::new(LogisticRegression::synthetic(2000, 20, 50, 1e-3, 7));
    let w0 = vec![0.0f32; 20];
    for backups in [false, true] {
        let cfg = SandblasterConfig {
            iterations: 8,
            backups,
            chunk_elems: 8, // 3 chunks over 2 shards
            unit_delay: vec![
                Duration::from_micros(300),
                Duration::ZERO,
                Duration::ZERO,
                Duration::ZERO,
            ],
            key: gradwire_ps::Key(if backups { 2 } else { 1 }),
            ..SandblasterConfig::default()
        };
        let r = run(addrs(&servers), obj.clone(), &w0, 4, &cfg).unwrap();
        assert_eq!(r.losses.len(), 9);
        assert!(
            r.losses.windows(2).all(|w| w[1] <= w[0] + 1e-9),
            "{:?}",
            r.losses
        );
        assert!(r.losses[8] < 0.6 * r.losses[0], "{:?}", r.losses);
        // The loss the coordinator reports equals the local loss at the shards' parameters.
        let local = obj.loss(&r.params);
        assert!(
            (local - r.losses[8]).abs() < 1e-4 * local.max(1.0),
            "{local} vs {}",
            r.losses[8]
        );
        assert!(r.units_run >= r.passes * obj.units());
        if !backups {
            assert_eq!(r.backups_issued, 0);
        }
    }
}

/// The MLP's analytic gradient against central finite differences of its own loss, per
/// parameter (an independent check of the backward pass).
#[test]
fn mlp_gradient_matches_finite_differences() {
    let obj = gradwire_ps::sandblaster::Mlp::synthetic_xor(64, 3, 4, 16, 0.0, 3);
    let w = obj.init(5);
    let mut g = vec![0.0f64; obj.dim()];
    let mut sum = 0.0;
    for u in 0..obj.units() {
        sum += obj.unit_loss_grad(u, &w, &mut g);
    }
    let n = obj.examples() as f64;
    assert!((sum / n - obj.loss(&w)).abs() < 1e-9);
    let h = 1e-3f32;
    for k in 0..obj.dim() {
        let (mut up, mut down) = (w.clone(), w.clone());
        up[k] += h;
        down[k] -= h;
        let numeric = (obj.loss(&up) - obj.loss(&down)) / (up[k] as f64 - down[k] as f64);
        let analytic = g[k] / n;
        assert!(
            (numeric - analytic).abs() < 1e-3 * analytic.abs().max(1e-2),
            "parameter {k}: numeric {numeric}, analytic {analytic}"
        );
    }
}

/// Sandblaster L-BFGS trains a non-convex model through the shards: the XOR data no
/// linear model can fit (at best about 50-70% right) is learnt by a small tanh network.
#[test]
fn lbfgs_trains_an_mlp_on_data_no_linear_model_fits() {
    let servers = shards(2, 5, |_| {});
    let obj = Arc::new(gradwire_ps::sandblaster::Mlp::synthetic_xor(
        1500, 4, 8, 50, 1e-4, 11,
    ));
    let w0 = obj.init(13);
    let before = obj.accuracy(&w0);
    let cfg = SandblasterConfig {
        iterations: 60,
        chunk_elems: 16,
        key: gradwire_ps::Key(3),
        ..SandblasterConfig::default()
    };
    let r = run(addrs(&servers), obj.clone(), &w0, 3, &cfg).unwrap();
    assert!(
        r.losses.windows(2).all(|w| w[1] <= w[0] + 1e-9),
        "{:?}",
        r.losses
    );
    let last = *r.losses.last().unwrap();
    assert!(last < 0.4 * r.losses[0], "{:?}", r.losses);
    let after = obj.accuracy(&r.params);
    eprintln!(
        "MLP: accuracy {before:.3} -> {after:.3}, loss {:.4} -> {last:.4}, {} passes",
        r.losses[0], r.passes
    );
    assert!(
        after > 0.93,
        "accuracy {before:.3} -> {after:.3}, losses {:?}",
        r.losses
    );
    let local = obj.loss(&r.params);
    assert!(
        (local - last).abs() < 1e-4 * local.max(1.0),
        "{local} vs {last}"
    );
}
