//! `gradwire train --model-parallel K --sync ps-*`, end to end with real processes:
//! DistBelief's Figure 2, model replicas of K partitions each training against parameter
//! server shards, partition j of every replica a client of its own table (on its own
//! shards). R = 2 replicas of K = 2 partitions (4 worker processes plus the shards) under
//! BSP (`ps-sync`) reach the same parameters as 2 data-parallel `ps-sync` workers of the
//! whole model on the same data (BSP averages the replicas' gradients either way): the wide
//! MLP split within its layers, LeNet as a pipeline. Under Downpour (`ps-async`) the same
//! composition trains to above chance, and run.json keeps both the `ps` and the
//! `model_parallel` objects.
//!
//! Every process is owned by a guard that kills it on drop (the train parent's workers run
//! with PR_SET_PDEATHSIG; the parent stops its shards when it returns). The tests
//! need Fashion-MNIST: they skip with a message when it is absent, and fail instead under
//! `GRADWIRE_REQUIRE_DATA=1`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{fashion_mnist, gradwire, max_rel_diff, output_of, scratch};

/// How long one `gradwire train` may run (three minutes; killed and failed past it).
const LIMIT: Duration = Duration::from_secs(180);

/// A `gradwire train` on 2 workers (each a replica of `extra`'s partitions, if any) with
/// `common` settings, its output in `dir/out`; the log.
fn train(data: &Path, dir: &Path, model: &str, common: &[&str], extra: &[&str]) -> String {
    let out = output_of(
        gradwire()
            .args(["train", "--model", model, "--workers", "2", "--quiet"])
            .args(common)
            .arg(format!("--data={}", data.display()))
            .arg(format!("--out={}", dir.join("out").display()))
            .args(extra),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

fn read_params(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn run_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("out/run.json")).unwrap()).unwrap()
}

/// 12 BSP steps of 16 samples with plain SGD on the shards: 2 replicas of 2 partitions
/// (`split`) end with the parameters of 2 data-parallel workers of the whole model.
fn ps_sync_same_as_data_parallel(name: &str, model: &str, split: &[&str]) {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch(name);
    let common = [
        "--sync",
        "ps-sync",
        "--batch",
        "16",
        "--epochs",
        "1",
        "--max-steps",
        "12",
        "--eval-limit",
        "64",
        "--optimizer",
        "sgd:lr=0.05,momentum=0",
    ];
    let (dp, mp) = (dir.join("dp"), dir.join("mp"));
    let save = |d: &Path| format!("--save-params={}", d.join("params.f32").display());
    train(&data, &dp, model, &common, &[&save(&dp)]);
    let mut extra = vec!["--model-parallel", "2"];
    extra.extend_from_slice(split);
    let mp_save = save(&mp);
    extra.push(&mp_save);
    let log = train(&data, &mp, model, &common, &extra);
    assert!(log.contains("2 replica(s) x 2 partitions"), "{log}");
    assert!(log.contains("partition plan"), "{log}");
    let d = max_rel_diff(
        &read_params(&dp.join("params.f32")),
        &read_params(&mp.join("params.f32")),
    );
    assert!(d < 1e-4, "{model} {split:?}: max relative difference {d}");
    // The same loss and evaluation are reported (the whole model's, averaged over the
    // replicas through partition 0's table).
    let (a, b) = (run_json(&dp), run_json(&mp));
    let (la, lb) = (
        a["epochs"][0]["train_loss"].as_f64().unwrap(),
        b["epochs"][0]["train_loss"].as_f64().unwrap(),
    );
    assert!(
        (la - lb).abs() < 1e-4 * la.abs().max(1.0),
        "loss {la} vs {lb}"
    );
    assert_eq!(
        a["epochs"][0]["test_accuracy"], b["epochs"][0]["test_accuracy"],
        "{a}\n{b}"
    );
    assert_eq!(b["workers"], 4, "{b}");
    assert_eq!(b["model_parallel"]["partitions"], 2, "{b}");
    assert_eq!(b["ps"]["mode"], "ps-sync", "{b}");
    assert_eq!(b["ps"]["tables"], 2, "{b}");
    assert_eq!(b["ps"]["workers"].as_array().unwrap().len(), 4, "{b}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ps_sync_replicas_of_a_tensor_split_mlp_train_as_data_parallel_ps_workers() {
    ps_sync_same_as_data_parallel("tensor", "mlp:hidden=64x3", &["--mp-split", "tensor"]);
}

#[test]
fn ps_sync_replicas_of_a_pipelined_lenet_train_as_data_parallel_ps_workers() {
    ps_sync_same_as_data_parallel(
        "pipeline",
        "lenet",
        &["--mp-split", "pipeline", "--micro-batches", "2"],
    );
}

/// Downpour over 2 replicas of 2 partitions (Adagrad on the shards, each replica pushing
/// and fetching as it goes) runs to the end and learns; run.json has both objects.
#[test]
fn downpour_over_model_replicas_learns_and_records_both_settings() {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch("async");
    let log = train(
        &data,
        &dir,
        "mlp:hidden=64x3",
        &[
            "--sync",
            "ps-async",
            "--batch",
            "32",
            "--epochs",
            "2",
            "--max-steps",
            "40",
            "--eval-limit",
            "1000",
            "--optimizer",
            "adagrad:lr=0.05",
        ],
        &["--model-parallel", "2"],
    );
    assert!(log.contains("2 replica(s) x 2 partitions"), "{log}");
    let run = run_json(&dir);
    let epochs = run["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 2, "{run}");
    let acc = epochs[1]["test_accuracy"].as_f64().unwrap();
    assert!(acc > 0.4, "accuracy {acc} after 80 steps (chance is 0.1)");
    let (l0, l1) = (
        epochs[0]["train_loss"].as_f64().unwrap(),
        epochs[1]["train_loss"].as_f64().unwrap(),
    );
    assert!(l1 < l0, "loss did not fall: {l0} then {l1}");
    assert_eq!(run["ps"]["mode"], "ps-async", "{run}");
    assert_eq!(run["ps"]["tables"], 2, "{run}");
    assert_eq!(run["model_parallel"]["partitions"], 2, "{run}");
    assert!(
        run["model_parallel"]["bytes_per_step"].as_u64().unwrap() > 0,
        "{run}"
    );
    let workers = run["ps"]["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 4, "{run}");
    for w in workers {
        assert_eq!(w["steps"], 80, "{w}");
        assert!(w["bytes_pushed"].as_u64().unwrap() > 0, "{w}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn what_model_parallel_ps_cannot_take_is_refused_by_name() {
    for (args, want) in [
        (vec!["--sync", "sandblaster"], "sandblaster"),
        (
            vec![
                "--sync",
                "ps-sync",
                "--ps-servers",
                "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
            ],
            "sets of equal size",
        ),
        (
            vec![
                "--sync",
                "ps-sync",
                "--servers",
                "2",
                "--ps-servers",
                "127.0.0.1:1,127.0.0.1:2",
            ],
            "2 tables of 2",
        ),
    ] {
        let out = output_of(
            gradwire()
                .args([
                    "train",
                    "--model",
                    "mlp",
                    "--model-parallel",
                    "2",
                    "--quiet",
                ])
                .args(&args),
            LIMIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
