//! Ranks as real child processes (this test binary run again in a child role), stopped at
//! each point of the shared-memory setup where ring files exist: stopped by SIGTERM or
//! SIGINT (what a launcher sends) they leave no file behind; killed outright (SIGKILL), the
//! launcher's removal leaves none.
//!
//! Setup calls [`pause_at`] at those points; in a child told to pause there it says so and
//! sleeps until it is stopped.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::*;

/// The stage at which a child pauses (`creating`: rank 0 made its first file; `created`:
/// rank 0 made them all, nobody opened any; `claimed`: every rank mapped and claimed its
/// ends, nobody unlinked a file).
const PAUSE_VAR: &str = "GRADWIRE_SHM_TEST_PAUSE";
const CHILD_VAR: &str = "GRADWIRE_SHM_KILL_CHILD";

/// A point of the setup (test builds only): a child told to pause at `stage` says so on
/// standard output and sleeps until it is stopped.
pub(super) fn pause_at(stage: &str, rank: usize) {
    if std::env::var(PAUSE_VAR).ok().as_deref() != Some(stage) {
        return;
    }
    println!("CHILD paused {stage} {rank}");
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs(60));
}

/// The child role: one rank of a shared-memory job from the environment, which pauses in
/// its setup. Run by the tests below; as a plain test it does nothing.
#[test]
fn kill_child_role() {
    if std::env::var(CHILD_VAR).is_err() {
        return;
    }
    let cfg = config_from_env().unwrap().expect("child without a rank");
    match Shm::connect(&cfg) {
        Ok(_) => println!("CHILD joined"),
        Err(e) => println!("CHILD error: {e}"),
    }
    std::process::exit(3);
}

/// A job of child ranks; killed, reaped and its files removed when dropped, so a failing
/// test leaves no process and no file behind.
struct Job {
    children: Vec<Child>,
    cfg: ShmConfig,
    lines: mpsc::Receiver<(usize, String)>,
}

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = remove_files_of(&self.cfg);
    }
}

/// Starts `n` ranks that pause at `stage`.
fn start(n: usize, stage: &str) -> Job {
    let token = format!("kill-{:016x}", rand::random::<u64>());
    let job_id = format!("{:032x}", rand::random::<u128>());
    let env = |rank: usize| -> Vec<(&'static str, String)> {
        vec![
            ("GRADWIRE_RANK", rank.to_string()),
            ("GRADWIRE_WORLD_SIZE", n.to_string()),
            ("GRADWIRE_TOKEN", token.clone()),
            ("GRADWIRE_JOB_ID", job_id.clone()),
            ("GRADWIRE_TIMEOUT", "20".into()),
        ]
    };
    let vars = env(0);
    let cfg = config_from(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()))
        .unwrap()
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let (tx, lines) = mpsc::channel();
    let mut job = Job {
        children: Vec::new(),
        cfg,
        lines,
    };
    for rank in 0..n {
        let mut child = Command::new(&exe)
            .args(["shm::kill_tests::kill_child_role", "--exact", "--nocapture"])
            .env(CHILD_VAR, "1")
            .env(PAUSE_VAR, stage)
            .envs(env(rank))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if let Some(rest) = line.strip_prefix("CHILD ") {
                    let _ = tx.send((rank, rest.to_string()));
                }
            }
        });
        job.children.push(child);
    }
    job
}

impl Job {
    /// Waits for `count` children to say they paused.
    fn paused(&self, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for _ in 0..count {
            let (rank, line) = self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("a child did not reach its pause in time");
            assert!(line.starts_with("paused"), "rank {rank}: {line}");
        }
    }

    /// This job's files in its ring directory.
    fn files(&self) -> Vec<String> {
        let prefix = self.cfg.file_prefix();
        std::fs::read_dir(&self.cfg.dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&prefix))
            .collect()
    }

    /// Sends `sig` to every child and reaps it; asserts each ended by that signal within
    /// 30 s (a child still running then fails the test and is killed on drop, e.g. when the
    /// test runs in a background job without job control, which inherits SIGINT ignored).
    fn stop(&mut self, sig: libc::c_int) {
        for c in &self.children {
            // SAFETY: kill(2) on a child we spawned and have not reaped.
            unsafe { libc::kill(c.id() as libc::pid_t, sig) };
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for (r, c) in self.children.iter_mut().enumerate() {
            use std::os::unix::process::ExitStatusExt;
            let status = loop {
                if let Some(s) = c.try_wait().unwrap() {
                    break s;
                }
                assert!(
                    Instant::now() < deadline,
                    "rank {r} still running 30 s after signal {sig}"
                );
                std::thread::sleep(Duration::from_millis(10));
            };
            assert_eq!(status.signal(), Some(sig), "rank {r} ended with {status}");
        }
    }
}

/// The stages, and how many ranks pause at each.
fn stages(n: usize) -> [(&'static str, usize); 3] {
    [("creating", 1), ("created", 1), ("claimed", n)]
}

/// A SIGTERM or SIGINT at any point of the setup where ring files exist: every rank ends by
/// the signal as before, and no file of the job is left in `/dev/shm`.
#[test]
fn a_rank_stopped_during_setup_leaves_no_file() {
    let n = 3;
    for (stage, pausing) in stages(n) {
        for sig in [libc::SIGTERM, libc::SIGINT] {
            let mut job = start(n, stage);
            job.paused(pausing);
            assert!(!job.files().is_empty(), "{stage}: no file to leave behind");
            job.stop(sig);
            assert!(
                job.files().is_empty(),
                "{stage}, signal {sig}: left {:?}",
                job.files()
            );
        }
    }
}

/// Killed outright (no handler runs): the files stay until the launcher removes them with
/// `remove_files_of`, which removes all of them.
#[test]
fn the_launcher_removes_the_files_of_killed_ranks() {
    let n = 3;
    for (stage, pausing) in stages(n) {
        let mut job = start(n, stage);
        job.paused(pausing);
        job.stop(libc::SIGKILL);
        let left = job.files().len();
        assert!(left > 0, "{stage}: nothing left to remove");
        assert_eq!(remove_files_of(&job.cfg).unwrap(), left);
        assert!(job.files().is_empty(), "{stage}: {:?}", job.files());
    }
}
