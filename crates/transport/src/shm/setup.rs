//! Joining a shared-memory job: rank 0 creates every ring file, each rank maps and claims
//! its ends and waits for its peers, then the files are unlinked (module doc of `shm`).
//! While a rank sets up, its files are armed against SIGTERM and SIGINT (`cleanup`); a
//! setup that fails removes what it made.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::cleanup::{signals_seen, Armed};
use super::config::ring_size_ok;
use super::header::{self, HeaderError};
use super::ring::{OpenError, Ring, Role, STATE_CLOSED, STATE_EMPTY};
use super::{Shm, ShmConfig};
use crate::{Error, Op, Result, Transport, DEFAULT_TIMEOUT};

/// Whether to fault the rings in at setup: when all `n (n-1)` rings of the job take at most
/// half the room left in their file system (`free`, None: unknown, then no). Rings no
/// algorithm uses (most pairs of a big job) would otherwise take room from the ones in use.
pub(super) fn should_populate(cfg: &ShmConfig, free: Option<u64>) -> bool {
    let n = cfg.world_size as u64;
    let total = n
        .saturating_mul(n.saturating_sub(1))
        .saturating_mul(cfg.ring_bytes + header::HEADER_LEN as u64);
    free.is_some_and(|f| total <= f / 2)
}

/// Bytes available to us in the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: a zeroed statvfs is a valid out-parameter; `c` is a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; statvfs only writes `st`.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Removes files on drop unless disarmed (setup that fails leaves nothing behind).
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Shm {
    /// Joins the job described by `cfg`: rank 0 creates the rings, every rank waits for its
    /// peers until `cfg.timeout`. A SIGTERM or SIGINT meanwhile removes the files this rank
    /// made or owns (and the setup fails, when the process lives on).
    pub fn connect(cfg: &ShmConfig) -> Result<Shm> {
        let (me, n) = (cfg.rank, cfg.world_size);
        crate::check_rank(me, n)?;
        if !ring_size_ok(cfg.ring_bytes) {
            return Err(Error::Rendezvous {
                reason: format!(
                    "ring size {} is not a power of two from 4096 to 2^30",
                    cfg.ring_bytes
                ),
            });
        }
        let stop = Stop(signals_seen());
        let armed = (n > 1).then(|| Armed::arm(cfg, me, me == 0));
        // Rank 0 removes every ring again if it fails; once it is in, each pair's files
        // are the business of that pair.
        let mut created = Cleanup(Vec::new());
        let mut cleanup = Cleanup(Vec::new());
        if me == 0 {
            for s in 0..n {
                for d in (0..n).filter(|&d| d != s) {
                    let path = cfg.path(s, d);
                    created.0.push(path.clone());
                    if let Some(a) = &armed {
                        a.created(created.0.len());
                    }
                    stop.check()?;
                    Ring::create(&path, &cfg.header(s, d)).map_err(|e| Error::Rendezvous {
                        reason: format!("cannot create {}: {e}", path.display()),
                    })?;
                    #[cfg(test)]
                    super::kill_tests::pause_at("creating", me);
                }
            }
            #[cfg(test)]
            super::kill_tests::pause_at("created", me);
        }
        let populate = should_populate(cfg, free_bytes(&cfg.dir));
        let deadline = Instant::now() + cfg.timeout;
        let mut tx: Vec<Option<Ring>> = (0..n).map(|_| None).collect();
        let mut rx: Vec<Option<Ring>> = (0..n).map(|_| None).collect();
        for p in (0..n).filter(|&p| p != me) {
            cleanup.0.push(cfg.path(me, p));
            cleanup.0.push(cfg.path(p, me));
            tx[p] = Some(open_wait(
                cfg,
                me,
                p,
                Role::Producer,
                deadline,
                populate,
                &stop,
            )?);
            rx[p] = Some(open_wait(
                cfg,
                p,
                me,
                Role::Consumer,
                deadline,
                populate,
                &stop,
            )?);
        }
        // Wait for every peer to claim its ends, then forget the files.
        for p in (0..n).filter(|&p| p != me) {
            for ring in [&tx[p], &rx[p]].into_iter().flatten() {
                loop {
                    stop.check()?;
                    match ring.peer().0 {
                        STATE_EMPTY if Instant::now() >= deadline => {
                            return Err(Error::Timeout {
                                peer: p,
                                op: Op::Connect,
                                after: cfg.timeout,
                            })
                        }
                        STATE_EMPTY => std::thread::sleep(Duration::from_micros(200)),
                        STATE_CLOSED => {
                            return Err(Error::PeerClosed {
                                peer: p,
                                op: Op::Connect,
                            })
                        }
                        _ => break,
                    }
                }
            }
        }
        #[cfg(test)]
        super::kill_tests::pause_at("claimed", me);
        created.0.clear();
        drop(cleanup); // both ends of each of our rings are mapped: unlink their files
        drop(armed);
        Ok(Shm {
            rank: me,
            world_size: n,
            timeout: cfg.timeout,
            max_frame: cfg.max_frame,
            bytes_sent: 0,
            tx,
            rx,
            loopback: VecDeque::new(),
            wait: cfg.wait,
        })
    }
}

/// The setup's view of the signal handler: the count of handled signals when it began.
struct Stop(u64);

impl Stop {
    /// Fails once a SIGTERM or SIGINT was handled since the setup began (its files are gone:
    /// waiting on would only time out).
    fn check(&self) -> Result<()> {
        if signals_seen() != self.0 {
            return Err(Error::Rendezvous {
                reason: "stopped by a signal during the shared-memory setup (its files are \
                         removed)"
                    .into(),
            });
        }
        Ok(())
    }
}

/// Opens one ring, waiting for rank 0 to create it; a stale file (an earlier job's, its end
/// already claimed or of another shape) or one that is not ours (another user's, or not
/// mode 0600) is retried until the deadline.
fn open_wait(
    cfg: &ShmConfig,
    src: usize,
    dst: usize,
    role: Role,
    deadline: Instant,
    populate: bool,
    stop: &Stop,
) -> Result<Ring> {
    let peer = if src == cfg.rank { dst } else { src };
    let path = cfg.path(src, dst);
    let mut last: Option<HeaderError> = None;
    loop {
        stop.check()?;
        match Ring::open(&path, role, &cfg.header(src, dst), populate) {
            Ok(Some(r)) => return Ok(r),
            Ok(None) => {}
            Err(OpenError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(OpenError::Io(e)) => {
                return Err(Error::Io {
                    peer,
                    op: Op::Connect,
                    source: e,
                })
            }
            Err(OpenError::Header(e)) => last = Some(e),
        }
        if Instant::now() >= deadline {
            return Err(match last {
                Some(source) => Error::BadRing { peer, source },
                None => Error::Timeout {
                    peer,
                    op: Op::Connect,
                    after: cfg.timeout,
                },
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A world of `n` ranks in this process (one thread each joins), for tests and benches:
/// a fresh random job token, rings of `ring_bytes`, files in `/dev/shm`.
pub fn local_world(n: usize, ring_bytes: u64) -> Result<Vec<Shm>> {
    local_world_in(n, ring_bytes, Path::new("/dev/shm"))
}

/// [`local_world`] with the ring files in `dir`.
pub fn local_world_in(n: usize, ring_bytes: u64, dir: &Path) -> Result<Vec<Shm>> {
    let job = format!(
        "local-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    );
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let mut cfg = ShmConfig::new(rank, n, job.clone());
                cfg.ring_bytes = ring_bytes;
                cfg.dir = dir.to_path_buf();
                cfg.timeout = Duration::from_secs(20);
                s.spawn(move || {
                    let mut t = Shm::connect(&cfg)?;
                    t.set_timeout(DEFAULT_TIMEOUT);
                    Ok(t)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("shm rank setup panicked"))
            .collect()
    })
}
