//! Integration tests that start real `gradwire` processes on 127.0.0.1.
//!
//! Every child is owned by a [`Procs`] guard that kills it on drop, so a failing test leaves
//! no process behind.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn gradwire() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gradwire"))
}

/// Children killed on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs a command with a hard deadline; kills it and fails the test past the deadline.
fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) of our own child's pid.
            unsafe { libc_kill(id) };
            panic!("command did not finish within {limit:?}");
        }
    }
}

unsafe fn libc_kill(pid: u32) {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: plain syscall on a pid we spawned.
    unsafe { kill(pid as i32, 9) };
}

/// Runs `cmd` (which writes JSON to `json`) within `limit`, asserts it succeeded, and returns
/// the JSON it wrote.
fn run_json(cmd: Command, limit: Duration, json: &std::path::Path) -> serde_json::Value {
    let out = output_within(cmd, limit);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

fn rank_env(cmd: &mut Command, rank: usize, n: usize, port: u16, token: &str) {
    cmd.env("GRADWIRE_RANK", rank.to_string())
        .env("GRADWIRE_WORLD_SIZE", n.to_string())
        .env("GRADWIRE_MASTER_ADDR", "127.0.0.1")
        .env("GRADWIRE_MASTER_PORT", port.to_string())
        .env("GRADWIRE_TOKEN", token);
}

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

#[test]
fn killed_rank_is_named_by_every_survivor_within_the_deadline() {
    let n = 4;
    let port = free_port();
    let mut procs = Procs(Vec::new());
    let mut ready = Vec::new();
    for r in 0..n {
        let mut cmd = gradwire();
        cmd.args(["check", "--elements", "50000", "--iters", "1000000000"]);
        rank_env(&mut cmd, r, n, port, "kill-test");
        cmd.env("GRADWIRE_TIMEOUT", "5")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if line.is_err() || tx.send(()).is_err() {
                    break;
                }
            }
        });
        ready.push(rx);
        procs.0.push(child);
    }
    // Wait until every rank is inside the all-reduce loop, then kill rank 2.
    for rx in &ready {
        rx.recv_timeout(Duration::from_secs(30))
            .expect("rank started its loop");
    }
    procs.0[2].kill().unwrap();
    let killed_at = Instant::now();
    for r in [0, 1, 3] {
        let child = &mut procs.0[r];
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(15),
                "rank {r} still running 15 s after the kill"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(!status.success(), "rank {r} should fail");
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(
            err.contains("rank 2"),
            "rank {r}'s error should name rank 2: {err}"
        );
    }
}

#[test]
fn wrong_token_and_garbage_are_refused_while_the_job_completes() {
    let n = 2;
    let port = free_port();
    let mut procs = Procs(Vec::new());
    let mut cmd0 = gradwire();
    cmd0.args(["check", "--elements", "1000", "--iters", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    rank_env(&mut cmd0, 0, n, port, "the-right-token");
    procs.0.push(cmd0.spawn().unwrap());
    // Once rank 0 listens: a stranger with a wrong token, and one sending random bytes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut wrong = loop {
        match TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("rank 0 never listened: {e}"),
        }
    };
    // A well-formed hello (magic GWH1, kind 1, rank 1, world 2, port 1) with a wrong token.
    let mut hello = Vec::new();
    hello.extend_from_slice(&0x3148_5747u32.to_le_bytes());
    hello.push(1);
    hello.extend_from_slice(&1u32.to_le_bytes());
    hello.extend_from_slice(&2u32.to_le_bytes());
    hello.extend_from_slice(&1u16.to_le_bytes());
    hello.extend_from_slice(&5u16.to_le_bytes());
    hello.extend_from_slice(b"wrong");
    wrong.write_all(&hello).unwrap();
    let mut junk = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    junk.write_all(&garbage).unwrap();
    // Now the real rank 1.
    let mut cmd1 = gradwire();
    cmd1.args(["check", "--elements", "1000", "--iters", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    rank_env(&mut cmd1, 1, n, port, "the-right-token");
    procs.0.push(cmd1.spawn().unwrap());
    for (r, child) in procs.0.iter_mut().enumerate() {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "rank {r} hung");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "rank {r} failed: {out}\n{err}");
        assert!(
            out.contains("iteration 1: all-reduce of 1000 elements ok"),
            "{out}"
        );
        if r == 0 {
            assert!(
                err.contains("refused"),
                "rank 0 should log the refused connections: {err}"
            );
        }
    }
}

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

/// `gradwire ps serve` prints its address and serves a worker: two integer pushes to a
/// `sum` table in async mode are pulled back exactly; a bad flag combination is refused.
#[test]
fn ps_serve_serves_pushes_and_pulls() {
    use gradwire_ps::{ClientConfig, Consistency, Key, KvStore, TableSpec, WorkerId};
    use std::io::{BufRead, BufReader};

    let mut child = gradwire()
        .args(["ps", "serve", "--workers", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let _guard = Procs(vec![child]);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("ps serve printed its address");
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line {line:?}"))
        .parse()
        .unwrap();
    let mut kv = KvStore::connect(ClientConfig::new(WorkerId(0), vec![addr])).unwrap();
    let spec = TableSpec::new(Consistency::Async, "sum".parse().unwrap());
    kv.init(Key(7), spec, &[0.0; 5]).unwrap();
    kv.push(Key(7), &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
    kv.push(Key(7), &[10.0, 20.0, 30.0, 40.0, 50.0]).unwrap();
    let mut got = [0.0f32; 5];
    kv.pull(Key(7), &mut got).unwrap();
    assert_eq!(got, [11.0, 22.0, 33.0, 44.0, 55.0]);
    kv.leave().unwrap();

    let out = output_within(
        {
            let mut c = gradwire();
            c.args(["ps", "serve", "--wal"]);
            c
        },
        Duration::from_secs(20),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dir"));
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

/// `gradwire simulate --host-cores`: per worker count and codec, a whole step of that many
/// rank processes is measured on this host without a link (recorded in the JSON's inputs),
/// and the prediction is that step plus the link's communication.
#[test]
fn simulate_on_a_shared_host_measures_a_step_of_rank_processes() {
    let v = simulate_json(
        "simhost",
        &[
            "--model",
            "mlp:hidden=64x2",
            "--workers",
            "3",
            "--link",
            "100mbit",
            "--codec",
            "none;onebit",
            "--batch",
            "8",
            "--host-cores",
            "2",
        ],
    );
    let hosts = v["inputs"]["host_steps"].as_array().unwrap();
    assert_eq!(hosts.len(), 2, "{v}");
    let results = v["results"].as_array().unwrap();
    for (h, codec) in hosts.iter().zip(["none", "onebit"]) {
        assert_eq!(h["codec"], codec, "{h}");
        assert_eq!(h["workers"], 3, "{h}");
        assert_eq!(h["compute"]["workers"], 3, "{h}");
        let mean = h["compute"]["mean_s"].as_f64().unwrap();
        let slowest = h["compute"]["slowest_s"].as_f64().unwrap();
        let step = h["step_s"].as_f64().unwrap();
        assert!(mean > 0.0 && slowest >= mean && step > mean, "{h}");
        // The prediction adds the 100 Mbit/s link's communication to the measured step, less
        // what hides behind the other ranks' sync work (1-bit SGD's few bytes may all hide;
        // dense's 220 kB over 100 Mbit/s outlast what a sync without codec work hides).
        let r = results.iter().find(|r| r["codec"] == codec).unwrap();
        let predicted = r["step_s"].as_f64().unwrap();
        assert!(predicted >= step, "{r} {h}");
        if codec == "none" {
            assert!(predicted > step, "{r} {h}");
        }
    }
    // The speedup compares with dense's own measured step, not with dense's wire added to
    // the codec's measured step.
    let step_of = |codec| {
        let r = results.iter().find(|r| r["codec"] == codec).unwrap();
        r["step_s"].as_f64().unwrap()
    };
    let onebit = results.iter().find(|r| r["codec"] == "onebit").unwrap();
    let speedup = onebit["speedup"].as_f64().unwrap();
    assert!(
        (speedup - step_of("none") / step_of("onebit")).abs() < 1e-9,
        "{onebit}"
    );
    // The ranks' own mode refuses to run outside the environment simulate gives them.
    let err = simulate_fails(&["--host-worker", "--host-cores", "2", "--codec", "none"]);
    assert!(err.contains("internal"), "{err}");
}

/// Runs `gradwire simulate ARGS --json FILE` (in a folder named after `tag`) and returns the
/// JSON it wrote.
fn simulate_json(tag: &str, args: &[&str]) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("gradwire-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("sim.json");
    let mut cmd = gradwire();
    cmd.arg("simulate").args(args).arg("--json").arg(&json);
    let out = output_within(cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("valid JSON");
    let _ = std::fs::remove_dir_all(&dir);
    v
}

/// Runs `gradwire simulate ARGS`, which must fail, and returns what it said on stderr.
fn simulate_fails(args: &[&str]) -> String {
    let mut cmd = gradwire();
    cmd.arg("simulate").args(args);
    let out = output_within(cmd, Duration::from_secs(30));
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `gradwire simulate --json`: the results have exactly the documented fields, one entry per
/// (link, workers, codec), dense has speedup 1, and the inputs and provenance are recorded.
#[test]
fn simulate_writes_the_documented_json() {
    let v = simulate_json(
        "simulate",
        &[
            "--model",
            "mlp:hidden=64x2",
            "--workers",
            "2,8",
            "--link",
            "1gbit",
            "--link",
            "100mbit,1ms",
            "--codec",
            "none;topk:ratio=0.01",
            "--compute-ms",
            "10",
        ],
    );
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2 * 2 * 2);
    for r in results {
        let mut keys: Vec<&str> = r.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "codec",
                "efficiency",
                "link",
                "speedup",
                "step_s",
                "workers"
            ]
        );
        let step = r["step_s"].as_f64().unwrap();
        // At least the 10 ms of compute given.
        assert!(step >= 0.01, "{r}");
        if r["codec"] == "none" {
            assert_eq!(r["speedup"].as_f64().unwrap(), 1.0, "{r}");
        }
        let eff = r["efficiency"].as_f64().unwrap();
        assert!((eff - 0.01 / step).abs() < 1e-9, "{r}");
    }
    assert_eq!(results[0]["link"], "1gbit");
    assert_eq!(results[0]["workers"], 2);
    assert_eq!(v["inputs"]["model"]["name"], "mlp:hidden=64x2");
    assert!(v["provenance"]["git_rev"].is_string());
    // A bad model spec is refused with the reason.
    let err = simulate_fails(&["--model", "mlp:hidden=0"]);
    assert!(err.contains("out of range"), "{err}");
}
