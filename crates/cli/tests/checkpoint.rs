//! `gradwire train --checkpoint-every` / `--resume`, end to end with real processes: every
//! rank of a 4-rank run is SIGKILLed mid-epoch after checkpoints were completed, the run is
//! resumed, and its final parameters (`--save-params`) are compared byte for byte with a
//! run never interrupted (dense, and DGC inside its warm-up); a step whose completion marker
//! is missing is never resumed from; truncated, corrupted and foreign checkpoints are
//! refused with errors naming the file or the setting.
//!
//! Every process is owned by a guard that kills it on drop (the train parent's workers run
//! with PR_SET_PDEATHSIG), so a failing test leaves nothing behind. The tests need
//! Fashion-MNIST: they skip with a message when it is absent, and fail instead under
//! `GRADWIRE_REQUIRE_DATA=1`.

mod common;

use common::{fashion_mnist, gradwire, output_of, scratch, Guard};

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn kill(pid: u32) {
    common::sigkill(pid);
}

/// The train parent's worker processes (its children with GRADWIRE_RANK set).
fn worker_pids(parent: u32) -> Vec<u32> {
    common::children_with_env(parent, "GRADWIRE_RANK")
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

/// `train` flags of a short 4-rank LeNet run: 3 epochs of 16 steps.
fn train(data: &Path, out: &Path, params: &Path, codec: &str, extra: &[&str]) -> Command {
    let mut cmd = gradwire();
    cmd.args([
        "train",
        "--model",
        "lenet",
        "--workers",
        "4",
        "--quiet",
        "--batch",
        "16",
        "--epochs",
        "3",
        "--max-steps",
        "16",
        "--eval-limit",
        "64",
        "--codec",
        codec,
    ])
    .arg(format!("--data={}", data.display()))
    .arg(format!("--out={}", out.display()))
    .arg(format!("--save-params={}", params.display()))
    .args(extra);
    cmd
}

fn succeed(cmd: &mut Command) -> String {
    let out = output_of(cmd, Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    err
}

fn complete_steps(dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix("step-")?
                .strip_suffix(".complete")?
                .parse()
                .ok()
        })
        .collect();
    steps.sort_unstable();
    steps
}

/// Starts a checkpointing run, SIGKILLs every rank (and the parent) as soon as the
/// checkpoint of step `after` is complete, and checks that the run had not finished.
fn kill_after(cmd: &mut Command, out: &Path, after: u64) {
    let mut g = Guard(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let marker = out.join(format!("checkpoints/step-{after}.complete"));
    let t0 = Instant::now();
    while !marker.exists() {
        assert!(
            g.0.try_wait().unwrap().is_none(),
            "the run ended before its checkpoint of step {after}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no checkpoint of step {after}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let workers = worker_pids(g.0.id());
    assert!(
        g.0.try_wait().unwrap().is_none(),
        "the run ended before the kill"
    );
    assert_eq!(workers.len(), 4, "4 worker processes");
    for w in workers {
        kill(w);
    }
    kill(g.0.id());
    let _ = g.0.wait();
}

/// Kills a checkpointing 4-rank run mid-epoch, resumes it (after dropping the newest
/// completion marker when `drop_newest`), and compares its final parameters with an
/// uninterrupted run's, byte for byte; also checks the metrics continue the epochs.
fn resume_matches_uninterrupted(name: &str, codec: &str, drop_newest: bool) {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch(name);
    let (reference, resumed) = (dir.join("reference.bin"), dir.join("resumed.bin"));
    succeed(&mut train(&data, &dir.join("ref"), &reference, codec, &[]));

    let out = dir.join("run");
    let every = ["--checkpoint-every", "5"];
    kill_after(
        &mut train(&data, &out, &dir.join("unused.bin"), codec, &every),
        &out,
        10,
    );
    assert!(!dir.join("unused.bin").exists(), "the killed run finished");
    let ckpts = out.join("checkpoints");
    let complete = complete_steps(&ckpts);
    assert!(complete.len() >= 2, "{complete:?}");
    let mut expect = *complete.last().unwrap();
    if drop_newest {
        // As if a rank died while writing the newest: its marker never came.
        std::fs::remove_file(ckpts.join(format!("step-{expect}.complete"))).unwrap();
        expect = complete[complete.len() - 2];
    }
    let mut args = vec!["--resume", out.to_str().unwrap()];
    args.extend(every);
    let err = succeed(&mut train(&data, &out, &resumed, codec, &args));
    assert!(
        err.contains(&format!("at step {expect} ")),
        "resumed from step {expect}: {err}"
    );
    let (a, b) = (
        std::fs::read(&reference).unwrap(),
        std::fs::read(&resumed).unwrap(),
    );
    assert_eq!(a.len(), b.len());
    assert!(
        a == b,
        "{codec}: resumed parameters differ from the uninterrupted run's"
    );
    let epochs: Vec<u64> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["epoch"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        epochs,
        vec![1, 2, 3],
        "metrics continue the epoch numbering"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dense_resume_skips_an_unmarked_step_and_matches_the_uninterrupted_run() {
    resume_matches_uninterrupted("dense", "none", true);
}

#[test]
fn dgc_resumed_inside_its_warm_up_matches_the_uninterrupted_run() {
    // Warm-up over all 3 epochs: the kill (after step 10 of 48) lands inside it.
    resume_matches_uninterrupted("dgc", "dgc:ratio=0.01,warmup_epochs=3", false);
}

/// A 1-rank MLP run leaves checkpoints; truncating, corrupting the newest or changing a
/// setting makes --resume fail with an error naming the file or the setting.
#[test]
fn damaged_and_foreign_checkpoints_are_refused_by_name() {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch("damaged");
    let out = dir.join("run");
    let run = |extra: &[&str]| {
        let mut cmd = gradwire();
        cmd.args([
            "train",
            "--model",
            "mlp",
            "--quiet",
            "--batch",
            "16",
            "--max-steps",
            "6",
            "--eval-limit",
            "32",
            "--checkpoint-every",
            "3",
        ])
        .arg(format!("--data={}", data.display()))
        .arg(format!("--out={}", out.display()))
        .args(extra);
        output_of(&mut cmd, Duration::from_secs(60))
    };
    assert!(run(&[]).status.success());
    let file = out.join("checkpoints/step-6.rank0.ckpt");
    let good = std::fs::read(&file).unwrap();
    let resume = ["--resume", out.to_str().unwrap()];
    let refused = |what: &str| {
        let o = run(&resume);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!o.status.success(), "{what}: accepted");
        err
    };

    std::fs::write(&file, &good[..good.len() / 2]).unwrap();
    let err = refused("truncated");
    assert!(
        err.contains("step-6.rank0.ckpt") && err.contains("truncated"),
        "{err}"
    );

    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 1;
    std::fs::write(&file, &bad).unwrap();
    let err = refused("corrupted");
    assert!(
        err.contains("step-6.rank0.ckpt") && err.contains("checksum"),
        "{err}"
    );

    std::fs::write(&file, &good).unwrap();
    let o = {
        let mut r: Vec<&str> = resume.to_vec();
        r.extend(["--seed", "7"]);
        run(&r)
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("another configuration") && err.contains("seed"),
        "{err}"
    );

    // Intact again: resumes.
    assert!(run(&resume).status.success());
    let _ = std::fs::remove_dir_all(&dir);
}
