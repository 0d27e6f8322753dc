//! A shared-memory job's settings ([`ShmConfig`], [`WaitPolicy`], from the environment with
//! [`config_from`]) and the names of its ring files.
//!
//! A ring file is `<dir>/gradwire-<group>-<job>-<src>-<dst>`: `job` is a key of the job's
//! name, `group` of the part of it before the first `/` (shared by the jobs derived from it,
//! so a launcher removes them all at once). Keys are the first 8 bytes of SHA-256 over a
//! label, this user's id and the name, which holds the token and the job's identity
//! (`GRADWIRE_JOB_ID`, 128 random bits under `gradwire launch`): names cannot be predicted
//! without them, and two users never share a name.

use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::header::{self, RingHeader};
use crate::{Error, Result, DEFAULT_TIMEOUT};

/// Default data bytes per ring (each ordered pair of ranks has one).
pub const DEFAULT_RING_BYTES: u64 = 1 << 20;

/// How a rank joins a shared-memory job.
#[derive(Debug, Clone)]
pub struct ShmConfig {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// The job's name: every rank of a job gives the same, unique on the host, and secret
    /// (the ring files are named from it, see the module doc). A job derived from another by
    /// appending `/...` (a host's share of it) has its own rings, and the same first part of
    /// their names, so [`remove_files_of`](super::remove_files_of) removes both.
    pub job: String,
    /// Deadline of every blocking call (no progress for this long is an error), and of setup.
    pub timeout: Duration,
    /// Data bytes per ring: a power of two in 4 KiB..=1 GiB.
    pub ring_bytes: u64,
    /// Largest accepted message in bytes.
    pub max_frame: u64,
    /// Where the ring files live.
    pub dir: PathBuf,
    /// How a rank waits for its peers.
    pub wait: WaitPolicy,
}

/// How a rank waits for a peer: poll, then poll and yield, then sleep (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// How long to poll without giving up the CPU.
    pub spin: Duration,
    /// How long to poll and yield the CPU between polls, after spinning, before sleeping.
    pub yield_for: Duration,
}

impl WaitPolicy {
    /// The default: no spinning, yield for 1 ms, then sleep.
    ///
    /// Measured (`examples/allreduce_procs.rs` of gradwire-collective, 4 KiB all-reduce, two
    /// processes, a 2-core VM under load average 11-12): without pinning the ranks to cores,
    /// spinning 5 us before yielding took 23-27 us per all-reduce and spinning 50 us took
    /// 113-118 us, against 8-13 us for yielding at once: the ranks often share a core, where
    /// a spinning rank holds off the peer it waits for. Pinned to different cores (as
    /// `mpirun` does), spinning and yielding were within 1 us of each other (7.2-8.2 us).
    /// (Those runs predate the rings' pages being faulted in at setup, which every figure
    /// here included; with them faulted in, pinned and spinning took 1.8-2.7 us.)
    pub fn new() -> WaitPolicy {
        WaitPolicy {
            spin: Duration::ZERO,
            yield_for: Duration::from_millis(1),
        }
    }
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy::new()
    }
}

impl ShmConfig {
    /// A config with default deadline, ring size, frame limit and waiting, in `/dev/shm`.
    pub fn new(rank: usize, world_size: usize, job: impl Into<String>) -> ShmConfig {
        ShmConfig {
            rank,
            world_size,
            job: job.into(),
            timeout: DEFAULT_TIMEOUT,
            ring_bytes: DEFAULT_RING_BYTES,
            max_frame: crate::tcp::DEFAULT_MAX_FRAME,
            dir: PathBuf::from("/dev/shm"),
            wait: WaitPolicy::new(),
        }
    }

    /// The key of the job's rings: in their names and headers (see [`key`]).
    pub(crate) fn job_key(&self) -> u64 {
        key(b"ring", &self.job)
    }

    /// The key of the job and of every job derived from it by appending `/...` (a host's
    /// share of the job): the first part of the names of all their files.
    fn group_key(&self) -> u64 {
        let root = self.job.split('/').next().unwrap_or_default();
        key(b"group", root)
    }

    /// The start of the name of every file of this job and of the jobs derived from it.
    pub(crate) fn file_prefix(&self) -> String {
        format!("gradwire-{:016x}-", self.group_key())
    }

    /// Every ring file's path, less `-<src>-<dst>`.
    pub(crate) fn path_prefix(&self) -> PathBuf {
        self.dir
            .join(format!("{}{:016x}", self.file_prefix(), self.job_key()))
    }

    pub(crate) fn path(&self, src: usize, dst: usize) -> PathBuf {
        let mut p = self.path_prefix().into_os_string();
        p.push(format!("-{src}-{dst}"));
        PathBuf::from(p)
    }

    pub(crate) fn header(&self, src: usize, dst: usize) -> RingHeader {
        RingHeader {
            capacity: self.ring_bytes,
            src: src as u32,
            dst: dst as u32,
            world_size: self.world_size as u32,
            job: self.job_key(),
        }
    }
}

/// Reads a shared-memory config from the process environment (the launcher variables of
/// [`crate::env`]; the job's name is `GRADWIRE_TOKEN` plus the master address plus the
/// job's identity ([`crate::env::job_identity_from`]: `GRADWIRE_JOB_ID`, random under
/// `gradwire launch`, or the launcher's job id), so two `mpirun` or `srun` jobs on one host
/// without a token still get different rings), with
/// `GRADWIRE_SHM_RING_BYTES` and `GRADWIRE_SHM_DIR` as options. `Ok(None)` when no launcher
/// set a rank.
pub fn config_from_env() -> Result<Option<ShmConfig>> {
    config_from(|k| std::env::var(k).ok())
}

/// [`config_from_env`] over any variable lookup.
pub fn config_from(get: impl Fn(&str) -> Option<String>) -> Result<Option<ShmConfig>> {
    let Some((tcp, _)) = crate::env::tcp_config_from(&get)? else {
        return Ok(None);
    };
    let mut job = format!("{}@{}", tcp.token, tcp.master);
    if !tcp.job.is_empty() {
        job = format!("{job}#{}", tcp.job);
    }
    let mut cfg = ShmConfig::new(tcp.rank, tcp.world_size, job);
    cfg.timeout = tcp.timeout;
    if let Some(b) = get("GRADWIRE_SHM_RING_BYTES") {
        cfg.ring_bytes = b
            .trim()
            .parse()
            .ok()
            .filter(|n: &u64| ring_size_ok(*n))
            .ok_or_else(|| Error::Env {
                reason: format!(
                    "GRADWIRE_SHM_RING_BYTES={b} is not a power of two from 4096 to 2^30"
                ),
            })?;
    }
    if let Some(d) = get("GRADWIRE_SHM_DIR") {
        cfg.dir = PathBuf::from(d);
    }
    for (var, field) in [
        ("GRADWIRE_SHM_SPIN_US", &mut cfg.wait.spin),
        ("GRADWIRE_SHM_YIELD_US", &mut cfg.wait.yield_for),
    ] {
        if let Some(v) = get(var) {
            let us: u64 = v.trim().parse().map_err(|_| Error::Env {
                reason: format!("{var}={v} is not a number of microseconds"),
            })?;
            *field = Duration::from_micros(us.min(10_000_000));
        }
    }
    Ok(Some(cfg))
}

pub(crate) fn ring_size_ok(n: u64) -> bool {
    n.is_power_of_two() && (header::MIN_CAPACITY..=header::MAX_CAPACITY).contains(&n)
}

/// A key of `name` for `label`: the first 8 bytes of SHA-256 over the label, this user's id
/// and the name, stable across builds so every rank derives the same.
fn key(label: &[u8], name: &str) -> u64 {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    let mut h = Sha256::new();
    h.update(b"gradwire shm\0");
    h.update(label);
    h.update(b"\0");
    h.update(uid.to_le_bytes());
    h.update(name.as_bytes());
    let d = h.finalize();
    let mut k = [0u8; 8];
    k.copy_from_slice(&d[..8]);
    u64::from_le_bytes(k)
}
