//! `gradwire launch`: start N local ranks, prefix their output, stop all on the first failure.
//!
//! Every job gets a fresh random token (`GRADWIRE_TOKEN`) and job identity
//! (`GRADWIRE_JOB_ID`). A SIGTERM or SIGINT to the launcher is forwarded to every rank (and
//! what it started), which then get [`GRACE`] to end before SIGKILL. Once the ranks have
//! exited, the launcher removes any shared-memory ring file of the job that a rank killed
//! during its setup left behind.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gradwire_transport::shm::{self, ShmConfig};

use anyhow::{Context, Result};
use clap::Args;

/// Arguments of `gradwire launch`.
#[derive(Args, Debug)]
pub struct LaunchArgs {
    /// Number of ranks to start.
    #[arg(short = 'n', long = "np", value_parser = clap::value_parser!(u32).range(1..=1024),
          required_unless_present = "join")]
    np: Option<u32>,
    /// Rendezvous address of rank 0 (default: 127.0.0.1 and a free port).
    #[arg(long)]
    master: Option<SocketAddr>,
    /// Deadline in seconds for every blocking call of the ranks (GRADWIRE_TIMEOUT).
    #[arg(long)]
    timeout: Option<f64>,
    /// Do not prefix output lines with the rank: every rank's output passes through
    /// untouched (interleaved as the ranks write it).
    #[arg(long)]
    no_prefix: bool,
    /// Elastic job of MIN to MAX processes (the `-n` start it): no process gets a rank from
    /// the environment; a membership coordinator here forms each world, a process's death
    /// re-forms it without that process (the job goes on while at least MIN remain), and
    /// `gradwire launch --join FILE` adds one. For `gradwire train` and the Python package's
    /// `gw.elastic.run`.
    #[arg(long, value_name = "MIN:MAX")]
    elastic: Option<crate::train_elastic::ElasticRange>,
    /// With --elastic: write how to join the job to FILE (mode 0600: it holds the job's
    /// token), removed when the job ends.
    #[arg(long, value_name = "FILE", requires = "elastic")]
    join_file: Option<std::path::PathBuf>,
    /// Start one more process of the running elastic job whose --join-file is FILE (its
    /// command, admitted at the job's next commit).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["elastic", "np"])]
    join: Option<std::path::PathBuf>,
    /// The command each rank runs, after `--`.
    #[arg(last = true, required_unless_present = "join", num_args = 1..)]
    command: Vec<String>,
}

/// Runs the launcher; returns the exit code for the process.
pub fn run(args: &LaunchArgs) -> Result<i32> {
    if let Some(file) = &args.join {
        crate::launch_elastic::join(file)?;
        return Ok(0);
    }
    let np = args.np.map_or(1, |n| n as usize);
    if let Some(range) = args.elastic {
        if !(range.min..=range.max).contains(&np) {
            anyhow::bail!("-n {np} is outside --elastic {}:{}", range.min, range.max);
        }
        let spec = RankSpec {
            np,
            master: None,
            timeout: args.timeout,
            program: args.command[0].clone(),
            args: args.command[1..].to_vec(),
        };
        crate::launch_elastic::run(&crate::launch_elastic::ElasticJob {
            spec: &spec,
            min: range.min,
            max: range.max,
            join_file: args.join_file.as_deref(),
            who: "gradwire launch",
        })?;
        return Ok(0);
    }
    let spec = RankSpec {
        np,
        master: args.master,
        timeout: args.timeout,
        program: args.command[0].clone(),
        args: args.command[1..].to_vec(),
    };
    let ranks = spawn(&spec, !args.no_prefix)?;
    let outcome = ranks.wait()?;
    if let Some(sig) = outcome.signal {
        eprintln!("gradwire launch: stopped by signal {sig}, passed on to the ranks");
        return Ok(128 + sig);
    }
    if let Some((rank, status)) = outcome.failure {
        let code = exit_code(status);
        eprintln!(
            "gradwire launch: rank {rank} failed ({}); the other ranks were stopped",
            describe(status)
        );
        return Ok(code);
    }
    Ok(0)
}

/// What to start.
pub struct RankSpec {
    /// Number of ranks.
    pub np: usize,
    /// Rendezvous address (default: loopback, a free port).
    pub master: Option<SocketAddr>,
    /// Deadline in seconds passed as GRADWIRE_TIMEOUT.
    pub timeout: Option<f64>,
    /// Program to run.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

/// How long ranks get to end after a SIGTERM before they are killed.
pub const GRACE: Duration = Duration::from_secs(3);

/// Ranks started by [`spawn`]; dropping it kills those still running (and removes the
/// shared-memory files they left).
pub struct Ranks {
    children: Vec<Option<Child>>,
    pumps: Vec<JoinHandle<()>>,
    /// Rank 0's standard output, when captured.
    pub captured: Option<JoinHandle<String>>,
    /// The ranks' shared-memory settings, whose files are removed once they have exited.
    rings: Option<ShmConfig>,
    /// The signal passed on to the ranks, and when (they get [`GRACE`]).
    forwarded: Option<(i32, Instant)>,
    /// Counted among the live sets of ranks (see [`Signals`]).
    _live: Live,
}

/// How a set of ranks ended.
pub struct Outcome {
    /// The first rank that failed and how, if any.
    pub failure: Option<(usize, ExitStatus)>,
    /// The SIGTERM or SIGINT the launcher got and passed on to the ranks, if any.
    pub signal: Option<i32>,
}

/// SIGTERM and SIGINT while ranks run: noted, for the wait loops to pass on to the ranks;
/// while none run, they end this process as by default.
struct Signals {
    /// The last signal noted (0: none).
    pending: Arc<AtomicUsize>,
    /// Whether no set of ranks runs (then a signal ends the process).
    idle: Arc<AtomicBool>,
    /// Sets of ranks alive.
    live: Mutex<usize>,
}

/// The handlers, installed on the first spawn.
fn signals() -> &'static Signals {
    static SIGNALS: OnceLock<Signals> = OnceLock::new();
    SIGNALS.get_or_init(|| {
        let s = Signals {
            pending: Arc::new(AtomicUsize::new(0)),
            idle: Arc::new(AtomicBool::new(true)),
            live: Mutex::new(0),
        };
        for sig in [libc::SIGTERM, libc::SIGINT] {
            // Note it, then end the process if no ranks run (actions run in this order).
            let noted =
                signal_hook::flag::register_usize(sig, Arc::clone(&s.pending), sig as usize);
            let idle = signal_hook::flag::register_conditional_default(sig, Arc::clone(&s.idle));
            if let Err(e) = noted.and(idle) {
                tracing::warn!("cannot pass signal {sig} on to the ranks: {e}");
            }
        }
        s
    })
}

/// One live set of ranks, while it lives.
struct Live;

impl Live {
    fn new() -> Live {
        let s = signals();
        let mut n = s.live.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        s.idle.store(false, Ordering::SeqCst);
        Live
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let s = signals();
        let mut n = s.live.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        s.idle.store(*n == 0, Ordering::SeqCst);
    }
}

/// What happens to the ranks' output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Output {
    /// Every line of every rank, prefixed with `[rank]`.
    Prefixed,
    /// Every rank's output passed through untouched (`launch --no-prefix`).
    Inherit,
    /// Rank 0's output passed through (its progress bar included), the other ranks'
    /// standard output discarded (`train`, where only rank 0 reports).
    Rank0,
    /// Rank 0's standard output captured into [`Ranks::captured`], the others' discarded.
    CaptureRank0,
}

/// Starts the ranks with prefixed output (`prefix`), or with every rank's output passed
/// through untouched (`!prefix`).
pub fn spawn(spec: &RankSpec, prefix: bool) -> Result<Ranks> {
    spawn_inner(
        spec,
        if prefix {
            Output::Prefixed
        } else {
            Output::Inherit
        },
    )
}

/// Like [`spawn`] but captures rank 0's standard output (for `bench`).
pub fn spawn_capturing(spec: &RankSpec) -> Result<Ranks> {
    spawn_inner(spec, Output::CaptureRank0)
}

/// Starts `np` ranks of this binary with `args` (a benchmark's `--worker` form), waits for
/// them all, and parses the last JSON line rank 0 printed.
pub fn run_ranks_for_json<T: serde::de::DeserializeOwned>(
    np: usize,
    args: Vec<String>,
) -> Result<T> {
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
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
    let out = captured
        .join()
        .map_err(|_| anyhow::anyhow!("reading rank 0's output"))?;
    if let Some((rank, status)) = outcome.failure {
        anyhow::bail!("benchmark rank {rank} failed ({})", describe(status));
    }
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("rank 0 printed no result")?;
    serde_json::from_str(line).context("parsing rank 0's result")
}

/// Starts the ranks with rank 0's output passed through untouched (its progress bar
/// included) and the other ranks' standard output discarded (`train`).
pub fn spawn_quiet(spec: &RankSpec) -> Result<Ranks> {
    spawn_inner(spec, Output::Rank0)
}

/// How an elastic job's processes find their coordinator (`gradwire train --elastic`).
pub struct ElasticEnv {
    /// The coordinator's address (`GRADWIRE_ELASTIC`).
    pub coordinator: SocketAddr,
    /// The job's token (`GRADWIRE_TOKEN`).
    pub token: String,
    /// The job's id (`GRADWIRE_JOB_ID`).
    pub job: String,
}

/// Starts the processes of an elastic job: no rank in their environment (the coordinator
/// gives each its rank, generation by generation), every process's output passed through
/// (only the current rank 0 reports). Wait with [`Ranks::wait_elastic`].
pub fn spawn_elastic(spec: &RankSpec, env: &ElasticEnv) -> Result<Ranks> {
    let mut ranks = Ranks {
        children: Vec::new(),
        pumps: Vec::new(),
        captured: None,
        rings: None,
        forwarded: None,
        _live: Live::new(),
    };
    for i in 0..spec.np {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env(
                gradwire_run::elastic::ENV_ELASTIC,
                env.coordinator.to_string(),
            )
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
        let child = cmd
            .spawn()
            .with_context(|| format!("starting worker {i}: {}", spec.program))?;
        ranks.children.push(Some(child));
    }
    Ok(ranks)
}

fn spawn_inner(spec: &RankSpec, output: Output) -> Result<Ranks> {
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
    let mut ranks = Ranks {
        children: Vec::new(),
        pumps: Vec::new(),
        captured: None,
        rings,
        forwarded: None,
        _live: Live::new(),
    };
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
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting rank {rank}: {}", spec.program))?;
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

impl Ranks {
    /// Waits for every rank; on the first failure stops the others (SIGTERM, then SIGKILL
    /// after a grace period) and reports that rank. A SIGTERM or SIGINT to this process is
    /// passed on to the ranks (see the module doc). Then removes the job's leftover
    /// shared-memory files.
    pub fn wait(mut self) -> Result<Outcome> {
        let mut failure = None;
        while failure.is_none() && self.children.iter().any(Option::is_some) {
            self.pass_on_signals();
            failure = self.reap()?.into_iter().find(|(_, s)| !s.success());
            if failure.is_some() {
                self.stop_all();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.finish();
        Ok(Outcome {
            failure,
            signal: self.forwarded.map(|(sig, _)| sig),
        })
    }

    /// Waits for every rank without stopping the others when one fails (a parameter
    /// server's asynchronous workers train on without a lost one); returns each rank's exit
    /// status, in rank order. Signals are passed on as by [`Ranks::wait`].
    pub fn wait_all(mut self) -> Result<Vec<ExitStatus>> {
        let mut done: Vec<Option<ExitStatus>> = vec![None; self.children.len()];
        while done.iter().any(Option::is_none) {
            self.pass_on_signals();
            for (rank, status) in self.reap()? {
                done[rank] = Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.finish();
        Ok(done.into_iter().flatten().collect())
    }

    /// Waits for an elastic job: a process that ends, even killed, stops nothing (the
    /// coordinator re-forms the world without it); the job ends when `outcome` says so
    /// (`Some(Ok)`: finished, `Some(Err(reason))`: aborted), after which the processes get
    /// [`GRACE`] to exit before they are killed. Signals are passed on as by [`Ranks::wait`].
    /// Returns the outcome.
    pub fn wait_elastic(
        mut self,
        outcome: impl Fn(Duration) -> Option<std::result::Result<(), String>>,
    ) -> Result<std::result::Result<(), String>> {
        let result = loop {
            self.pass_on_signals();
            self.reap()?;
            if let Some(sig) = self.forwarded.map(|(sig, _)| sig) {
                if self.children.iter().all(Option::is_none) {
                    break Err(format!("stopped by signal {sig}"));
                }
            }
            if let Some(r) = outcome(Duration::from_millis(20)) {
                break r;
            }
        };
        let grace = Instant::now() + GRACE;
        while self.children.iter().any(Option::is_some) && Instant::now() < grace {
            self.reap()?;
            std::thread::sleep(Duration::from_millis(10));
        }
        for c in self.children.iter_mut().filter_map(Option::take) {
            let mut c = c;
            signal_group(&c, libc::SIGKILL);
            let _ = c.wait();
        }
        self.finish();
        Ok(result)
    }

    /// The ranks that have exited since the last call, with their statuses (their slots
    /// emptied).
    fn reap(&mut self) -> Result<Vec<(usize, ExitStatus)>> {
        let mut out = Vec::new();
        for (rank, slot) in self.children.iter_mut().enumerate() {
            let Some(child) = slot.as_mut() else {
                continue;
            };
            if let Some(status) = child
                .try_wait()
                .with_context(|| format!("waiting for rank {rank}"))?
            {
                out.push((rank, status));
                *slot = None;
            }
        }
        Ok(out)
    }

    /// Passes a SIGTERM or SIGINT this process got on to every rank still running; SIGKILLs
    /// them once [`GRACE`] has passed since, or at a second signal.
    fn pass_on_signals(&mut self) {
        let sig = signals().pending.swap(0, Ordering::SeqCst) as i32;
        if sig != 0 {
            let kill = self.forwarded.is_some();
            for child in self.children.iter().flatten() {
                signal_group(child, if kill { libc::SIGKILL } else { sig });
            }
            if !kill {
                self.forwarded = Some((sig, Instant::now()));
            }
        }
        if let Some((_, at)) = self.forwarded {
            if at.elapsed() >= GRACE {
                for child in self.children.iter().flatten() {
                    signal_group(child, libc::SIGKILL);
                }
            }
        }
    }

    /// Once every rank has exited: joins the output pumps and removes the shared-memory
    /// files the ranks left (a rank killed during its setup cannot remove its own).
    fn finish(&mut self) {
        for p in self.pumps.drain(..) {
            let _ = p.join();
        }
        self.remove_rings();
    }

    /// Removes the job's shared-memory files, once no rank runs.
    fn remove_rings(&mut self) {
        if self.children.iter().any(Option::is_some) {
            return;
        }
        if let Some(cfg) = self.rings.take() {
            match shm::remove_files_of(&cfg) {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    dir = %cfg.dir.display(),
                    "removed {n} shared-memory file(s) the ranks left behind"
                ),
                Err(e) => tracing::debug!(dir = %cfg.dir.display(), "shared-memory files: {e}"),
            }
        }
    }

    /// Stops every rank still running.
    fn stop_all(&mut self) {
        for child in self.children.iter().flatten() {
            signal_group(child, libc::SIGTERM);
        }
        let grace = Instant::now() + GRACE;
        for child in self.children.iter_mut() {
            if let Some(c) = child.as_mut() {
                while Instant::now() < grace {
                    if let Ok(Some(_)) = c.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                signal_group(c, libc::SIGKILL);
                let _ = c.wait();
            }
            *child = None;
        }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in self.children.iter_mut() {
            if let Some(c) = child.as_mut() {
                signal_group(c, libc::SIGKILL);
                let _ = c.wait();
            }
            *child = None;
        }
        self.remove_rings();
    }
}

/// Sends `sig` to a rank's whole process group (the rank and whatever it started).
fn signal_group(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on the process group of a child we spawned (it called setpgid(0, 0))
    // and have not reaped, so the group id is still ours.
    unsafe { libc::kill(-(child.id() as libc::pid_t), sig) };
}

/// Copies a child's stream line by line with a `[rank]` prefix.
fn pump(rank: usize, stream: impl Read + Send + 'static, to_stderr: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    let prefix = format!("[{rank}] ");
                    let res = if to_stderr {
                        let mut e = std::io::stderr().lock();
                        e.write_all(prefix.as_bytes())
                            .and_then(|()| e.write_all(&line))
                    } else {
                        let mut o = std::io::stdout().lock();
                        o.write_all(prefix.as_bytes())
                            .and_then(|()| o.write_all(&line))
                            .and_then(|()| o.flush())
                    };
                    if res.is_err() {
                        break;
                    }
                }
            }
        }
    })
}

/// A free port on 127.0.0.1 (bound and released; rank 0 binds it right after).
fn free_loopback_port() -> Result<SocketAddr> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .context("finding a free port for the rendezvous")?;
    Ok(l.local_addr()?)
}

/// The exit code that reports `status` (128 + signal for a killed rank).
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

/// Human words for an exit status.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        (None, None) => "unknown status".into(),
    }
}

/// Makes the child lead its own process group (so stopping it also stops what it started)
/// and asks the kernel to kill it when this process dies, so no child outlives a crashed
/// launcher.
pub(crate) fn own_group_dies_with_parent(cmd: &mut Command) {
    // SAFETY: setpgid and prctl are async-signal-safe, as a pre_exec hook requires.
    unsafe {
        cmd.pre_exec(|| {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}
