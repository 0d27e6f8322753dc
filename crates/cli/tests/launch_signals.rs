//! `gradwire launch` and signals: a SIGTERM to the launcher reaches its ranks, and no
//! shared-memory ring file outlives the job, whether its ranks removed their own (on the
//! signal) or the launcher had to kill one outright and removed them after it.
//!
//! Each test gives the job a ring directory of its own under `/dev/shm`, holds rank 0 in its
//! shared-memory setup (rank 1 never joins it), and checks the directory once the launcher
//! has exited. The launcher is killed (and its ranks with it) and the directory removed
//! when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A launcher and a ring directory, killed and removed when dropped.
struct Launch {
    child: Child,
    dir: PathBuf,
}

impl Drop for Launch {
    fn drop(&mut self) {
        // The ranks die with the launcher (PR_SET_PDEATHSIG).
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts `gradwire launch -n 2` of a shell script per rank (`$GW` is the gradwire binary,
/// `$GRADWIRE_SHM_DIR` the ring directory).
fn launch(rank0: &str, rank1: &str) -> Launch {
    let dir = PathBuf::from(format!(
        "/dev/shm/gw-launch-test-{}-{:08x}",
        std::process::id(),
        rand_u32()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(r#"if [ "$GRADWIRE_RANK" = 0 ]; then {rank0}; else {rank1}; fi"#);
    let child = Command::new(env!("CARGO_BIN_EXE_gradwire"))
        .args([
            "launch",
            "-n",
            "2",
            "--timeout",
            "30",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .env("GW", env!("CARGO_BIN_EXE_gradwire"))
        .env("GRADWIRE_SHM_DIR", &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Launch { child, dir }
}

fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    t.subsec_nanos() ^ std::process::id().rotate_left(16)
}

fn files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl Launch {
    /// Waits until rank 0 has made its ring files.
    fn rings_made(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while files(&self.dir).is_empty() {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the launcher ended ({status}) before rank 0 made its rings");
            }
            assert!(Instant::now() < deadline, "rank 0 made no ring file");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the launcher to exit.
    fn exited(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the launcher did not exit in {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A SIGTERM to the launcher while rank 0 sets up its shared memory: the launcher passes it
/// on and exits with 128 + 15; rank 0 removes its ring files on the signal.
#[test]
fn a_sigterm_to_the_launcher_reaches_the_ranks_and_leaves_no_ring() {
    let mut job = launch(r#"exec "$GW" check --transport shm"#, "exec sleep 60");
    job.rings_made();
    // SAFETY: kill(2) on the launcher, a child we have not reaped.
    unsafe { libc::kill(job.child.id() as libc::pid_t, libc::SIGTERM) };
    let status = job.exited(Duration::from_secs(20));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
    assert!(files(&job.dir).is_empty(), "left {:?}", files(&job.dir));
}

/// Rank 1 fails while rank 0, which ignores SIGTERM, sets up its shared memory: the launcher
/// stops rank 0 with SIGKILL after the grace period, and then removes the ring files rank 0
/// could not.
#[test]
fn the_launcher_removes_the_rings_of_a_rank_it_killed() {
    let mut job = launch(
        r#"trap "" TERM INT; exec "$GW" check --transport shm"#,
        r#"while [ -z "$(ls "$GRADWIRE_SHM_DIR")" ]; do sleep 0.05; done; exit 7"#,
    );
    let status = job.exited(Duration::from_secs(60));
    assert_eq!(status.code(), Some(7), "{status}");
    assert!(files(&job.dir).is_empty(), "left {:?}", files(&job.dir));
}
