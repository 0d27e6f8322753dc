//! Ranks declared on several hosts (`GRADWIRE_HOSTS`), end to end: `check`, `bench
//! allreduce` and the engine of `bench engine` go hierarchical (shared memory within a
//! declared host, TCP between the leaders) and still reduce exactly.

mod common;

use std::time::Duration;

use common::{gradwire, output_within, run_json};

/// Ranks declared on different hosts (`GRADWIRE_HOSTS`): `check` and `bench allreduce` go
/// hierarchical (shared memory within a declared host, TCP between the leaders) and still
/// reduce exactly.
#[test]
fn declared_hosts_make_the_all_reduce_hierarchical() {
    for (hosts, n, want) in [
        ("a,a,b,b", "4", "(tcp+shm, 2 hosts (2+2 ranks))"),
        ("x,y,x", "3", "(tcp+shm, 2 hosts (2+1 ranks))"),
    ] {
        let mut cmd = gradwire();
        cmd.env("GRADWIRE_HOSTS", hosts)
            .args(["launch", "-n", n, "--", env!("CARGO_BIN_EXE_gradwire")])
            .args(["check", "--elements", "100003", "--iters", "2"]);
        let out = output_within(cmd, Duration::from_secs(60));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let n: usize = n.parse().unwrap();
        for r in 0..n {
            let line = format!("[{r}] rank {r}/{n} {want}: iteration 1: all-reduce of 100003");
            assert!(stdout.contains(&line), "{line:?} not in:\n{stdout}");
        }
    }
    let dir = std::env::temp_dir().join(format!("gradwire-bench-hier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("hier.json");
    let mut cmd = gradwire();
    cmd.env("GRADWIRE_HOSTS", "a,a,b,b")
        .args([
            "bench",
            "allreduce",
            "--np",
            "4",
            "--sizes",
            "4KiB,1MiB",
            "--iters",
            "3",
        ])
        .arg("--json")
        .arg(&json);
    let v = run_json(cmd, Duration::from_secs(120), &json);
    assert_eq!(v["hierarchy"], "2 hosts (2+2 ranks)", "{v}");
    assert_eq!(v["transport"], "tcp");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ranks declared on different hosts: the engine of `bench engine` (and `train`) picks the
/// hierarchical dense path by itself (shared memory within a declared host); without the
/// declaration the same job stays flat. (That its results equal the flat reference is the
/// engine's `tests::hosts`.)
#[test]
fn declared_hosts_make_the_engine_hierarchical() {
    let dir = std::env::temp_dir().join(format!("gradwire-engine-hier-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (hosts, want) in [(Some("a,a,b,b"), Some("2 hosts (2+2 ranks)")), (None, None)] {
        let json = dir.join("engine.json");
        let mut cmd = gradwire();
        match hosts {
            Some(h) => cmd.env("GRADWIRE_HOSTS", h),
            None => cmd.env_remove("GRADWIRE_HOSTS"),
        };
        cmd.env_remove("GRADWIRE_HOST").args([
            "bench",
            "engine",
            "--np",
            "4",
            "--transport",
            "tcp",
            "--cases",
            "lenet",
            "--reps",
            "2",
            "--json",
        ]);
        cmd.arg(&json);
        let v = run_json(cmd, Duration::from_secs(120), &json);
        assert_eq!(v["results"][0]["case"], "lenet", "{v}");
        assert_eq!(
            v["results"][0].get("hierarchy").and_then(|h| h.as_str()),
            want,
            "{v}"
        );
        assert!(v["results"][0]["engine_ms"].as_f64().unwrap() > 0.0, "{v}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
