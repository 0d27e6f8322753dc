//! The shared-memory transport, end to end: `gradwire check --transport shm` under
//! `gradwire launch` and its refusals (ranks on several hosts, `mpi` outside an MPI
//! launcher), and `gradwire train --transport shm` worker processes.

mod common;

use std::time::{Duration, Instant};

use common::{free_port, gradwire, output_within, rank_env};

/// `gradwire check --transport shm` under `gradwire launch`; refused at once when the
/// launcher says the ranks are on several hosts; `mpi` refused with what to do instead.
#[test]
fn check_over_shm_and_the_refusals() {
    let mut cmd = gradwire();
    cmd.args(["launch", "-n", "2", "--", env!("CARGO_BIN_EXE_gradwire")])
        .args([
            "check",
            "--transport",
            "shm",
            "--elements",
            "1000",
            "--iters",
            "2",
        ]);
    let out = output_within(cmd, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..2 {
        let want = format!("[{r}] rank {r}/2 (shm): iteration 1: all-reduce of 1000 elements ok");
        assert!(stdout.contains(&want), "{stdout}");
    }

    // One rank of two on this host: shm cannot work, and says so without waiting.
    let mut cmd = gradwire();
    rank_env(&mut cmd, 0, 2, free_port(), "t");
    cmd.env("GRADWIRE_LOCAL_SIZE", "1")
        .args(["check", "--transport", "shm"]);
    let start = Instant::now();
    let out = output_within(cmd, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("every rank on one host") && stderr.contains("1 of the 2"),
        "{stderr}"
    );
    assert!(start.elapsed() < Duration::from_secs(10));

    // mpi outside an MPI launcher (and, without the feature, outside an MPI build).
    let mut cmd = gradwire();
    cmd.args(["check", "--transport", "mpi"]);
    let out = output_within(cmd, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let want = if cfg!(feature = "mpi") {
        "needs an MPI launcher"
    } else {
        "--features mpi"
    };
    assert!(stderr.contains(want), "{stderr}");
    let mut cmd = gradwire();
    cmd.args(["bench", "allreduce", "--transport", "mpi"]);
    let out = output_within(cmd, Duration::from_secs(60));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(want));
}

/// `gradwire train --transport shm`: the worker processes train over shared memory (skips
/// loudly without Fashion-MNIST, fails under GRADWIRE_REQUIRE_DATA=1).
#[test]
fn train_over_shm_workers() {
    let data = std::env::var_os("GRADWIRE_DATA").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data"),
        Into::into,
    );
    if gradwire_train::data::DatasetKind::FashionMnist
        .load(&data, 64)
        .is_err()
    {
        assert!(
            std::env::var("GRADWIRE_REQUIRE_DATA").map_or(true, |v| v != "1"),
            "Fashion-MNIST required (GRADWIRE_REQUIRE_DATA=1) but not in {}",
            data.display()
        );
        eprintln!("SKIPPED: Fashion-MNIST not available; run scripts/fetch-data.sh");
        return;
    }
    let out_dir = std::env::temp_dir().join(format!("gradwire-train-shm-{}", std::process::id()));
    let mut cmd = gradwire();
    cmd.env("GRADWIRE_DATA", &data)
        .env("RUST_LOG", "gradwire_run::join=info")
        .env("NO_COLOR", "1")
        .args([
            "train",
            "--model",
            "mlp",
            "--workers",
            "2",
            "--transport",
            "shm",
        ])
        .args([
            "--max-steps",
            "3",
            "--eval-limit",
            "100",
            "--quiet",
            "--out",
        ])
        .arg(&out_dir);
    let out = output_within(cmd, Duration::from_secs(240));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("transport=shm").count(), 2, "{stderr}");
    assert!(out_dir.join("run.json").is_file());
    let _ = std::fs::remove_dir_all(&out_dir);
}
