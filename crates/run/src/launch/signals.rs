//! SIGTERM and SIGINT while ranks run: noted by handlers, passed on by the wait loops to the
//! ranks' process groups (see the [module doc](super#signals)).

use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// How long ranks get to end after a SIGTERM before they are killed.
pub const GRACE: Duration = Duration::from_secs(3);

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

/// The handlers, installed on the first call (the first spawn).
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

/// The SIGTERM or SIGINT noted since the last call, if any (taken: a second call returns
/// `None` until another arrives).
pub(super) fn take_pending() -> Option<i32> {
    match signals().pending.swap(0, Ordering::SeqCst) as i32 {
        0 => None,
        sig => Some(sig),
    }
}

/// One live set of ranks, while it lives: while any lives, a signal is noted instead of
/// ending the process.
pub(super) struct Live(());

impl Live {
    /// Counts one more live set of ranks (installs the handlers on the first call).
    pub(super) fn new() -> Live {
        let s = signals();
        let mut n = s.live.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        s.idle.store(false, Ordering::SeqCst);
        Live(())
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

/// Sends `sig` to a rank's whole process group (the rank and whatever it started).
pub(super) fn signal_group(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on the process group of a child we spawned (it called setpgid(0, 0))
    // and have not reaped, so the group id is still ours.
    unsafe { libc::kill(-(child.id() as libc::pid_t), sig) };
}
