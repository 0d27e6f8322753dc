//! Sandblaster L-BFGS on synthetic logistic regression: vector ops on the shards, small
//! work units, backup copies; checked against a locally computed loss.

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
