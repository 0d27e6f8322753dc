//! A running set of ranks: waiting for them, stopping them, cleaning up after them.

use std::process::{Child, ExitStatus};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gradwire_transport::shm::{self, ShmConfig};

use super::signals::{self, signal_group, Live, GRACE};
use super::{LaunchError, Stopped};

/// Ranks started by [`spawn`](super::spawn) and its kin; dropping it kills those still
/// running (and removes the shared-memory files they left).
pub struct Ranks {
    /// Each rank's process, `None` once reaped.
    pub(super) children: Vec<Option<Child>>,
    /// The threads copying the ranks' prefixed output.
    pub(super) pumps: Vec<JoinHandle<()>>,
    /// Rank 0's standard output, when captured ([`spawn_capturing`](super::spawn_capturing)).
    pub captured: Option<JoinHandle<String>>,
    /// The ranks' shared-memory settings, whose files are removed once they have exited.
    rings: Option<ShmConfig>,
    /// The signal passed on to the ranks, and when (they get [`GRACE`]).
    forwarded: Option<(i32, Instant)>,
    /// Counted among the live sets of ranks (signals are noted, not fatal, while it lives).
    _live: Live,
}

/// How a set of ranks ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The first rank that failed and how, if any.
    pub failure: Option<(usize, ExitStatus)>,
    /// The SIGTERM or SIGINT the launcher got and passed on to the ranks, if any.
    pub signal: Option<i32>,
}

impl Ranks {
    /// No ranks yet, counted live; `rings`: the shared-memory settings whose files are
    /// removed once the ranks have exited.
    pub(super) fn new(rings: Option<ShmConfig>) -> Ranks {
        Ranks {
            children: Vec::new(),
            pumps: Vec::new(),
            captured: None,
            rings,
            forwarded: None,
            _live: Live::new(),
        }
    }

    /// Waits for every rank; on the first failure stops the others (SIGTERM, then SIGKILL
    /// after [`GRACE`]) and reports that rank. A SIGTERM or SIGINT to this process is passed
    /// on to the ranks (see the [module doc](super#signals)). Then removes the job's leftover
    /// shared-memory files.
    pub fn wait(mut self) -> Result<Outcome, LaunchError> {
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
    pub fn wait_all(mut self) -> Result<Vec<ExitStatus>, LaunchError> {
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
    /// (`Some(Ok)`: finished, `Some(Err(why))`: stopped; it is called with how long it may
    /// block), after which the processes get [`GRACE`] to exit before they are killed.
    /// Signals are passed on as by [`Ranks::wait`]; once every process has ended after one,
    /// the outcome is [`Stopped::Signal`]. Returns the outcome.
    pub fn wait_elastic(
        mut self,
        outcome: impl Fn(Duration) -> Option<Result<(), Stopped>>,
    ) -> Result<Result<(), Stopped>, LaunchError> {
        let result = loop {
            self.pass_on_signals();
            self.reap()?;
            if let Some(sig) = self.forwarded.map(|(sig, _)| sig) {
                if self.children.iter().all(Option::is_none) {
                    break Err(Stopped::Signal(sig));
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
        for mut c in self.children.iter_mut().filter_map(Option::take) {
            signal_group(&c, libc::SIGKILL);
            let _ = c.wait();
        }
        self.finish();
        Ok(result)
    }

    /// The ranks that have exited since the last call, with their statuses (their slots
    /// emptied).
    fn reap(&mut self) -> Result<Vec<(usize, ExitStatus)>, LaunchError> {
        let mut out = Vec::new();
        for (rank, slot) in self.children.iter_mut().enumerate() {
            let Some(child) = slot.as_mut() else {
                continue;
            };
            if let Some(status) = child
                .try_wait()
                .map_err(|source| LaunchError::Wait { rank, source })?
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
        if let Some(sig) = signals::take_pending() {
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

    /// Stops every rank still running: SIGTERM to each, then SIGKILL to those still running
    /// after [`GRACE`].
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
