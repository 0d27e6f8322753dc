//! Parameter-server shard processes: `gradwire ps serve` (one shard until stopped, under
//! any launcher, where the shard id defaults to the launcher's rank, or alone), and the
//! supervised shards a `gradwire train` run starts ([`Shards`]: a write-ahead log and
//! checkpoints under the run's `--out`, a dead shard started again on its address).
//! Connections must prove the token in `GRADWIRE_PS_TOKEN`, else `GRADWIRE_TOKEN`
//! (`gradwire_ps::auth`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Subcommand;

/// The parameter-server subcommands.
#[derive(Subcommand, Debug)]
pub enum PsCommand {
    /// Serve one shard: prints `listening on ADDR` first, then serves until stopped.
    ///
    /// Tables, updaters (sgd, momentum, adagrad, adam) and consistency (sync, async, ssp:S)
    /// are chosen by the workers' `init`; pushes are applied exactly once; with `--dir` the
    /// shard checkpoints parameters and optimizer state atomically and, with `--wal`,
    /// acknowledges a push only once it is in an fsynced write-ahead log.
    Serve(gradwire_ps::serve::ServeArgs),
}

/// Runs a `ps` subcommand.
pub fn run(cmd: PsCommand) -> Result<()> {
    match cmd {
        PsCommand::Serve(a) => {
            let rank = gradwire_run::join::detect()?.map(|l| l.config.rank as u32);
            match gradwire_ps::serve::serve(&a, rank.unwrap_or(0))? {}
        }
    }
}

/// The token this run's shards and workers share: `GRADWIRE_PS_TOKEN` or `GRADWIRE_TOKEN`
/// if either is set, else 128 random bits. Stored in this process's `GRADWIRE_PS_TOKEN`,
/// so the worker processes started later inherit it (a launcher replaces their
/// `GRADWIRE_TOKEN` with its own) and in-process clients read it. Call it before starting
/// other threads.
pub fn ensure_ps_token() -> String {
    let token = gradwire_ps::auth::token_from_env();
    let token = if token.is_empty() {
        format!("{:032x}", rand::random::<u128>())
    } else {
        token
    };
    std::env::set_var(gradwire_ps::auth::PS_TOKEN_ENV, &token);
    token
}

/// Settings of a run's shard processes.
#[derive(Debug, Clone)]
pub struct ShardOptions {
    /// A worker silent this long is dead.
    pub heartbeat_timeout_s: f64,
    /// Checkpoints and write-ahead logs go here (emptied first); `None`: memory only.
    pub dir: Option<PathBuf>,
    /// Checkpoint period, with `dir`.
    pub checkpoint_every_s: f64,
    /// Start a shard again (same address, same `dir`) when it dies.
    pub restart: bool,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            heartbeat_timeout_s: 10.0,
            dir: None,
            checkpoint_every_s: 30.0,
            restart: false,
        }
    }
}

impl ShardOptions {
    /// What `gradwire train` gives its shards: a write-ahead log and checkpoints under
    /// `<out>/ps-shards`, and a restart when one dies. The log is not fsynced: what a shard
    /// acknowledged survives the shard process (the kernel holds it), not the host.
    pub fn for_run(out: &Path) -> Self {
        ShardOptions {
            dir: Some(out.join("ps-shards")),
            restart: true,
            ..ShardOptions::default()
        }
    }
}

/// How often the supervisor looks for a dead shard.
const SUPERVISE_EVERY: Duration = Duration::from_millis(100);
/// How long a starting shard may take to print its address.
const START_LIMIT: Duration = Duration::from_secs(30);

/// Shard processes (`gradwire ps serve`) of this run, supervised (restarted when they die,
/// with [`ShardOptions::restart`]); dropping stops them.
pub struct Shards {
    /// Their addresses, in shard order.
    pub addrs: Vec<SocketAddr>,
    children: Arc<Mutex<Vec<Child>>>,
    restarts: Arc<Mutex<Vec<u32>>>,
    stop: Arc<AtomicBool>,
    supervisor: Option<JoinHandle<()>>,
}

/// How to start shard `i` (again).
struct ShardCommand {
    exe: PathBuf,
    workers: usize,
    opts: ShardOptions,
    token: String,
}

impl ShardCommand {
    /// Starts shard `i` listening on `listen`; returns it and its reported address.
    fn spawn(&self, i: usize, listen: SocketAddr) -> Result<(Child, SocketAddr)> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(["ps", "serve"])
            .arg(format!("--listen={listen}"))
            .arg(format!("--shard-id={i}"))
            .arg(format!("--workers={}", self.workers))
            .arg(format!(
                "--heartbeat-timeout={}",
                self.opts.heartbeat_timeout_s
            ))
            .env_remove("GRADWIRE_RANK")
            .env_remove("GRADWIRE_WORLD_SIZE")
            .env(gradwire_ps::auth::PS_TOKEN_ENV, &self.token)
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if let Some(d) = &self.opts.dir {
            cmd.arg(format!("--dir={}", d.display()))
                .args(["--wal", "--no-fsync"])
                .arg(format!(
                    "--checkpoint-every={}",
                    self.opts.checkpoint_every_s
                ));
        }
        // The shard leads its own process group and dies with this process.
        crate::launch::own_group_dies_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting shard {i}: {}", self.exe.display()))?;
        let out = child.stdout.take().context("the shard's stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(out);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            // Keep reading so the shard never blocks on a full pipe.
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let addr = rx
            .recv_timeout(START_LIMIT)
            .map_err(|_| anyhow::anyhow!("shard {i} printed no address within {START_LIMIT:?}"))
            .and_then(|line| {
                line.trim()
                    .strip_prefix("listening on ")
                    .and_then(|a| a.parse().ok())
                    .with_context(|| format!("shard {i} did not start (it printed {line:?})"))
            });
        match addr {
            Ok(a) => Ok((child, a)),
            Err(e) => {
                kill_group(&mut child);
                Err(e)
            }
        }
    }
}

/// SIGKILLs a shard's process group and reaps it.
fn kill_group(c: &mut Child) {
    // SAFETY: kill(2) on the process group of a shard we spawned and have not reaped.
    unsafe { libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL) };
    let _ = c.wait();
}

impl Shards {
    /// Starts `n` shards for `workers` workers on loopback and waits for their addresses.
    /// The shards take this process's PS token ([`ensure_ps_token`]), which the workers
    /// started after inherit.
    pub fn start(n: usize, workers: usize, opts: &ShardOptions) -> Result<Shards> {
        let shard = ShardCommand {
            exe: std::env::current_exe().context("locating the gradwire binary")?,
            workers,
            opts: opts.clone(),
            token: ensure_ps_token(),
        };
        if let Some(d) = &opts.dir {
            // A run starts from nothing: an earlier run's logs must not be replayed.
            if d.exists() {
                std::fs::remove_dir_all(d).with_context(|| format!("emptying {}", d.display()))?;
            }
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let mut shards = Shards {
            addrs: Vec::new(),
            children: Arc::new(Mutex::new(Vec::new())),
            restarts: Arc::new(Mutex::new(vec![0; n])),
            stop: Arc::new(AtomicBool::new(false)),
            supervisor: None,
        };
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        for i in 0..n {
            let (child, addr) = shard.spawn(i, any)?;
            lock(&shards.children).push(child);
            shards.addrs.push(addr);
        }
        if opts.restart {
            let (children, restarts, stop) = (
                shards.children.clone(),
                shards.restarts.clone(),
                shards.stop.clone(),
            );
            let addrs = shards.addrs.clone();
            shards.supervisor = Some(
                std::thread::Builder::new()
                    .name("ps-supervisor".into())
                    .spawn(move || supervise(&shard, &addrs, &children, &restarts, &stop))
                    .context("starting the shard supervisor")?,
            );
        }
        Ok(shards)
    }

    /// How many times each shard was started again.
    pub fn restarts(&self) -> Vec<u32> {
        lock(&self.restarts).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts a dead shard again on its address, from its directory, until `stop`.
fn supervise(
    shard: &ShardCommand,
    addrs: &[SocketAddr],
    children: &Mutex<Vec<Child>>,
    restarts: &Mutex<Vec<u32>>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(SUPERVISE_EVERY);
        let dead: Vec<(usize, String)> = lock(children)
            .iter_mut()
            .enumerate()
            .filter_map(|(i, c)| match c.try_wait() {
                Ok(Some(s)) => Some((i, crate::launch::describe(s))),
                _ => None,
            })
            .collect();
        for (i, status) in dead {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            eprintln!(
                "gradwire train: shard {i} exited ({status}); starting it again on {}",
                addrs[i]
            );
            match shard.spawn(i, addrs[i]) {
                Ok((child, _)) => {
                    lock(children)[i] = child;
                    lock(restarts)[i] += 1;
                }
                // Tried again on the next pass (the port may still be held for a moment).
                Err(e) => eprintln!("gradwire train: shard {i} did not start again: {e:#}"),
            }
        }
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.supervisor.take() {
            let _ = h.join();
        }
        for c in lock(&self.children).iter_mut() {
            kill_group(c);
        }
    }
}
