//! The launcher role: finds `mpirun`, starts `mpirun -np N <this binary> --mpi-suite N` (or
//! `--mpi-bench N`) for each N, streams the ranks' output, kills a job that overruns its time
//! limit (its whole process group), and checks every rank's pass line.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gradwire_transport::mpi::Mpi;

use crate::{BENCH_FLAG, SUITE_FLAG};

/// Kills the job's process group when dropped (timeout, panic), so nothing is left behind.
pub(crate) struct JobGuard {
    child: std::process::Child,
    done: bool,
}

impl JobGuard {
    fn kill(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: signalling the process group we created for the job.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        if !self.done {
            self.kill();
        }
    }
}

pub(crate) fn find_mpirun() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("GRADWIRE_MPIRUN") {
        return Some(p.into());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("mpirun"))
        .find(|p| p.is_file())
}

pub(crate) fn launch(bench: bool) -> i32 {
    let Some(mpirun) = find_mpirun() else {
        if std::env::var("GRADWIRE_REQUIRE_MPI").as_deref() == Ok("1") {
            eprintln!("mpi test: FAILED: mpirun not found but GRADWIRE_REQUIRE_MPI=1");
            return 1;
        }
        eprintln!();
        eprintln!("************************************************************************");
        eprintln!("* mpi test: SKIPPED: mpirun is not on the PATH (set GRADWIRE_MPIRUN,   *");
        eprintln!("* or GRADWIRE_REQUIRE_MPI=1 to make this a failure). Nothing was run.  *");
        eprintln!("************************************************************************");
        eprintln!();
        return 0;
    };
    let version = Command::new(&mpirun)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let open_mpi = version.contains("Open MPI") || version.contains("OpenRTE");
    let nps: Vec<usize> = match std::env::var("GRADWIRE_MPI_NP") {
        Ok(s) => s
            .split(',')
            .map(|x| x.trim().parse().expect("GRADWIRE_MPI_NP"))
            .collect(),
        Err(_) if bench => vec![2, 4],
        Err(_) => vec![1, 2, 3, 4],
    };
    let limit = Duration::from_secs_f64(
        std::env::var("GRADWIRE_MPI_TEST_TIMEOUT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300.0),
    );
    if !gradwire_transport::mpi::launched_by_mpi() {
        // Outside a launcher, from_env declines without initializing MPI.
        assert!(
            matches!(Mpi::from_env(), Ok(None)),
            "from_env outside mpirun"
        );
    }
    let exe = std::env::current_exe().expect("own path");
    let mut failed = 0;
    for np in nps {
        let t0 = Instant::now();
        let mut cmd = Command::new(&mpirun);
        cmd.arg("-np").arg(np.to_string());
        if open_mpi {
            cmd.arg("--oversubscribe");
            for (k, v) in [
                ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
                ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
                // Containers often block process_vm_readv (Open MPI's single-copy mode).
                ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
            ] {
                if std::env::var_os(k).is_none() {
                    cmd.env(k, v);
                }
            }
        }
        let flag = if bench { BENCH_FLAG } else { SUITE_FLAG };
        cmd.arg(&exe).arg(flag).arg(np.to_string());
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        eprintln!("mpi test: {cmd:?}");
        let child = cmd.spawn().expect("spawning mpirun");
        let mut job = JobGuard { child, done: false };
        let stdout = job.child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut passes = 0;
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                println!("{line}");
                if line.starts_with("mpi suite: PASS") {
                    passes += 1;
                }
            }
            passes
        });
        let status = loop {
            if let Some(s) = job.child.try_wait().expect("waiting for mpirun") {
                break Some(s);
            }
            if t0.elapsed() > limit {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let Some(status) = status else {
            eprintln!("mpi test: np {np}: FAILED: no result after {limit:?}, killing the job");
            job.kill();
            job.done = true;
            failed += 1;
            continue;
        };
        job.done = true;
        let passes = reader.join().unwrap_or(0);
        let took = t0.elapsed();
        if !status.success() || (!bench && passes != np) {
            eprintln!("mpi test: np {np}: FAILED ({status}, {passes}/{np} ranks passed)");
            failed += 1;
        } else {
            eprintln!("mpi test: np {np}: ok in {took:.1?}");
        }
    }
    if failed == 0 {
        0
    } else {
        1
    }
}
