//! `gradwire bench allreduce` and `bench engine`, end to end: the JSON's shape, and each
//! `--transport` (shm ranks as processes, local as threads) named in it.

mod common;

use std::time::Duration;

use common::{gradwire, output_within, run_json};

#[test]
fn bench_allreduce_writes_the_json_shape() {
    let dir = std::env::temp_dir().join(format!("gradwire-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("b.json");
    let mut cmd = gradwire();
    cmd.args([
        "bench",
        "allreduce",
        "--np",
        "3",
        "--sizes",
        "4KiB,64KiB",
        "--iters",
        "3",
        "--json",
    ])
    .arg(&json);
    let v = run_json(cmd, Duration::from_secs(60), &json);
    assert_eq!(v["op"], "allreduce");
    assert_eq!(v["transport"], "tcp");
    assert_eq!(v["np"], 3);
    assert_eq!(v["algo"], "auto");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["bytes"], 4096);
    assert!(results[1]["median_us"].as_f64().unwrap() > 0.0);
    assert!(results[1]["busbw_gbps"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--transport` on `bench allreduce` and `bench engine`: shm ranks as processes, local as
/// threads; the JSON names the transport that ran.
#[test]
fn bench_takes_each_transport() {
    let dir = std::env::temp_dir().join(format!("gradwire-bench-tr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (bench, transport, extra) in [
        (
            "allreduce",
            "shm",
            &["--sizes", "4KiB,1MiB", "--iters", "3"][..],
        ),
        (
            "allreduce",
            "local",
            &["--sizes", "4KiB", "--iters", "3"][..],
        ),
        ("engine", "shm", &["--cases", "lenet", "--reps", "2"][..]),
    ] {
        let json = dir.join(format!("{bench}-{transport}.json"));
        let mut cmd = gradwire();
        cmd.args(["bench", bench, "--np", "3", "--transport", transport])
            .args(extra)
            .arg("--json")
            .arg(&json);
        let out = output_within(cmd, Duration::from_secs(120));
        assert!(
            out.status.success(),
            "bench {bench} --transport {transport}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["transport"], transport, "{v}");
        assert_eq!(v["np"], 3, "{v}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
