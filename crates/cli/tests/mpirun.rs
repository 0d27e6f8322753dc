//! The README's `mpirun` and `srun` lines, run as written (feature `mpi`).
//!
//! The lines between the `launcher-lines` marker comments of README.md are the test: each is
//! split into words (no quoting allowed), the word `gradwire` becomes this build's binary,
//! and it runs in a fresh directory with `GRADWIRE_DATA` pointing at the fetched data sets.
//! - `mpirun ...` runs under the real `mpirun` (`GRADWIRE_MPIRUN` overrides the path); the
//!   Open MPI settings a container needs (run as root, more ranks than cores, no single-copy
//!   shared memory) come from the environment, not the line. The binary is built with MPI,
//!   so `auto` picks the MPI transport, which the test checks from each rank's output.
//! - `srun ...` has no Slurm here: a fake `srun` in this file starts the `-n N` ranks itself
//!   with the variables Slurm gives a task (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`,
//!   `SLURM_NNODES`, `SLURM_STEP_TASKS_PER_NODE`, `SLURM_JOB_ID`, `SLURM_STEP_ID`) and a
//!   free `GRADWIRE_MASTER_PORT`; plain `srun` makes no MPI job, so the ranks take TCP, which
//!   the test checks.
//!
//! `gradwire check` must print every rank's verified iterations; `gradwire train` must write
//! `run.json` and an epoch line with a test accuracy into its `--out`. Each line runs with a
//! deadline (`GRADWIRE_MPI_TEST_TIMEOUT` seconds, default 300) and its processes are killed on
//! timeout or failure. Without `mpirun` the test skips loudly, unless
//! `GRADWIRE_REQUIRE_MPI=1` (as `scripts/ci-mpi.sh` sets), which makes that a failure; the
//! training lines need Fashion-MNIST (`scripts/fetch-data.sh`), likewise required under
//! `GRADWIRE_REQUIRE_DATA=1`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BEGIN: &str = "<!-- launcher-lines:";
const END: &str = "<!-- /launcher-lines -->";

/// The `mpirun` and `srun` lines of the README's marked block.
fn readme_lines() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&path).expect("README.md");
    let start = text
        .find(BEGIN)
        .expect("README.md has the launcher-lines block");
    let block = &text[start..];
    let end = block.find(END).expect("the launcher-lines block is closed");
    block[..end]
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("mpirun ") || l.starts_with("srun "))
        .map(String::from)
        .collect()
}

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

fn data_dir() -> PathBuf {
    std::env::var_os("GRADWIRE_DATA").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data"),
        Into::into,
    )
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// A job's processes: killed (their process groups) on drop unless reaped.
struct Job {
    children: Vec<Child>,
}

impl Job {
    fn kill(&mut self) {
        for c in &mut self.children {
            let pgid = c.id() as libc::pid_t;
            // SAFETY: signalling process groups this test created (one per child).
            unsafe { libc::kill(-pgid, libc::SIGTERM) };
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3)
            && self
                .children
                .iter_mut()
                .any(|c| matches!(c.try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        for c in &mut self.children {
            // SAFETY: as above.
            unsafe { libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL) };
            let _ = c.wait();
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `cmd` in its own process group with its output in files under `dir`.
fn spawn(mut cmd: Command, dir: &Path, name: &str) -> Child {
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).unwrap();
    let err = std::fs::File::create(dir.join(format!("{name}.err"))).unwrap();
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"))
}

fn read(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

/// Waits for every child within `limit`; returns their outputs (stdout + stderr), or panics
/// with them.
fn finish(mut job: Job, dir: &Path, names: &[String], line: &str, limit: Duration) -> String {
    let start = Instant::now();
    let mut codes = vec![None; job.children.len()];
    while codes.iter().any(Option::is_none) {
        for (c, code) in job.children.iter_mut().zip(&mut codes) {
            if code.is_none() {
                *code = c.try_wait().unwrap().map(|s| s.code());
            }
        }
        if start.elapsed() > limit {
            job.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output: String = names
        .iter()
        .map(|n| {
            format!(
                "{}{}",
                read(&dir.join(format!("{n}.out"))),
                read(&dir.join(format!("{n}.err")))
            )
        })
        .collect();
    if codes.iter().any(|c| *c != Some(Some(0))) {
        panic!(
            "`{line}` failed (exit codes {codes:?}, after {:?}, limit {limit:?}):\n{output}",
            start.elapsed()
        );
    }
    output
}

/// The fake `srun`: `srun -n N CMD...` (or `--ntasks=N`) as Slurm would start it on one node.
fn fake_srun(
    words: &[String],
    bin: &Path,
    dir: &Path,
    env: &[(String, String)],
    tag: &str,
) -> (Job, Vec<String>) {
    let mut n = None;
    let mut i = 1;
    while i < words.len() && words[i].starts_with('-') {
        match words[i].as_str() {
            "-n" | "--ntasks" => {
                n = words.get(i + 1).and_then(|v| v.parse::<usize>().ok());
                i += 2;
            }
            w if w.starts_with("--ntasks=") => {
                n = w["--ntasks=".len()..].parse().ok();
                i += 1;
            }
            w => panic!("the fake srun knows -n/--ntasks only, not {w}: extend it"),
        }
    }
    let n = n.expect("srun line without -n N");
    assert_eq!(
        words.get(i).map(String::as_str),
        Some("gradwire"),
        "srun of what?"
    );
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut children = Vec::new();
    let mut names = Vec::new();
    for r in 0..n {
        let mut cmd = Command::new(bin);
        cmd.args(&words[i + 1..])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("SLURM_PROCID", r.to_string())
            .env("SLURM_NTASKS", n.to_string())
            .env("SLURM_LOCALID", r.to_string())
            .env("SLURM_NNODES", "1")
            .env("SLURM_STEP_TASKS_PER_NODE", n.to_string())
            .env("SLURM_JOB_ID", std::process::id().to_string())
            .env("SLURM_STEP_ID", "0")
            .env("GRADWIRE_MASTER_PORT", port.to_string());
        let name = format!("{tag}-rank{r}");
        children.push(spawn(cmd, dir, &name));
        names.push(name);
    }
    (Job { children }, names)
}

/// Checks what the line's `gradwire` subcommand must have produced.
fn check_result(
    line: &str,
    words: &[String],
    output: &str,
    dir: &Path,
    transport: &str,
    np: usize,
) {
    let pos = words.iter().position(|w| w == "gradwire").unwrap();
    match words.get(pos + 1).map(String::as_str) {
        Some("check") => {
            for r in 0..np {
                let want = format!("rank {r}/{np} ({transport}): iteration 0: all-reduce");
                assert!(
                    output.contains(&want),
                    "`{line}`: no {want:?} in:\n{output}"
                );
            }
        }
        Some("train") => {
            let joined = output.matches(&format!("transport={transport}")).count();
            assert_eq!(
                joined, np,
                "`{line}`: {np} ranks must join over {transport}:\n{output}"
            );
            let out = words
                .iter()
                .position(|w| w == "--out")
                .and_then(|i| words.get(i + 1))
                .expect("train lines give --out");
            let run = read(&dir.join(out).join("run.json"));
            let run: serde_json::Value = serde_json::from_str(&run)
                .unwrap_or_else(|e| panic!("`{line}`: run.json: {e}\n{output}"));
            assert_eq!(run["workers"].as_u64(), Some(np as u64), "{run}");
            let metrics = read(&dir.join(out).join("metrics.jsonl"));
            let epoch: serde_json::Value = serde_json::from_str(
                metrics
                    .lines()
                    .next()
                    .expect("one epoch line in metrics.jsonl"),
            )
            .unwrap();
            let acc = epoch["test_accuracy"].as_f64().expect("test_accuracy");
            assert!((0.0..=1.0).contains(&acc), "{epoch}");
        }
        other => panic!("`{line}`: the test knows check and train, not {other:?}"),
    }
}

#[test]
fn readme_mpirun_and_srun_lines_run_as_written() {
    let lines = readme_lines();
    assert!(
        lines.iter().any(|l| l.starts_with("mpirun "))
            && lines.iter().any(|l| l.starts_with("srun ")),
        "the README block must show mpirun and srun lines: {lines:?}"
    );
    let mpirun = std::env::var_os("GRADWIRE_MPIRUN")
        .map(PathBuf::from)
        .or_else(|| find_on_path("mpirun"));
    let Some(mpirun) = mpirun else {
        assert!(
            !required("GRADWIRE_REQUIRE_MPI"),
            "mpirun not found and GRADWIRE_REQUIRE_MPI=1"
        );
        eprintln!("SKIPPED: mpirun not found (install openmpi-bin or set GRADWIRE_MPIRUN)");
        return;
    };
    let data = data_dir();
    let have_data = gradwire_train::data::DatasetKind::FashionMnist
        .load(&data, 64)
        .is_ok();
    assert!(
        have_data || !required("GRADWIRE_REQUIRE_DATA"),
        "Fashion-MNIST required (GRADWIRE_REQUIRE_DATA=1) but not in {}",
        data.display()
    );
    let limit = Duration::from_secs(
        std::env::var("GRADWIRE_MPI_TEST_TIMEOUT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300),
    );
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_gradwire"));
    let dir = std::env::temp_dir().join(format!("gradwire-mpirun-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let env: Vec<(String, String)> = [
        ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
        ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
        ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
    ]
    .iter()
    .filter(|(k, _)| std::env::var_os(k).is_none())
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([
        ("GRADWIRE_DATA".to_string(), data.display().to_string()),
        (
            "RUST_LOG".to_string(),
            "gradwire_run::join=info".to_string(),
        ),
        ("NO_COLOR".to_string(), "1".to_string()),
        ("GRADWIRE_TIMEOUT".to_string(), "120".to_string()),
    ])
    .collect();
    for (k, line) in lines.iter().enumerate() {
        assert!(
            !line.contains(['"', '\'', '\\', '$', '`']),
            "README launcher lines take no quoting: {line}"
        );
        let words: Vec<String> = line.split_whitespace().map(String::from).collect();
        if words.iter().any(|w| w == "train") && !have_data {
            eprintln!("SKIPPED `{line}`: Fashion-MNIST not available; run scripts/fetch-data.sh");
            continue;
        }
        let np: usize = words
            .windows(2)
            .find(|w| w[0] == "-np" || w[0] == "-n")
            .and_then(|w| w[1].parse().ok())
            .expect("the line gives -np N or -n N");
        eprintln!("running `{line}`");
        let (job, names, transport) = if words[0] == "mpirun" {
            let mut cmd = Command::new(&mpirun);
            cmd.args(words[1..].iter().map(|w| {
                if w == "gradwire" {
                    bin.as_os_str()
                } else {
                    w.as_ref()
                }
            }))
            .envs(env.iter().map(|(k, v)| (k, v)));
            let name = format!("line{k}");
            let child = spawn(cmd, &dir, &name);
            (
                Job {
                    children: vec![child],
                },
                vec![name],
                "mpi",
            )
        } else {
            let (job, names) = fake_srun(&words, &bin, &dir, &env, &format!("line{k}"));
            (job, names, "tcp")
        };
        eprintln!("(outputs in {})", dir.display());
        let output = finish(job, &dir, &names, line, limit);
        check_result(line, &words, &output, &dir, transport, np);
        eprintln!("ok: `{line}`");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
