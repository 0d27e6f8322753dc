//! Ring files a rank must not leave behind when it is stopped during setup, and the removal
//! of a whole job's files by its launcher.
//!
//! Ring files exist in the ring directory (`/dev/shm`: memory) only during setup: rank 0
//! creates them, and each pair's files are unlinked once both ends have mapped them. A rank
//! stopped in between would leave them there. Two things close that window by construction:
//! - While a rank sets up, its files are *armed* ([`Armed`]): on SIGTERM or SIGINT a handler
//!   unlinks every armed file, then the signal does what it did before (ends the process when
//!   that was the default; a handler the application installed before is called too, through
//!   `signal-hook`'s chaining, and then the setup fails at once instead of waiting). A signal
//!   the process ignores stays ignored, and gets no handler. The handler is installed on the
//!   first setup and stays (doing nothing more than the default once no file is armed).
//! - A rank killed outright (SIGKILL) runs no handler: its launcher removes the job's files
//!   once its ranks have exited ([`remove_files_of`]; `gradwire launch` does).
//!
//! The handler only calls `unlink(2)` and atomics: armed files are kept as a plan (the path
//! prefix, the ranks, how far rank 0 got) from which it writes each path into a buffer on
//! its stack, so it never allocates or locks.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Once;

use super::ShmConfig;

/// Most setups armed at once in one process (further ones run unarmed, with a debug line).
const SLOTS: usize = 64;

/// Longest path the handler writes (Linux's `PATH_MAX`).
const PATH_MAX: usize = 4096;

/// What one setup may have in the ring directory.
struct Plan {
    /// `<dir>/gradwire-<group>-<job>`: every ring file's path, less `-<src>-<dst>`.
    prefix: Vec<u8>,
    /// This rank.
    me: usize,
    /// Ranks in the job.
    n: usize,
    /// Whether this rank creates the files (rank 0: every pair's).
    creator: bool,
    /// For the creator: how many files (in creation order) exist or are being made.
    created: AtomicUsize,
    /// This process, whose id names the creator's temporary files.
    pid: u32,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: AtomicPtr<Plan> = AtomicPtr::new(std::ptr::null_mut());
static PLANS: [AtomicPtr<Plan>; SLOTS] = [EMPTY; SLOTS];
/// Handlers running now (a plan is freed only when none is).
static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);
/// Signals handled so far: a setup that sees it move was interrupted.
static SIGNALS: AtomicU64 = AtomicU64::new(0);
/// Whether SIGTERM's and SIGINT's dispositions were the default when the handler went in.
static TERM_WAS_DEFAULT: AtomicBool = AtomicBool::new(false);
static INT_WAS_DEFAULT: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// The signals handled so far by this module's handler; a setup compares it before and
/// after to learn that it was stopped.
pub(crate) fn signals_seen() -> u64 {
    SIGNALS.load(Ordering::SeqCst)
}

/// A setup's files, removed by the handler while this lives (disarmed on drop).
pub(crate) struct Armed {
    slot: Option<usize>,
}

impl Armed {
    /// Arms the files of rank `me` of `cfg`'s job: every pair's for the creator (as far as
    /// [`Armed::created`] says), this rank's own pairs otherwise.
    pub(crate) fn arm(cfg: &ShmConfig, me: usize, creator: bool) -> Armed {
        install();
        let prefix = cfg.path_prefix().as_os_str().as_bytes().to_vec();
        let plan = Box::into_raw(Box::new(Plan {
            prefix,
            me,
            n: cfg.world_size,
            creator,
            created: AtomicUsize::new(0),
            pid: std::process::id(),
        }));
        for (i, slot) in PLANS.iter().enumerate() {
            if slot
                .compare_exchange(
                    std::ptr::null_mut(),
                    plan,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
            {
                return Armed { slot: Some(i) };
            }
        }
        // SAFETY: `plan` came from `Box::into_raw` above and was published nowhere.
        drop(unsafe { Box::from_raw(plan) });
        tracing::debug!("{SLOTS} shared-memory setups armed at once: this one runs unarmed");
        Armed { slot: None }
    }

    /// The creator made (or is making) the first `count` files in creation order.
    pub(crate) fn created(&self, count: usize) {
        if let Some(i) = self.slot {
            let p = PLANS[i].load(Ordering::SeqCst);
            // SAFETY: only `drop` takes the plan out of its slot, and it needs `&mut self`.
            if let Some(plan) = unsafe { p.as_ref() } {
                plan.created.store(count, Ordering::SeqCst);
            }
        }
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        let Some(i) = self.slot else { return };
        let p = PLANS[i].swap(std::ptr::null_mut(), Ordering::SeqCst);
        // A handler that loaded the plan before the swap counted itself in before it did.
        while IN_HANDLER.load(Ordering::SeqCst) != 0 {
            std::hint::spin_loop();
        }
        if !p.is_null() {
            // SAFETY: `p` came from `Box::into_raw` in `arm`; it is out of its slot and no
            // handler holds it any more.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

/// The pair of ranks of the creator's `k`-th file (rank 0 creates them source by source,
/// destinations in order, skipping the source).
fn pair(k: usize, n: usize) -> (usize, usize) {
    let per = n - 1;
    let (s, j) = (k / per, k % per);
    (s, if j < s { j } else { j + 1 })
}

/// Writes `v` in decimal at `buf[at..]`; the new end, or `None` when it does not fit.
fn put_num(buf: &mut [u8], at: usize, mut v: u64) -> Option<usize> {
    let mut digits = [0u8; 20];
    let mut k = digits.len();
    loop {
        k -= 1;
        digits[k] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    put(buf, at, &digits[k..])
}

/// Writes `bytes` at `buf[at..]`; the new end, or `None` when they do not fit.
fn put(buf: &mut [u8], at: usize, bytes: &[u8]) -> Option<usize> {
    let end = at.checked_add(bytes.len())?;
    buf.get_mut(at..end)?.copy_from_slice(bytes);
    Some(end)
}

/// Unlinks the ring file of pair (`s`, `d`), and with `tmp` the creator's temporary one.
/// Only `unlink(2)` and stack memory: async-signal-safe.
fn unlink_pair(plan: &Plan, s: usize, d: usize, tmp: bool) {
    let mut buf = [0u8; PATH_MAX];
    let Some(end) = (|| {
        let at = put(&mut buf, 0, &plan.prefix)?;
        let at = put(&mut buf, at, b"-")?;
        let at = put_num(&mut buf, at, s as u64)?;
        let at = put(&mut buf, at, b"-")?;
        put_num(&mut buf, at, d as u64)
    })() else {
        return;
    };
    if put(&mut buf, end, b"\0").is_some() {
        // SAFETY: `buf` holds a NUL-terminated path; unlink only reads it.
        unsafe { libc::unlink(buf.as_ptr().cast()) };
    }
    if tmp {
        let Some(at) =
            put(&mut buf, end, b".tmp").and_then(|at| put_num(&mut buf, at, plan.pid.into()))
        else {
            return;
        };
        if put(&mut buf, at, b"\0").is_some() {
            // SAFETY: as above.
            unsafe { libc::unlink(buf.as_ptr().cast()) };
        }
    }
}

/// Unlinks every file a plan may have made.
fn unlink_plan(plan: &Plan) {
    if plan.n < 2 {
        return;
    }
    if plan.creator {
        let total = plan.n * (plan.n - 1);
        let upto = plan.created.load(Ordering::SeqCst).min(total);
        for k in 0..upto {
            let (s, d) = pair(k, plan.n);
            unlink_pair(plan, s, d, true);
        }
    }
    for p in (0..plan.n).filter(|&p| p != plan.me) {
        unlink_pair(plan, plan.me, p, false);
        unlink_pair(plan, p, plan.me, false);
    }
}

/// The handler's action for `sig`.
fn on_signal(sig: libc::c_int) {
    IN_HANDLER.fetch_add(1, Ordering::SeqCst);
    for slot in &PLANS {
        let p = slot.load(Ordering::SeqCst);
        // SAFETY: a plan in its slot is alive until `Armed::drop` has taken it out and seen
        // no handler running; we counted ourselves in before loading it.
        if let Some(plan) = unsafe { p.as_ref() } {
            unlink_plan(plan);
        }
    }
    IN_HANDLER.fetch_sub(1, Ordering::SeqCst);
    SIGNALS.fetch_add(1, Ordering::SeqCst);
    let was_default = match sig {
        libc::SIGTERM => TERM_WAS_DEFAULT.load(Ordering::SeqCst),
        _ => INT_WAS_DEFAULT.load(Ordering::SeqCst),
    };
    if was_default {
        // Resets the default disposition and raises the signal again: the process ends by
        // it, as it would have without us.
        let _ = signal_hook::low_level::emulate_default_handler(sig);
    }
}

/// Installs the handler for SIGTERM and SIGINT, once per process, on each that the process
/// does not ignore.
fn install() {
    INSTALL.call_once(|| {
        for (sig, was_default) in [
            (libc::SIGTERM, &TERM_WAS_DEFAULT),
            (libc::SIGINT, &INT_WAS_DEFAULT),
        ] {
            // SAFETY: a zeroed sigaction is a valid out-parameter; a null new action only
            // reads the current one.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
                continue;
            }
            if old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            was_default.store(old.sa_sigaction == libc::SIG_DFL, Ordering::SeqCst);
            // SAFETY: `on_signal` only unlinks, uses atomics and stack buffers, and ends with
            // signal-hook's async-signal-safe default emulation: it is fit for a handler.
            if let Err(e) = unsafe { signal_hook::low_level::register(sig, move || on_signal(sig)) }
            {
                tracing::debug!("cannot handle signal {sig}: {e}");
            }
        }
    });
}

/// Removes every file of `cfg`'s job (and of the jobs derived from it, such as a host's) in
/// its ring directory that this user owns: rings, and half-made ones. A launcher calls it
/// once its ranks have exited, so a rank killed outright during setup leaves nothing behind
/// (the files of a job whose ranks still run must not be removed: their setup would fail).
/// Returns how many files it removed.
pub fn remove_files_of(cfg: &ShmConfig) -> std::io::Result<usize> {
    use std::os::unix::fs::MetadataExt;
    let prefix = cfg.file_prefix();
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut removed = 0;
    for entry in std::fs::read_dir(&cfg.dir)? {
        let entry = entry?;
        if !entry.file_name().as_bytes().starts_with(prefix.as_bytes()) {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.file_type().is_file() && meta.uid() == me && remove(&path) {
            removed += 1;
        }
    }
    Ok(removed)
}

fn remove(path: &Path) -> bool {
    std::fs::remove_file(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_follow_the_creation_order() {
        let n = 4;
        let mut want = Vec::new();
        for s in 0..n {
            for d in (0..n).filter(|&d| d != s) {
                want.push((s, d));
            }
        }
        let got: Vec<_> = (0..n * (n - 1)).map(|k| pair(k, n)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn paths_are_written_without_allocating_and_never_overflow() {
        let mut buf = [0u8; 16];
        let at = put(&mut buf, 0, b"abc-").unwrap();
        let at = put_num(&mut buf, at, 1207).unwrap();
        assert_eq!(&buf[..at], b"abc-1207");
        assert_eq!(put_num(&mut buf, at, u64::MAX), None);
        assert_eq!(put(&mut buf, 15, b"xy"), None);
        assert_eq!(put(&mut buf, usize::MAX, b"x"), None);
        let at = put_num(&mut buf, 0, 0).unwrap();
        assert_eq!(&buf[..at], b"0");
    }

    /// The plan unlinks exactly the files the setup made: the creator's as far as it got
    /// (with the temporary one in progress), and a rank's own pairs; nobody else's.
    #[test]
    fn a_plan_unlinks_its_files_and_no_others() {
        let dir = std::env::temp_dir().join(format!("gw-plan-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cfg = ShmConfig::new(0, 3, "plan");
        cfg.dir = dir.clone();
        let touch = |p: &Path| std::fs::write(p, b"x").unwrap();
        for s in 0..3 {
            for d in (0..3).filter(|&d| d != s) {
                touch(&cfg.path(s, d));
            }
        }
        let tmp = cfg
            .path(1, 0)
            .with_extension(format!("tmp{}", std::process::id()));
        touch(&tmp);
        let other = dir.join("gradwire-someone-else-0-1");
        touch(&other);
        // Rank 0 got as far as the third file (1, 0), being made under its temporary name.
        let plan = Plan {
            prefix: cfg.path_prefix().as_os_str().as_bytes().to_vec(),
            me: 0,
            n: 3,
            creator: true,
            created: AtomicUsize::new(3),
            pid: std::process::id(),
        };
        unlink_plan(&plan);
        let left = |p: &Path| p.exists();
        assert!(!left(&tmp));
        for (s, d) in [(0, 1), (0, 2), (1, 0), (2, 0)] {
            assert!(!left(&cfg.path(s, d)), "{s}->{d}");
        }
        // Pairs between ranks 1 and 2 were not made yet in its plan, nor are they its own.
        assert!(left(&cfg.path(1, 2)) && left(&cfg.path(2, 1)));
        // Rank 2's plan: its own pairs.
        let plan2 = Plan {
            me: 2,
            creator: false,
            ..plan
        };
        unlink_plan(&plan2);
        assert!(!left(&cfg.path(1, 2)) && !left(&cfg.path(2, 1)));
        assert!(left(&other));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_launcher_removes_its_jobs_files_only() {
        let dir = std::env::temp_dir().join(format!("gw-rm-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cfg = ShmConfig::new(0, 2, "tok@127.0.0.1:1#gradwire:abc");
        cfg.dir = dir.clone();
        let mut host = cfg.clone();
        host.job = format!("{}/host:a", cfg.job);
        let mut other = cfg.clone();
        other.job = "tok@127.0.0.1:1#gradwire:def".into();
        for c in [&cfg, &host, &other] {
            std::fs::write(c.path(0, 1), b"x").unwrap();
            std::fs::write(c.path(1, 0).with_extension("tmp7"), b"x").unwrap();
        }
        std::os::unix::fs::symlink("/etc/passwd", dir.join(format!("{}x", cfg.file_prefix())))
            .unwrap();
        assert_eq!(remove_files_of(&cfg).unwrap(), 4);
        assert!(other.path(0, 1).exists());
        assert!(std::fs::symlink_metadata(dir.join(format!("{}x", cfg.file_prefix()))).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
