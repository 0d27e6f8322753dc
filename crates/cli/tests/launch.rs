//! `gradwire launch`, end to end: four local ranks of `gradwire check` all-reduce over TCP,
//! and one failing rank stops the others with its exit code. Every child is owned by a guard
//! that kills it on drop, so a failing test leaves no process behind.

mod common;

use std::time::{Duration, Instant};

use common::{gradwire, output_within};

#[test]
fn launch_four_ranks_allreduce_over_tcp() {
    let mut cmd = gradwire();
    cmd.args([
        "launch",
        "-n",
        "4",
        "--",
        env!("CARGO_BIN_EXE_gradwire"),
        "check",
        "--elements",
        "100003",
        "--iters",
        "2",
    ]);
    let out = output_within(cmd, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "launch failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for r in 0..4 {
        assert!(
            stdout.contains(&format!(
                "[{r}] rank {r}/4 (tcp): iteration 1: all-reduce of 100003 elements ok"
            )),
            "{stdout}"
        );
    }
}

#[test]
fn launch_stops_all_and_returns_the_failing_code() {
    let mut cmd = gradwire();
    cmd.args([
        "launch",
        "-n",
        "3",
        "--",
        "sh",
        "-c",
        "if [ \"$GRADWIRE_RANK\" = 1 ]; then echo bye; exit 7; fi; sleep 60",
    ]);
    let start = Instant::now();
    let out = output_within(cmd, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(7));
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(String::from_utf8_lossy(&out.stdout).contains("[1] bye"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rank 1 failed"));
}
