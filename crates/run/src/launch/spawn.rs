//! Starting the ranks: each one's environment, its output, its process group.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use gradwire_transport::shm;

use super::output::{pump, Output};
use super::{ElasticEnv, LaunchError, RankSpec, Ranks};

/// Starts the ranks with prefixed output (`prefix`: every line of rank N's standard output
/// and error goes to this process's as `[N] line`), or with every rank's output passed
/// through untouched (`!prefix`).
pub fn spawn(spec: &RankSpec, prefix: bool) -> Result<Ranks, LaunchError> {
    spawn_inner(
        spec,
        if prefix {
            Output::Prefixed
        } else {
            Output::Inherit
        },
    )
}

/// Like [`spawn`] but captures rank 0's standard output into [`Ranks::captured`] (the other
/// ranks' standard output is discarded; `bench`).
pub fn spawn_capturing(spec: &RankSpec) -> Result<Ranks, LaunchError> {
    spawn_inner(spec, Output::CaptureRank0)
}

/// Starts the ranks with rank 0's output passed through untouched (its progress bar
/// included) and the other ranks' standard output discarded (`train`).
pub fn spawn_quiet(spec: &RankSpec) -> Result<Ranks, LaunchError> {
    spawn_inner(spec, Output::Rank0)
}

/// Starts `np` ranks of this binary ([`std::env::current_exe`]) with `args` (a benchmark's
/// `--worker` form), waits for them all, and parses the last JSON line rank 0 printed.
pub fn run_ranks_for_json<T: serde::de::DeserializeOwned>(
    np: usize,
    args: Vec<String>,
) -> Result<T, LaunchError> {
    let exe = std::env::current_exe().map_err(LaunchError::CurrentExe)?;
    let spec = RankSpec {
        np,
        master: None,
        timeout: None,
        program: exe.display().to_string(),
        args,
    };
    let mut ranks = spawn_capturing(&spec)?;
    let captured = ranks.captured.take().expect("rank 0 captured");
    let outcome = ranks.wait()?;
    let out = captured.join().map_err(|_| LaunchError::RankOutput)?;
    if let Some((rank, status)) = outcome.failure {
        return Err(LaunchError::RankFailed { rank, status });
    }
    last_json_line(&out)
}

/// The last line of `out` that starts with `{`, parsed.
fn last_json_line<T: serde::de::DeserializeOwned>(out: &str) -> Result<T, LaunchError> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or(LaunchError::NoResult)?;
    serde_json::from_str(line).map_err(LaunchError::ParseResult)
}

/// Starts the processes of an elastic job: no rank in their environment (the coordinator
/// gives each its rank, generation by generation; `env` says where it is), every process's
/// output passed through (only the current rank 0 reports). Wait with
/// [`Ranks::wait_elastic`].
pub fn spawn_elastic(spec: &RankSpec, env: &ElasticEnv) -> Result<Ranks, LaunchError> {
    let mut ranks = Ranks::new(None);
    for index in 0..spec.np {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env(crate::elastic::ENV_ELASTIC, env.coordinator.to_string())
            .env("GRADWIRE_LOCAL_SIZE", spec.np.to_string())
            .env("GRADWIRE_TOKEN", &env.token)
            .env("GRADWIRE_JOB_ID", &env.job)
            .stdin(Stdio::null());
        for var in [
            "GRADWIRE_RANK",
            "GRADWIRE_WORLD_SIZE",
            "GRADWIRE_LOCAL_RANK",
        ] {
            cmd.env_remove(var);
        }
        if let Some(t) = spec.timeout {
            cmd.env("GRADWIRE_TIMEOUT", t.to_string());
        }
        own_group_dies_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|source| LaunchError::SpawnWorker {
            index,
            program: spec.program.clone(),
            source,
        })?;
        ranks.children.push(Some(child));
    }
    Ok(ranks)
}

/// Starts the ranks of `spec` with their output as `output` says.
fn spawn_inner(spec: &RankSpec, output: Output) -> Result<Ranks, LaunchError> {
    let master = match spec.master {
        Some(m) => m,
        None => free_loopback_port()?,
    };
    let token = format!("{:032x}", rand::random::<u128>());
    let job_id = format!("{:032x}", rand::random::<u128>());
    // The ranks' shared-memory settings, as rank 0 will read them from its environment.
    let ours = [
        ("GRADWIRE_RANK", "0".to_string()),
        ("GRADWIRE_WORLD_SIZE", spec.np.to_string()),
        ("GRADWIRE_MASTER_ADDR", master.ip().to_string()),
        ("GRADWIRE_MASTER_PORT", master.port().to_string()),
        ("GRADWIRE_TOKEN", token.clone()),
        ("GRADWIRE_JOB_ID", job_id.clone()),
    ];
    let rings = shm::config_from(|k| match ours.iter().find(|(name, _)| *name == k) {
        Some((_, v)) => Some(v.clone()),
        None => std::env::var(k).ok(),
    })
    .unwrap_or_else(|e| {
        tracing::debug!("no shared-memory settings for the ranks: {e}");
        None
    });
    let mut ranks = Ranks::new(rings);
    for rank in 0..spec.np {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env("GRADWIRE_RANK", rank.to_string())
            .env("GRADWIRE_WORLD_SIZE", spec.np.to_string())
            .env("GRADWIRE_LOCAL_RANK", rank.to_string())
            .env("GRADWIRE_LOCAL_SIZE", spec.np.to_string())
            .env("GRADWIRE_MASTER_ADDR", master.ip().to_string())
            .env("GRADWIRE_MASTER_PORT", master.port().to_string())
            .env("GRADWIRE_TOKEN", &token)
            .env("GRADWIRE_JOB_ID", &job_id)
            .stdin(Stdio::null());
        if let Some(t) = spec.timeout {
            cmd.env("GRADWIRE_TIMEOUT", t.to_string());
        }
        let capture_this = output == Output::CaptureRank0 && rank == 0;
        let prefix = output == Output::Prefixed;
        if prefix || capture_this {
            cmd.stdout(Stdio::piped());
        } else if rank > 0 && output != Output::Inherit {
            cmd.stdout(Stdio::null());
        }
        if prefix {
            cmd.stderr(Stdio::piped());
        }
        own_group_dies_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|source| LaunchError::SpawnRank {
            rank,
            program: spec.program.clone(),
            source,
        })?;
        if capture_this {
            let mut out = child.stdout.take().expect("piped");
            ranks.captured = Some(std::thread::spawn(move || {
                let mut s = String::new();
                let _ = out.read_to_string(&mut s);
                s
            }));
        } else if prefix {
            let out = child.stdout.take().expect("piped");
            let err = child.stderr.take().expect("piped");
            ranks.pumps.push(pump(rank, out, false));
            ranks.pumps.push(pump(rank, err, true));
        }
        ranks.children.push(Some(child));
    }
    Ok(ranks)
}

/// A free port on 127.0.0.1 (bound and released; rank 0 binds it right after).
fn free_loopback_port() -> Result<SocketAddr, LaunchError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map_err(LaunchError::Port)
}

/// Makes the child lead its own process group (so stopping it also stops what it started)
/// and asks the kernel to kill it when this process dies, so no child outlives a crashed
/// launcher.
pub fn own_group_dies_with_parent(cmd: &mut Command) {
    // SAFETY: setpgid and prctl are async-signal-safe, as a pre_exec hook requires.
    unsafe {
        cmd.pre_exec(|| {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::exit_code;

    fn sh(np: usize, script: &str) -> RankSpec {
        RankSpec {
            np,
            master: None,
            timeout: Some(2.5),
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
        }
    }

    #[test]
    fn each_rank_gets_its_rank_the_world_and_the_job() {
        let mut ranks = spawn_capturing(&sh(
            3,
            "echo rank=$GRADWIRE_RANK of=$GRADWIRE_WORLD_SIZE local=$GRADWIRE_LOCAL_RANK \
             master=$GRADWIRE_MASTER_ADDR timeout=$GRADWIRE_TIMEOUT token=${#GRADWIRE_TOKEN}",
        ))
        .unwrap();
        let captured = ranks.captured.take().unwrap();
        let outcome = ranks.wait().unwrap();
        assert_eq!(outcome.failure, None);
        assert_eq!(outcome.signal, None);
        assert_eq!(
            captured.join().unwrap(),
            "rank=0 of=3 local=0 master=127.0.0.1 timeout=2.5 token=32\n"
        );
    }

    #[test]
    fn the_first_failure_is_reported_and_stops_the_others() {
        // Rank 1 fails at once; rank 0 would sleep far past the grace period.
        let script = "if [ $GRADWIRE_RANK = 1 ]; then exit 4; fi; exec sleep 60";
        let start = std::time::Instant::now();
        let outcome = spawn_quiet(&sh(2, script)).unwrap().wait().unwrap();
        let (rank, status) = outcome.failure.expect("a failure");
        assert_eq!((rank, exit_code(status)), (1, 4));
        assert!(start.elapsed() < std::time::Duration::from_secs(30));
    }

    #[test]
    fn wait_all_reports_every_rank_in_order() {
        let statuses = spawn_quiet(&sh(3, "exit $GRADWIRE_RANK"))
            .unwrap()
            .wait_all()
            .unwrap();
        let codes: Vec<i32> = statuses.into_iter().map(exit_code).collect();
        assert_eq!(codes, [0, 1, 2]);
    }

    #[test]
    fn a_missing_program_names_the_rank_and_the_program() {
        let spec = RankSpec {
            np: 1,
            master: None,
            timeout: None,
            program: "/nonexistent/gradwire-test-program".into(),
            args: Vec::new(),
        };
        let Err(e) = spawn_quiet(&spec) else {
            panic!("a missing program started")
        };
        assert!(matches!(e, LaunchError::SpawnRank { rank: 0, .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "starting rank 0: /nonexistent/gradwire-test-program"
        );
        let source = std::error::Error::source(&e).expect("the i/o error");
        assert!(source.to_string().contains("No such file"), "{source}");
    }

    #[test]
    fn rank_0_s_last_json_line_is_the_result() {
        let v: serde_json::Value =
            last_json_line("log\n{\"a\": 1}\nmore\n{\"a\": 2}\nend\n").unwrap();
        assert_eq!(v["a"], 2);
        assert!(matches!(
            last_json_line::<serde_json::Value>("no json\n"),
            Err(LaunchError::NoResult)
        ));
        assert!(matches!(
            last_json_line::<u32>("{\"a\": 1}\n"),
            Err(LaunchError::ParseResult(_))
        ));
    }

    #[test]
    fn a_free_port_is_on_loopback() {
        let a = free_loopback_port().unwrap();
        assert!(a.ip().is_loopback());
        assert_ne!(a.port(), 0);
    }
}
