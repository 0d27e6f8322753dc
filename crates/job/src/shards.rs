//! A parameter-server job's shard processes ([`Shards`]): started as `PROGRAM ps serve` (a
//! `gradwire` binary) on loopback, each printing its address; supervised, a dead shard
//! started again on its address from its write-ahead log and checkpoints; stopped (their
//! process groups killed) when dropped. Connections must prove the token in
//! `GRADWIRE_PS_TOKEN`, else `GRADWIRE_TOKEN` ([`ensure_ps_token`], `gradwire_ps::auth`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use gradwire_run::launch::{describe, own_group_dies_with_parent};

/// Why shards could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ShardsError {
    /// The shard's program could not be started.
    #[error("starting shard {index}: {}: {source}", program.display())]
    Start {
        /// The shard.
        index: usize,
        /// The program.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The shard printed no address in time.
    #[error("shard {index} printed no address within {START_LIMIT:?}")]
    Silent {
        /// The shard.
        index: usize,
    },
    /// The shard printed something other than its address.
    #[error("shard {index} did not start (it printed {printed:?})")]
    Address {
        /// The shard.
        index: usize,
        /// Its first line.
        printed: String,
    },
    /// The shards' folder could not be emptied or made.
    #[error("preparing {path}: {source}")]
    Dir {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The supervisor thread could not be started.
    #[error("starting the shard supervisor: {0}")]
    Supervisor(std::io::Error),
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

/// Shard processes (`PROGRAM ps serve`) of this run, supervised (restarted when they die,
/// with [`ShardOptions::restart`]); dropping stops them.
pub struct Shards {
    /// Their addresses, in shard order.
    pub addrs: Vec<SocketAddr>,
    children: Arc<Mutex<Vec<Child>>>,
    restarts: Arc<Mutex<Vec<u32>>>,
    stop: Arc<AtomicBool>,
    supervisor: Option<JoinHandle<()>>,
}

/// What a shard's restart is told: its index, how the old process ended, its address, and
/// the error if it did not start again (tried again on the next pass).
pub type RestartNote = Box<dyn Fn(usize, &str, SocketAddr, Option<&ShardsError>) + Send>;

/// How to start shard `i` (again).
struct ShardCommand {
    exe: PathBuf,
    workers: usize,
    opts: ShardOptions,
    token: String,
}

impl ShardCommand {
    /// Starts shard `i` listening on `listen`; returns it and its reported address.
    fn spawn(&self, i: usize, listen: SocketAddr) -> Result<(Child, SocketAddr), ShardsError> {
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
        own_group_dies_with_parent(&mut cmd);
        let mut child = cmd.spawn().map_err(|source| ShardsError::Start {
            index: i,
            program: self.exe.clone(),
            source,
        })?;
        let Some(out) = child.stdout.take() else {
            kill_group(&mut child);
            return Err(ShardsError::Silent { index: i });
        };
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
            .map_err(|_| ShardsError::Silent { index: i })
            .and_then(|line| {
                line.trim()
                    .strip_prefix("listening on ")
                    .and_then(|a| a.parse().ok())
                    .ok_or(ShardsError::Address {
                        index: i,
                        printed: line.clone(),
                    })
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
    /// Starts `n` shards for `workers` workers on loopback, each `program ps serve ...` (a
    /// `gradwire` binary), and waits for their addresses; `note` hears of every restart. The
    /// shards take this process's PS token ([`ensure_ps_token`]), which the workers started
    /// after inherit.
    pub fn start(
        program: &Path,
        n: usize,
        workers: usize,
        opts: &ShardOptions,
        note: RestartNote,
    ) -> Result<Shards, ShardsError> {
        let shard = ShardCommand {
            exe: program.to_path_buf(),
            workers,
            opts: opts.clone(),
            token: ensure_ps_token(),
        };
        if let Some(d) = &opts.dir {
            let dir = |source| ShardsError::Dir {
                path: d.clone(),
                source,
            };
            // A run starts from nothing: an earlier run's logs must not be replayed.
            if d.exists() {
                std::fs::remove_dir_all(d).map_err(dir)?;
            }
            std::fs::create_dir_all(d).map_err(dir)?;
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
                    .spawn(move || supervise(&shard, &addrs, &children, &restarts, &stop, &note))
                    .map_err(ShardsError::Supervisor)?,
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
    note: &RestartNote,
) {
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(SUPERVISE_EVERY);
        let dead: Vec<(usize, String)> = lock(children)
            .iter_mut()
            .enumerate()
            .filter_map(|(i, c)| match c.try_wait() {
                Ok(Some(s)) => Some((i, describe(s))),
                _ => None,
            })
            .collect();
        for (i, status) in dead {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            match shard.spawn(i, addrs[i]) {
                Ok((child, _)) => {
                    note(i, &status, addrs[i], None);
                    lock(children)[i] = child;
                    lock(restarts)[i] += 1;
                }
                // Tried again on the next pass (the port may still be held for a moment).
                Err(e) => note(i, &status, addrs[i], Some(&e)),
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
