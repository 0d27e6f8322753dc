//! The coordinator: admits members through the token handshake, reads their requests (one
//! thread per connection) and forms generations (one "former" thread, which also keeps the
//! timeouts). The rules are in the module doc of [`super`].
//!
//! Every thread changes the shared state under one mutex and wakes the former through a
//! condvar; replies are written after the lock is released, each through its connection's
//! own writer, so a slow member holds up nobody else.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gradwire_transport::tcp::service::{IdentityRefusal, ServiceGate};

use super::message::{decode_request, read_frame, MembershipEvent};
use super::state::{Conn, ConnId, Out, State};
use super::ElasticError;

/// The id the coordinator answers the handshake as ("ELAS").
pub const COORDINATOR_ID: u32 = 0x454C_4153;

/// The handshake role of a member (the only role the coordinator admits).
pub const ROLE_MEMBER: u16 = 1;

/// How long one connection may take for its whole handshake.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

/// How often the accept loop looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// How long writing one reply may block before the member is taken for dead.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a coordinator serves.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// The fewest members a generation may have.
    pub min: usize,
    /// The most members a generation may have.
    pub max: usize,
    /// The members generation 0 waits for.
    pub initial: usize,
    /// The token every member proves (may be empty: then anyone can compute the proof).
    pub token: String,
    /// The job's id; generation `g` runs as `"{job}/g{g}"`.
    pub job: String,
    /// Where the coordinator listens (default `127.0.0.1:0`).
    pub bind: SocketAddr,
    /// The host of every generation's master address (default `127.0.0.1`).
    pub master_host: IpAddr,
    /// How long survivors are awaited after a break, and how long a world short of `min`
    /// waits for joiners (default 30 s).
    pub timeout: Duration,
    /// How long generation 0 waits for `initial` members (default 120 s).
    pub start_timeout: Duration,
}

impl CoordinatorConfig {
    /// A configuration with the defaults: listening on `127.0.0.1:0`, masters on
    /// `127.0.0.1`, 30 s `timeout`, 120 s `start_timeout`.
    pub fn new(
        min: usize,
        max: usize,
        initial: usize,
        token: impl Into<String>,
        job: impl Into<String>,
    ) -> Self {
        CoordinatorConfig {
            min,
            max,
            initial,
            token: token.into(),
            job: job.into(),
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            master_host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(120),
        }
    }

    fn validate(&self) -> Result<(), ElasticError> {
        if !(1 <= self.min && self.min <= self.initial && self.initial <= self.max) {
            return Err(ElasticError::Sizes {
                min: self.min,
                initial: self.initial,
                max: self.max,
            });
        }
        if u32::try_from(self.max).is_err() {
            return Err(ElasticError::TooMany { max: self.max });
        }
        Ok(())
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Every member of the last generation sent `Done`.
    Finished,
    /// The coordinator gave up; the text says why (every waiting member got it too).
    Aborted(String),
}

/// A running coordinator. Dropping it stops accepting and closes every member's
/// connection.
pub struct Coordinator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    former: Option<JoinHandle<()>>,
}

impl Coordinator {
    /// Checks `1 <= min <= initial <= max`, binds `cfg.bind`, and starts accepting members
    /// and forming generations.
    pub fn start(cfg: CoordinatorConfig) -> Result<Coordinator, ElasticError> {
        cfg.validate()?;
        let listener = TcpListener::bind(cfg.bind)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        if cfg.token.is_empty() && !addr.ip().is_loopback() {
            tracing::warn!(%addr, "elastic coordinator: an empty token off loopback admits anyone");
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(Instant::now(), cfg.max)),
            changed: Condvar::new(),
            cfg,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::Builder::new()
                .name("elastic-accept".into())
                .spawn(move || accept_loop(&listener, &shared, &stop))?
        };
        let former = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("elastic-former".into())
                .spawn(move || former_loop(&shared))
        };
        let mut c = Coordinator {
            shared,
            addr,
            stop,
            accept: Some(accept),
            former: None,
        };
        // On failure, `c`'s drop stops the accept thread.
        c.former = Some(former?);
        Ok(c)
    }

    /// The address members connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How the run ended, or `None` while it runs.
    pub fn outcome(&self) -> Option<Outcome> {
        self.shared.lock().outcome()
    }

    /// Waits up to `timeout` for the run to end; `None` if it still runs.
    pub fn wait(&self, timeout: Duration) -> Option<Outcome> {
        let end = Instant::now().checked_add(timeout);
        let mut st = self.shared.lock();
        loop {
            if let Some(o) = st.outcome() {
                return Some(o);
            }
            let left = match end {
                Some(end) => end.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return None;
            }
            st = match self.shared.changed.wait_timeout(st, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// The membership events so far, one per generation formed.
    pub fn events(&self) -> Vec<MembershipEvent> {
        self.shared.lock().events.clone()
    }

    /// The last generation formed (`None` before generation 0).
    pub fn generation(&self) -> Option<u64> {
        self.shared.lock().formed
    }

    /// The last generation's world size (0 before generation 0).
    pub fn world_size(&self) -> usize {
        self.shared.lock().world
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        {
            let mut st = self.shared.lock();
            st.stopping = true;
            for c in st.conns.values() {
                let _ = c.shut.shutdown(Shutdown::Both);
            }
        }
        self.shared.changed.notify_all();
        // The accept loop looks at `stop` every STOP_POLL; the former wakes on the notify.
        // Readers end on the EOF of their shut-down sockets and are left to finish.
        for h in [self.accept.take(), self.former.take()]
            .into_iter()
            .flatten()
        {
            let _ = h.join();
        }
    }
}

/// What the threads share.
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    cfg: CoordinatorConfig,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes each reply through its connection's writer.
fn send(outs: Vec<Out>) {
    for o in outs {
        let mut w = o.to.lock().unwrap_or_else(|p| p.into_inner());
        if w.write_all(&o.frame).is_err() {
            // The reader sees the EOF and reports the member gone.
            let _ = w.shutdown(Shutdown::Both);
        }
    }
}

/// Forms generations whenever the state changes or a timeout comes due, until the
/// coordinator stops.
fn former_loop(shared: &Shared) {
    let mut st = shared.lock();
    loop {
        if st.stopping {
            return;
        }
        let (out, wake) = st.form(&shared.cfg, Instant::now());
        if !out.is_empty() {
            drop(st);
            shared.changed.notify_all();
            send(out);
            st = shared.lock();
            continue;
        }
        shared.changed.notify_all();
        let wait = match wake {
            Some(t) => t.saturating_duration_since(Instant::now()),
            None => Duration::from_secs(3600),
        };
        if wait.is_zero() {
            continue;
        }
        st = match shared.changed.wait_timeout(st, wait) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
    }
}

/// Admits members until `stop`: the handshake through the gate, then one reader thread
/// each.
fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, stop: &AtomicBool) {
    let cap = 2 * shared.cfg.max + 8;
    let token = shared.cfg.token.clone();
    let mut gate =
        match ServiceGate::new(listener, token.as_bytes(), COORDINATOR_ID, HANDSHAKE_LIMIT) {
            Ok(g) => g,
            Err(e) => {
                let out = shared
                    .lock()
                    .abort(format!("the coordinator's listener cannot be polled: {e}"));
                shared.changed.notify_all();
                send(out);
                return;
            }
        };
    while !stop.load(Ordering::SeqCst) {
        let admitted = gate.next(Instant::now() + STOP_POLL, |i| {
            if i.role == ROLE_MEMBER {
                Ok(())
            } else {
                Err(IdentityRefusal::Role { role: i.role })
            }
        });
        let conn = match admitted {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "elastic coordinator: accept failed");
                std::thread::sleep(STOP_POLL);
                continue;
            }
        };
        let stream = conn.stream;
        if let Err(e) = admit(shared, stream, cap) {
            tracing::warn!(error = %e, from = %conn.from, "elastic coordinator: member not admitted");
        }
    }
}

/// Registers an authenticated connection and starts its reader.
fn admit(shared: &Arc<Shared>, stream: TcpStream, cap: usize) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let writer = stream.try_clone()?;
    let shut = stream.try_clone()?;
    let id = {
        let mut st = shared.lock();
        if st.stopping || st.live() >= cap {
            let _ = stream.shutdown(Shutdown::Both);
            return Err(std::io::Error::other(format!(
                "{cap} connections already (or stopping)"
            )));
        }
        let id = st.next_conn;
        st.next_conn += 1;
        st.conns.insert(
            id,
            Conn {
                writer: Arc::new(Mutex::new(writer)),
                shut,
                next: None,
                done: false,
                lost: false,
            },
        );
        id
    };
    let sh = shared.clone();
    let spawned = std::thread::Builder::new()
        .name("elastic-member".into())
        .spawn(move || serve(&sh, id, stream));
    if let Err(e) = spawned {
        let out = shared.lock().gone(id);
        shared.changed.notify_all();
        send(out);
        return Err(e);
    }
    Ok(())
}

/// Reads one member's requests until its connection ends.
fn serve(shared: &Shared, id: ConnId, mut stream: TcpStream) {
    loop {
        let req = read_frame(&mut stream).and_then(|b| decode_request(&b));
        let (out, end) = {
            let mut st = shared.lock();
            match req {
                Ok(r) => {
                    let out = st.request(id, r);
                    let end = st.conns.get(&id).is_none_or(|c| c.lost);
                    (out, end)
                }
                Err(_) => (st.gone(id), true),
            }
        };
        shared.changed.notify_all();
        send(out);
        if end {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_needs_min_below_initial_below_max() {
        let ok = CoordinatorConfig::new(1, 3, 2, "t", "j");
        assert!(ok.validate().is_ok());
        for (min, max, initial) in [(0, 3, 2), (3, 3, 2), (1, 2, 3), (2, 1, 1)] {
            let c = CoordinatorConfig::new(min, max, initial, "t", "j");
            assert!(matches!(
                c.validate(),
                Err(ElasticError::Sizes { .. } | ElasticError::TooMany { .. })
            ));
        }
    }
}
