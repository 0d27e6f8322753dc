//! Helpers shared by the CLI's end-to-end tests: the binary, a guard that kills a child on
//! drop, the data folder (skip with a message, or fail under `GRADWIRE_REQUIRE_DATA=1`),
//! scratch folders, a bounded run, the parameter comparison, and finding and killing a
//! parent's worker processes; for the rank-level tests a guard over several children, a free
//! port, a rank's rendezvous environment, and a bounded run that returns the JSON it wrote.
//! Each test binary uses a part of them.
#![allow(dead_code)]

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn gradwire() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gradwire"))
}

/// A child killed on drop.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Fashion-MNIST's folder, or `None` (with a SKIPPED line) when it is not fetched.
pub fn fashion_mnist() -> Option<PathBuf> {
    let d = std::env::var_os("GRADWIRE_DATA").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data"),
        Into::into,
    );
    if d.join("fashion-mnist/train-images-idx3-ubyte.gz").exists() {
        return Some(d);
    }
    if std::env::var("GRADWIRE_REQUIRE_DATA").is_ok_and(|v| v == "1") {
        panic!("fashion-mnist required (GRADWIRE_REQUIRE_DATA=1) but not in {d:?}");
    }
    eprintln!("SKIPPED: fashion-mnist not in {d:?}; run scripts/fetch-data.sh");
    None
}

pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gradwire-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs a command to completion within `limit` (killed and failed past it).
pub fn output_of(cmd: &mut Command, limit: Duration) -> Output {
    let mut g = Guard(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let t0 = Instant::now();
    while g.0.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < limit,
            "command did not finish within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let child = std::mem::replace(&mut g.0, Command::new("true").spawn().unwrap());
    child.wait_with_output().unwrap()
}

/// The largest difference between `a` and `b` relative to the largest magnitude in `a`.
pub fn max_rel_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "parameter counts");
    let scale = a.iter().fold(0f64, |m, v| m.max(f64::from(v.abs())));
    let diff = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max(f64::from((x - y).abs())));
    diff / scale.max(1e-12)
}

/// The children of `parent` whose environment sets `var`, with its value, by pid.
pub fn children_with_env(parent: u32, var: &str) -> Vec<(u32, String)> {
    let prefix = format!("{var}=");
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Field 4 (after the parenthesised command) is the parent pid.
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if let Some(v) = env
            .split(|b| *b == 0)
            .find_map(|v| v.strip_prefix(prefix.as_bytes()))
        {
            found.push((pid, String::from_utf8_lossy(v).into_owned()));
        }
    }
    found.sort_unstable();
    found
}

/// SIGKILLs `pid`.
pub fn sigkill(pid: u32) {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: kill(2) with SIGKILL on a process the calling test started (directly or
    // through a parent it owns).
    unsafe { kill(pid as i32, 9) };
}

/// Children killed on drop.
pub struct Procs(pub Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A port free on 127.0.0.1 a moment ago (for a rank 0 to listen on).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// [`output_of`] for a command given by value.
pub fn output_within(mut cmd: Command, limit: Duration) -> Output {
    output_of(&mut cmd, limit)
}

/// Runs `cmd` (which writes JSON to `json`) within `limit`, asserts it succeeded, and returns
/// the JSON it wrote.
pub fn run_json(cmd: Command, limit: Duration, json: &std::path::Path) -> serde_json::Value {
    let out = output_within(cmd, limit);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

/// Sets the rendezvous environment of rank `rank` of `n` (rank 0 on 127.0.0.1:`port`).
pub fn rank_env(cmd: &mut Command, rank: usize, n: usize, port: u16, token: &str) {
    cmd.env("GRADWIRE_RANK", rank.to_string())
        .env("GRADWIRE_WORLD_SIZE", n.to_string())
        .env("GRADWIRE_MASTER_ADDR", "127.0.0.1")
        .env("GRADWIRE_MASTER_PORT", port.to_string())
        .env("GRADWIRE_TOKEN", token);
}
