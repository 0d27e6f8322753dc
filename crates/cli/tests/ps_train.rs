//! `gradwire train` against parameter-server shards, end to end with real processes on
//! 127.0.0.1: PS synchronous SGD against all-reduce SGD, a worker SIGKILLed under
//! `ps-async`, compressed pushes (lossless against dense, QSGD and 2-bit learning with fewer
//! bytes), Sandblaster L-BFGS on the MLP, and the flag combinations refused at the edge.
//!
//! Every process is owned by a guard that kills it on drop (the train parent kills its
//! shards and workers when it dies: they run with PR_SET_PDEATHSIG), so a failing test
//! leaves nothing behind. Tests that need Fashion-MNIST skip with a message when it is
//! absent, and fail instead under `GRADWIRE_REQUIRE_DATA=1` (as CI sets).

mod common;

use common::{fashion_mnist, gradwire, output_within, scratch, Guard};

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn kill(pid: u32) {
    common::sigkill(pid);
}

fn read_f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{path:?}: {e}"))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `train` flags of a short MLP run.
fn short_run(data: &Path, out: &Path) -> Vec<String> {
    [
        "train",
        "--model",
        "mlp",
        "--quiet",
        "--eval-limit",
        "100",
        "--batch",
        "16",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        format!("--data={}", data.display()),
        format!("--out={}", out.display()),
    ])
    .collect()
}

/// PS synchronous SGD (4 workers, 2 shards, server-side momentum SGD mirroring the
/// optimizer) ends 4 steps at the parameters all-reduce SGD reaches from the same seed.
/// Tolerance: 1e-6 absolute per parameter (the two sum the 4 gradients in different orders;
/// measured 1.5e-8 after 5 steps; with 2 workers they are bit-identical).
#[test]
fn ps_sync_sgd_reaches_the_parameters_of_all_reduce_sgd() {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch("equal");
    let mut runs = Vec::new();
    for (name, extra) in [
        ("ps", &["--sync", "ps-sync", "--servers", "2"][..]),
        ("allreduce", &["--sync", "dense"][..]),
    ] {
        let params = dir.join(format!("{name}.f32"));
        let mut cmd = gradwire();
        cmd.args(short_run(&data, &dir.join(name)))
            .args(["--workers", "4", "--max-steps", "4"])
            .args(["--optimizer", "sgd:lr=0.05,momentum=0.9"])
            .args(extra)
            .arg(format!("--save-params={}", params.display()));
        let out = output_within(cmd, Duration::from_secs(120));
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        runs.push(read_f32s(&params));
    }
    let (ps, ar) = (&runs[0], &runs[1]);
    assert_eq!(ps.len(), ar.len());
    assert!(ps.len() > 100_000, "the MLP has {} parameters", ps.len());
    let worst = ps
        .iter()
        .zip(ar)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-6, "largest difference {worst}");
    let metrics = std::fs::read_to_string(dir.join("ps/metrics.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert_eq!(line["mode"], "ps-sync");
    assert_eq!(line["servers"], 2);
    assert!(line["bytes_pulled"].as_u64().unwrap() >= 4 * 4 * ps.len() as u64);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pid of the train parent's worker `rank` (its child with GRADWIRE_RANK=rank).
fn worker_pid(parent: u32, rank: usize) -> Option<u32> {
    common::children_with_env(parent, "GRADWIRE_RANK")
        .into_iter()
        .find(|(_, r)| *r == rank.to_string())
        .map(|(pid, _)| pid)
}

/// A `train` run in the background: stdout's lines as they come, stderr once it ends; killed
/// (with its workers) when dropped.
struct Streaming {
    guard: Guard,
    lines: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

impl Streaming {
    fn spawn(mut cmd: Command) -> Streaming {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (etx, stderr_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
            let _ = etx.send(s);
        });
        Streaming {
            guard: Guard(child),
            lines,
            stderr: stderr_rx,
        }
    }

    /// Waits (at most 120 s) for rank 0's first epoch line, SIGKILLs worker `rank`, then
    /// waits at most `limit` for the run to end; returns the first line, the exit status and
    /// stderr.
    fn kill_after_first_epoch(
        &mut self,
        rank: usize,
        limit: Duration,
    ) -> (String, std::process::ExitStatus, String) {
        let first = self
            .lines
            .recv_timeout(Duration::from_secs(120))
            .expect("rank 0 reported its first epoch");
        let parent = self.guard.0.id();
        let victim = worker_pid(parent, rank)
            .unwrap_or_else(|| panic!("worker {rank} is still running after epoch 1"));
        kill(victim);
        let killed = Instant::now();
        let status = loop {
            if let Some(s) = self.guard.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                killed.elapsed() < limit,
                "training still running {limit:?} after worker {rank} was killed"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let err = self.stderr.recv_timeout(Duration::from_secs(10)).unwrap();
        (first, status, err)
    }
}

/// Downpour with 4 workers and 2 shards: worker 3 is SIGKILLed after rank 0's first epoch;
/// the others train on to the end, rank 0 reports every epoch, the parent names the lost
/// worker, and it all ends within a bound.
#[test]
fn ps_async_trains_on_when_a_worker_is_killed() {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch("kill");
    let out_dir = dir.join("run");
    let mut cmd = gradwire();
    cmd.args(short_run(&data, &out_dir))
        .args(["--workers", "4", "--servers", "2", "--sync", "ps-async"])
        .args(["--epochs", "3", "--max-steps", "40"])
        // DistBelief's Downpour with Adagrad at the shards (momentum SGD applied per push
        // by 4 stale workers can diverge).
        .args(["--optimizer", "adagrad:lr=0.01"]);
    let mut run = Streaming::spawn(cmd);
    let (first, status, err) = run.kill_after_first_epoch(3, Duration::from_secs(120));
    assert!(first.contains("\"epoch\":1"), "{first}");
    assert!(status.success(), "{err}");
    let mut lines = vec![first];
    lines.extend(run.lines.try_iter());
    let epochs: Vec<serde_json::Value> = lines
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(epochs.len(), 3, "{lines:?}");
    assert!(epochs[2]["test_accuracy"].as_f64().unwrap() > 0.1);
    assert!(err.contains("worker 3 was lost"), "{err}");
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("run.json")).unwrap()).unwrap();
    let lost = run["ps"]["workers_lost"].as_array().unwrap();
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0]["rank"], 3);
    let finished: Vec<u64> = run["ps"]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["rank"].as_u64().unwrap())
        .collect();
    assert_eq!(finished, [0, 1, 2]);
    for w in run["ps"]["workers"].as_array().unwrap() {
        assert_eq!(w["steps"], 120, "{w}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pid of the train parent's shard `i` (its child running `ps serve --shard-id=i`).
fn shard_pid(parent: u32, i: usize) -> Option<u32> {
    let want = format!("--shard-id={i}");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.contains(&&b"serve"[..]) && args.contains(&want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// Downpour with 2 workers and 2 shards: shard 1 is SIGKILLed mid-epoch; the run starts it
/// again on its address from its write-ahead log and checkpoint under --out, the workers
/// carry on (their resends are applied once), and the run ends with every epoch's accuracy.
#[test]
fn ps_async_survives_a_shard_killed_mid_epoch() {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch("shard-kill");
    let out_dir = dir.join("run");
    let mut cmd = gradwire();
    cmd.args(short_run(&data, &out_dir))
        .args(["--workers", "2", "--servers", "2", "--sync", "ps-async"])
        .args(["--epochs", "2", "--max-steps", "400"]);
    let mut run = Streaming::spawn(cmd);
    let parent = run.guard.0.id();
    // Mid-epoch 1: once the workers have pushed for a while (the WAL has records).
    let wal = out_dir.join("ps-shards/shard-1.wal");
    let t0 = Instant::now();
    while std::fs::metadata(&wal).map_or(0, |m| m.len()) < 1 << 20 {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "shard 1 logged nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let victim = shard_pid(parent, 1).expect("shard 1 runs");
    kill(victim);
    let status = loop {
        if let Some(s) = run.guard.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(240),
            "training still running 240 s after shard 1 was killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = run.stderr.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(status.success(), "{err}");
    assert!(err.contains("shard 1 exited"), "{err}");
    let mut lines = Vec::new();
    while let Ok(l) = run.lines.recv_timeout(Duration::from_secs(10)) {
        lines.push(l);
    }
    let epochs: Vec<serde_json::Value> = lines
        .iter()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(epochs.len(), 2, "{lines:?}");
    assert!(
        epochs[1]["test_accuracy"].as_f64().unwrap() > 0.5,
        "{epochs:?}"
    );
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["ps"]["shard_restarts"], serde_json::json!([0, 1]));
    for w in run["ps"]["workers"].as_array().unwrap() {
        assert_eq!(w["steps"], 800, "{w}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad combinations are refused before any data loads or process starts, by name.
#[test]
fn bad_ps_flag_combinations_are_refused_with_the_named_error() {
    for (flags, words) in [
        (&["--servers", "2"][..], &["--servers", "ps-sync"][..]),
        (
            &["--sync", "sandblaster", "--lr", "0.1"],
            &["--lr", "sandblaster"],
        ),
        (
            &["--sync", "ps-async", "--codec", "powersgd"],
            &["PowerSGD"],
        ),
        (&["--sync", "ps-sync", "--sb-iters", "2"], &["--sb-iters"]),
        (&["--sync", "ps-sync", "--n-fetch", "4"], &["Downpour"]),
        (
            &["--sync", "ps-async", "--optimizer", "sgd:lr=0.1,wd=0.0001"],
            &["weight decay"],
        ),
        (&["--sync", "ps-bogus"], &["ps-ssp:S"]),
    ] {
        let mut cmd = gradwire();
        cmd.arg("train")
            .args(flags)
            .arg("--data=/nonexistent-gradwire-data");
        let out = output_within(cmd, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} was accepted");
        for w in words {
            assert!(err.contains(w), "{flags:?}: {err}");
        }
        assert!(
            !err.contains("not found"),
            "{flags:?} reached the data: {err}"
        );
    }
}

/// Under `ps-sync` a SIGKILLed worker stalls every round: once the shards declare it dead
/// (10 s without a heartbeat) every other worker fails with an error naming it, and the
/// parent exits non-zero, well within a bound.
#[test]
fn ps_sync_names_a_killed_worker_within_the_deadline() {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch("sync-kill");
    let mut cmd = gradwire();
    cmd.args(short_run(&data, &dir.join("run")))
        .args(["--workers", "4", "--servers", "2", "--sync", "ps-sync"])
        .args(["--epochs", "3", "--max-steps", "40"]);
    let (_, status, err) = Streaming::spawn(cmd).kill_after_first_epoch(3, Duration::from_secs(60));
    assert!(!status.success(), "{err}");
    assert!(err.contains("worker 3 was lost"), "{err}");
    assert!(
        err.contains("worker 3 is lost"),
        "the survivors' errors name worker 3: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `train` with `flags` after the short MLP run's, within `limit`; returns stdout's
/// JSON lines and run.json.
fn train_json(
    data: &Path,
    out: &Path,
    flags: &[&str],
    limit: Duration,
) -> (Vec<serde_json::Value>, serde_json::Value) {
    train_json_after(short_run(data, out), out, flags, limit)
}

/// Runs `train` with `base` then `flags` within `limit`; returns stdout's JSON lines and
/// run.json (from `out`).
fn train_json_after(
    base: Vec<String>,
    out: &Path,
    flags: &[&str],
    limit: Duration,
) -> (Vec<serde_json::Value>, serde_json::Value) {
    let mut cmd = gradwire();
    cmd.args(base).args(flags);
    let o = output_within(cmd, limit);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{flags:?}: {err}");
    let lines = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let run = serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap())
        .unwrap_or_else(|e| panic!("run.json: {e}; {err}"));
    (lines, run)
}

/// Sandblaster L-BFGS through 2 shards with 2 worker threads, on a 1000-example sample of
/// Fashion-MNIST in 40 units of 25 (20 a worker, far below 1/2 of the batch): the
/// full-batch loss falls from about ln 10 by more than half, never rises between accepted
/// steps (Armijo), and held-out accuracy ends far above chance (10%).
#[test]
fn sandblaster_lbfgs_trains_the_mlp_through_the_shards() {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch("sandblaster");
    let started = Instant::now();
    // Sandblaster takes no --batch (its batch is --sb-batch), so not the SGD runs' flags.
    let out = dir.join("run");
    let base = vec![
        "train".to_string(),
        "--quiet".into(),
        "--eval-limit=100".into(),
        format!("--data={}", data.display()),
        format!("--out={}", out.display()),
    ];
    let (lines, run) = train_json_after(
        base,
        &out,
        &[
            "--model=mlp:hidden=32",
            "--sync=sandblaster",
            "--workers=2",
            "--servers=2",
            "--sb-batch=1000",
            "--sb-unit=25",
            "--sb-iters=6",
            "--epochs=2",
        ],
        Duration::from_secs(120),
    );
    eprintln!("sandblaster run: {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["epoch"], i + 1);
        assert_eq!(l["mode"], "sandblaster");
        assert_eq!(l["servers"], 2);
        assert_eq!(l["iterations"], 6 * (i + 1));
        assert!(l["bytes_sent"].as_u64().unwrap() > 0, "{l}");
        assert!(l["bytes_pulled"].as_u64().unwrap() > 0, "{l}");
    }
    let ps = &run["ps"];
    assert_eq!(
        (ps["units"].as_u64(), ps["unit"].as_u64()),
        (Some(40), Some(25))
    );
    let losses: Vec<f64> = ps["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 13, "{losses:?}");
    assert!((losses[0] - 10f64.ln()).abs() < 0.5, "{losses:?}");
    for w in losses.windows(2) {
        assert!(w[1] <= w[0] + 1e-9, "the loss rose: {losses:?}");
    }
    assert!(losses[12] < 0.5 * losses[0], "{losses:?}");
    assert!((lines[1]["train_loss"].as_f64().unwrap() - losses[12]).abs() < 1e-9);
    let passes = ps["passes"].as_u64().unwrap();
    assert!(ps["units_run"].as_u64().unwrap() >= 40 * passes);
    let acc = lines[1]["test_accuracy"].as_f64().unwrap();
    assert!(acc > 0.5, "held-out accuracy {acc}");
    assert_eq!(run["epochs"].as_array().unwrap().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A lossless push codec (top-k keeping every entry, error feedback on) goes through the
/// codec path on every push and ends at the parameters of dense PS synchronous SGD
/// (tolerance 1e-6: the shards may add the 4 pushes in another order).
#[test]
fn ps_sync_with_a_lossless_codec_reaches_the_parameters_of_dense_pushes() {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch("lossless");
    let mut params = Vec::new();
    for (name, codec) in [("dense", "none"), ("topk", "topk:ratio=1")] {
        let p = dir.join(format!("{name}.f32"));
        let (lines, run) = train_json(
            &data,
            &dir.join(name),
            &[
                "--workers=4",
                "--servers=2",
                "--sync=ps-sync",
                "--max-steps=4",
                "--optimizer=sgd:lr=0.05,momentum=0.9",
                &format!("--codec={codec}"),
                &format!("--save-params={}", p.display()),
            ],
            Duration::from_secs(120),
        );
        assert_eq!(lines.len(), 1);
        let c = run["ps"]["codec"].as_str().unwrap().to_string();
        assert!(
            c.starts_with(if name == "dense" { "dense" } else { "topk" }),
            "{c}"
        );
        params.push(read_f32s(&p));
    }
    assert_eq!(params[0].len(), params[1].len());
    let worst = params[0]
        .iter()
        .zip(&params[1])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-6, "largest difference {worst}");
    assert!(
        params[0].len() > 100_000,
        "the MLP has {} parameters",
        params[0].len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Downpour (4 workers, 2 shards, Adagrad) with QSGD pushes learns (held-out accuracy far
/// above chance) and its workers push fewer measured bytes than with dense pushes; so does
/// MXNet's 2-bit codec (threshold 0.01: the default 0.5 is far above these gradients).
#[test]
fn ps_async_with_compressed_pushes_learns_and_moves_fewer_bytes() {
    let Some(data) = fashion_mnist() else { return };
    let dir = scratch("qsgd");
    let mut pushed = Vec::new();
    for (name, flag) in [
        ("dense", "--codec=none"),
        ("qsgd", "--codec=qsgd"),
        ("2bit", "--push-codec=2bit:threshold=0.01"),
    ] {
        let (lines, run) = train_json(
            &data,
            &dir.join(name),
            &[
                "--workers=4",
                "--servers=2",
                "--sync=ps-async",
                "--max-steps=60",
                "--optimizer=adagrad:lr=0.01",
                flag,
            ],
            Duration::from_secs(180),
        );
        let acc = lines[0]["test_accuracy"].as_f64().unwrap();
        // 2-bit sends only +-threshold where the residual passed it: it learns slower.
        let floor = if name == "2bit" { 0.2 } else { 0.4 };
        assert!(acc > floor, "{name}: held-out accuracy {acc}");
        let ratio = lines[0]["compression_ratio"].as_f64().unwrap();
        let all = run["ps"]["bytes_pushed_all"].as_u64().unwrap();
        eprintln!("{name}: accuracy {acc:.3}, pushed {all} bytes, ratio {ratio:.2}");
        pushed.push((all, ratio));
    }
    let (dense, _) = pushed[0];
    for (name, (all, ratio)) in ["qsgd", "2bit"].iter().zip(&pushed[1..]) {
        assert!(*all * 2 < dense, "{name} pushed {all} bytes, dense {dense}");
        assert!(*ratio > 2.0, "{name}: compression ratio {ratio}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
