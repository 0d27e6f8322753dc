//! `gradwire train --model-parallel K`, end to end with real processes: R = 2 replicas of
//! K = 2 partitions (4 rank processes over TCP) train to the same parameters as 2
//! data-parallel ranks of the whole model on the same data (the wide MLP split within its
//! layers, LeNet split as a pipeline with micro-batches), the whole model's parameters
//! written by `--save-params` in the whole model's order; settings model parallelism cannot
//! take are refused by name before anything starts.
//!
//! Every process is owned by a guard that kills it on drop (the train parent's workers run
//! with PR_SET_PDEATHSIG), so a failing test leaves nothing behind. The tests need
//! Fashion-MNIST: they skip with a message when it is absent, and fail instead under
//! `GRADWIRE_REQUIRE_DATA=1`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{fashion_mnist, gradwire, max_rel_diff, output_of, scratch};

/// How long one `gradwire train` may run (two minutes; killed and failed past it).
const LIMIT: Duration = Duration::from_secs(120);

/// A short run of `model` on 2 data-parallel workers (each a replica of `extra`'s
/// partitions, if any): 12 steps of 16 samples, SGD with momentum, its parameters saved.
fn train(data: &Path, dir: &Path, model: &str, extra: &[&str]) -> (Vec<f32>, String) {
    let params = dir.join("params.f32");
    let out = output_of(
        gradwire()
            .args([
                "train",
                "--model",
                model,
                "--workers",
                "2",
                "--quiet",
                "--batch",
                "16",
                "--epochs",
                "1",
                "--max-steps",
                "12",
                "--eval-limit",
                "64",
                "--optimizer",
                "sgd:lr=0.05,momentum=0.9",
            ])
            .arg(format!("--data={}", data.display()))
            .arg(format!("--out={}", dir.join("out").display()))
            .arg(format!("--save-params={}", params.display()))
            .args(extra),
        LIMIT,
    );
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let bytes = std::fs::read(&params).unwrap();
    let flat = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (flat, err)
}

fn same_as_data_parallel(name: &str, model: &str, split: &[&str]) {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch(name);
    let (whole, _) = train(&data, &dir.join("dp"), model, &[]);
    let mut extra = vec!["--model-parallel", "2"];
    extra.extend_from_slice(split);
    let (parts, log) = train(&data, &dir.join("mp"), model, &extra);
    assert!(log.contains("2 replica(s) x 2 partitions"), "{log}");
    assert!(log.contains("partition plan"), "{log}");
    let d = max_rel_diff(&whole, &parts);
    assert!(d < 1e-4, "{model} {split:?}: max relative difference {d}");
    // The run record keeps the plan.
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("mp/out/run.json")).unwrap())
            .unwrap();
    assert_eq!(run["workers"], 4, "{run}");
    assert_eq!(run["model_parallel"]["partitions"], 2, "{run}");
    assert!(
        run["model_parallel"]["bytes_per_step"].as_u64().unwrap() > 0,
        "{run}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_replicas_of_a_tensor_split_mlp_train_as_two_data_parallel_ranks() {
    same_as_data_parallel("tensor", "mlp:hidden=64x3", &["--mp-split", "tensor"]);
}

#[test]
fn two_replicas_of_a_pipelined_lenet_train_as_two_data_parallel_ranks() {
    same_as_data_parallel(
        "pipeline",
        "lenet",
        &["--mp-split", "pipeline", "--micro-batches", "4"],
    );
}

#[test]
fn what_model_parallelism_cannot_take_is_refused_by_name() {
    for (args, want) in [
        (
            vec!["--model", "lstm", "--model-parallel", "2"],
            "splits image models",
        ),
        (
            vec!["--model-parallel", "2", "--sync", "sandblaster"],
            "sandblaster",
        ),
        (
            vec!["--model-parallel", "2", "--checkpoint-every", "5"],
            "--checkpoint-every",
        ),
        (
            vec!["--model", "mlp", "--mp-split", "tensor"],
            "go with --model-parallel",
        ),
        (
            vec![
                "--model",
                "mlp",
                "--model-parallel",
                "2",
                "--mp-split",
                "tensor",
                "--micro-batches",
                "2",
            ],
            "--micro-batches goes with --mp-split pipeline",
        ),
    ] {
        let out = output_of(gradwire().arg("train").args(&args).arg("--quiet"), LIMIT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
