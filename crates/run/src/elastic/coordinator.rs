//! The coordinator: admits members through the token handshake, reads their requests (one
//! thread per connection) and forms generations (one "former" thread, which also keeps the
//! timeouts). The rules are in the module doc of [`super`].
//!
//! Every thread changes the shared state under one mutex and wakes the former through a
//! condvar; replies are written after the lock is released, each through its connection's
//! own writer, so a slow member holds up nobody else.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gradwire_transport::tcp::service::ServiceGate;

use super::message::{
    decode_request, encode_reply, read_frame, MembershipEvent, Reply, Request, World,
};
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

/// The reason joiners (and late `Next`s) get once every member has finished.
const FINISHED: &str = "the run finished";

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
            return Err(ElasticError::Config(format!(
                "need 1 <= min <= initial <= max, got min {}, initial {}, max {}",
                self.min, self.initial, self.max
            )));
        }
        if u32::try_from(self.max).is_err() {
            return Err(ElasticError::Config(format!(
                "max {} does not fit a rank",
                self.max
            )));
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

type ConnId = u64;

/// A reply to write once the state's lock is released.
struct Out {
    to: Arc<Mutex<TcpStream>>,
    frame: Vec<u8>,
}

fn send(outs: Vec<Out>) {
    for o in outs {
        let mut w = o.to.lock().unwrap_or_else(|p| p.into_inner());
        if w.write_all(&o.frame).is_err() {
            // The reader sees the EOF and reports the member gone.
            let _ = w.shutdown(Shutdown::Both);
        }
    }
}

/// A `Next` awaiting its world.
struct NextReq {
    commits: Vec<u64>,
    reached: u64,
    /// Arrival order among all `Next`s.
    seq: u64,
}

/// One admitted connection.
struct Conn {
    writer: Arc<Mutex<TcpStream>>,
    /// A handle to shut the socket down without waiting on a writer.
    shut: TcpStream,
    next: Option<NextReq>,
    done: bool,
    /// Closed, sent garbage, or evicted: it takes no further part.
    lost: bool,
}

enum Phase {
    /// Waiting for `initial` members.
    Starting { since: Instant },
    /// Generation `gen` trains; `members[r]` is rank `r`.
    Running { gen: u64, members: Vec<ConnId> },
    /// Generation `gen` broke; its survivors are being gathered.
    Broken {
        gen: u64,
        members: Vec<ConnId>,
        detected: Instant,
        detected_unix: f64,
        /// Since when the survivors and joiners have been short of `min`.
        short_since: Option<Instant>,
    },
    /// The run ended.
    Over(Outcome),
}

impl Phase {
    fn members(&self) -> &[ConnId] {
        match self {
            Phase::Running { members, .. } | Phase::Broken { members, .. } => members,
            Phase::Starting { .. } | Phase::Over(_) => &[],
        }
    }
}

struct State {
    conns: HashMap<ConnId, Conn>,
    phase: Phase,
    events: Vec<MembershipEvent>,
    next_conn: ConnId,
    next_seq: u64,
    formed: Option<u64>,
    world: usize,
    /// The configuration's `max`.
    max: usize,
    stopping: bool,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn reply_to(c: &Conn, r: &Reply) -> Out {
    Out {
        to: c.writer.clone(),
        frame: encode_reply(r),
    }
}

/// The largest step in every set (`None` if there is none, or no set).
fn common_step(sets: &[&[u64]]) -> Option<u64> {
    let (first, rest) = sets.split_first()?;
    let rest: Vec<HashSet<u64>> = rest.iter().map(|s| s.iter().copied().collect()).collect();
    first
        .iter()
        .copied()
        .filter(|s| rest.iter().all(|r| r.contains(s)))
        .max()
}

impl State {
    fn new(now: Instant, max: usize) -> State {
        State {
            conns: HashMap::new(),
            phase: Phase::Starting { since: now },
            events: Vec::new(),
            next_conn: 0,
            next_seq: 0,
            formed: None,
            world: 0,
            max,
            stopping: false,
        }
    }

    fn outcome(&self) -> Option<Outcome> {
        match &self.phase {
            Phase::Over(o) => Some(o.clone()),
            _ => None,
        }
    }

    fn live(&self) -> usize {
        self.conns.values().filter(|c| !c.lost).count()
    }

    /// A request from connection `id`.
    fn request(&mut self, id: ConnId, req: Request) -> Vec<Out> {
        let pending = self.pending_answer();
        let Some(c) = self.conns.get_mut(&id) else {
            return Vec::new();
        };
        if c.lost {
            return Vec::new();
        }
        if c.next.is_some() {
            // A second request while its `Next` is outstanding breaks the protocol.
            return self.gone(id);
        }
        let r = match req {
            Request::Next { commits, reached } => {
                if let Phase::Over(o) = &self.phase {
                    let why = match o {
                        Outcome::Finished => FINISHED.to_string(),
                        Outcome::Aborted(why) => why.clone(),
                    };
                    return vec![reply_to(c, &Reply::Abort(why))];
                }
                c.next = Some(NextReq {
                    commits,
                    reached,
                    seq: self.next_seq,
                });
                self.next_seq += 1;
                if matches!(&self.phase, Phase::Running { members, .. } if members.contains(&id)) {
                    self.break_generation();
                }
                return Vec::new();
            }
            Request::Pending => Reply::Pending(pending),
            Request::Resumed { generation, unix_s } => {
                if let Some(e) = self.events.iter_mut().find(|e| e.generation == generation) {
                    e.resumed_unix_s = Some(unix_s);
                }
                Reply::Ack
            }
            Request::Done => {
                c.done = true;
                Reply::Ack
            }
            Request::Events => Reply::Events(self.events.clone()),
        };
        match self.conns.get(&id) {
            Some(c) => vec![reply_to(c, &r)],
            None => Vec::new(),
        }
    }

    /// Whether a joiner waits with room for it.
    fn pending_answer(&self) -> bool {
        let running = matches!(self.phase, Phase::Running { .. } | Phase::Broken { .. });
        running && self.world < self.max && !self.joiners().is_empty()
    }

    /// Connection `id` closed, sent garbage, or broke the protocol.
    fn gone(&mut self, id: ConnId) -> Vec<Out> {
        let Some(c) = self.conns.get_mut(&id) else {
            return Vec::new();
        };
        if c.lost {
            return Vec::new();
        }
        c.lost = true;
        c.next = None;
        let _ = c.shut.shutdown(Shutdown::Both);
        let done = c.done;
        let member = self.phase.members().contains(&id);
        if member && !done && matches!(self.phase, Phase::Running { .. }) {
            self.break_generation();
        }
        if !member {
            self.conns.remove(&id);
        }
        Vec::new()
    }

    fn break_generation(&mut self) {
        if let Phase::Running { gen, members } = &mut self.phase {
            self.phase = Phase::Broken {
                gen: *gen,
                members: std::mem::take(members),
                detected: Instant::now(),
                detected_unix: unix_now(),
                short_since: None,
            };
        }
    }

    /// Live connections waiting for a world outside the current generation, in arrival
    /// order.
    fn joiners(&self) -> Vec<ConnId> {
        let members = self.phase.members();
        let mut j: Vec<(u64, ConnId)> = self
            .conns
            .iter()
            .filter(|(id, c)| !c.lost && !members.contains(id))
            .filter_map(|(id, c)| c.next.as_ref().map(|n| (n.seq, *id)))
            .collect();
        j.sort_unstable();
        j.into_iter().map(|(_, id)| id).collect()
    }

    /// Ends the run: every waiting connection gets `Abort(reason)`.
    fn abort(&mut self, reason: String) -> Vec<Out> {
        tracing::warn!(%reason, "elastic coordinator: aborting the run");
        let mut out = Vec::new();
        for c in self.conns.values_mut() {
            if c.next.take().is_some() && !c.lost {
                out.push(reply_to(c, &Reply::Abort(reason.clone())));
            }
        }
        self.phase = Phase::Over(Outcome::Aborted(reason));
        out
    }

    fn finish(&mut self) -> Vec<Out> {
        let mut out = Vec::new();
        for id in self.joiners() {
            if let Some(c) = self.conns.get_mut(&id) {
                c.next = None;
                out.push(reply_to(c, &Reply::Abort(FINISHED.into())));
            }
        }
        self.phase = Phase::Over(Outcome::Finished);
        out
    }

    /// Applies the formation rules at `now`: what to send, and when to look again at the
    /// latest (`None`: only when something changes).
    fn form(&mut self, cfg: &CoordinatorConfig, now: Instant) -> (Vec<Out>, Option<Instant>) {
        match &self.phase {
            Phase::Over(_) => (Vec::new(), None),
            Phase::Starting { since } => {
                let deadline = *since + cfg.start_timeout;
                let waiting = self.joiners();
                if waiting.len() >= cfg.initial {
                    let ids = waiting[..cfg.initial].to_vec();
                    (self.form_generation(cfg, Formation::start(ids)), None)
                } else if now >= deadline {
                    if waiting.len() >= cfg.min {
                        (self.form_generation(cfg, Formation::start(waiting)), None)
                    } else {
                        let why = format!(
                            "only {} of the {} members needed to start (at least {}) came within \
                             {:?}",
                            waiting.len(),
                            cfg.initial,
                            cfg.min,
                            cfg.start_timeout
                        );
                        (self.abort(why), None)
                    }
                } else {
                    (Vec::new(), Some(deadline))
                }
            }
            Phase::Running { members, .. } => {
                let all_done = members
                    .iter()
                    .all(|m| self.conns.get(m).is_some_and(|c| c.done));
                if all_done {
                    (self.finish(), None)
                } else {
                    (Vec::new(), None)
                }
            }
            Phase::Broken {
                gen,
                members,
                detected,
                detected_unix,
                short_since,
            } => {
                let (gen, members, detected, detected_unix, short_since) = (
                    *gen,
                    members.clone(),
                    *detected,
                    *detected_unix,
                    *short_since,
                );
                self.form_after_break(
                    cfg,
                    now,
                    Broken {
                        gen,
                        members,
                        detected,
                        detected_unix,
                        short_since,
                    },
                )
            }
        }
    }

    fn form_after_break(
        &mut self,
        cfg: &CoordinatorConfig,
        now: Instant,
        b: Broken,
    ) -> (Vec<Out>, Option<Instant>) {
        let live: Vec<ConnId> = b
            .members
            .iter()
            .copied()
            .filter(|m| self.conns.get(m).is_some_and(|c| !c.lost))
            .collect();
        // Every live member finished (another was lost after its last step): the run is over.
        if !live.is_empty()
            && live.iter().all(|m| {
                self.conns
                    .get(m)
                    .is_some_and(|c| c.done && c.next.is_none())
            })
        {
            return (self.finish(), None);
        }
        let awaited: Vec<ConnId> = live
            .iter()
            .copied()
            .filter(|m| self.conns.get(m).is_some_and(|c| c.next.is_none()))
            .collect();
        if !awaited.is_empty() {
            let deadline = b.detected + cfg.timeout;
            if now < deadline {
                return (Vec::new(), Some(deadline));
            }
            for id in awaited {
                if let Some(c) = self.conns.get_mut(&id) {
                    tracing::warn!(
                        generation = b.gen,
                        "elastic coordinator: evicting a member that did not ask for the next \
                         world within {:?}",
                        cfg.timeout
                    );
                    c.lost = true;
                    let _ = c.shut.shutdown(Shutdown::Both);
                }
            }
        }
        let survivors: Vec<ConnId> = b
            .members
            .iter()
            .copied()
            .filter(|m| {
                self.conns
                    .get(m)
                    .is_some_and(|c| !c.lost && c.next.is_some())
            })
            .collect();
        if survivors.is_empty() {
            let why = format!("every member of generation {} was lost", b.gen);
            return (self.abort(why), None);
        }
        let commits: Vec<&[u64]> = survivors
            .iter()
            .filter_map(|m| self.conns.get(m)?.next.as_ref())
            .map(|n| n.commits.as_slice())
            .collect();
        let reached = survivors
            .iter()
            .filter_map(|m| self.conns.get(m)?.next.as_ref())
            .map(|n| n.reached)
            .max()
            .unwrap_or(0);
        let Some(restore) = common_step(&commits) else {
            let why = format!(
                "the {} survivors of generation {} hold no commit in common",
                survivors.len(),
                b.gen
            );
            return (self.abort(why), None);
        };
        let room = cfg.max.saturating_sub(survivors.len());
        let admitted: Vec<ConnId> = self.joiners().into_iter().take(room).collect();
        if survivors.len() + admitted.len() < cfg.min {
            let since = b.short_since.unwrap_or(now);
            if let Phase::Broken { short_since, .. } = &mut self.phase {
                *short_since = Some(since);
            }
            let deadline = since + cfg.timeout;
            if now >= deadline {
                let why = format!(
                    "{} members left after generation {} broke, below the minimum {}, and no \
                     new member came within {:?}",
                    survivors.len() + admitted.len(),
                    b.gen,
                    cfg.min,
                    cfg.timeout
                );
                return (self.abort(why), None);
            }
            return (Vec::new(), Some(deadline));
        }
        let lost_ranks = b
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| !survivors.contains(m))
            .map(|(r, _)| r as u32)
            .collect();
        let n_survivors = survivors.len();
        let mut ids = survivors;
        ids.extend(admitted);
        let f = Formation {
            gen: b.gen + 1,
            ids,
            survivors: n_survivors,
            restore: Some(restore),
            lost_ranks,
            reached,
            detected_unix: b.detected_unix,
            world_before: b.members.len(),
        };
        (self.form_generation(cfg, f), None)
    }

    /// Forms generation `f.gen`: a master address, a world for each of its members, an
    /// event.
    fn form_generation(&mut self, cfg: &CoordinatorConfig, f: Formation) -> Vec<Out> {
        let master = match TcpListener::bind((cfg.master_host, 0)).and_then(|l| l.local_addr()) {
            Ok(a) => a,
            Err(e) => {
                let why = format!(
                    "no free port on {} for generation {}'s master: {e}",
                    cfg.master_host, f.gen
                );
                return self.abort(why);
            }
        };
        let job = format!("{}/g{}", cfg.job, f.gen);
        let size = f.ids.len() as u32;
        let mut out = Vec::with_capacity(f.ids.len());
        for (rank, id) in f.ids.iter().enumerate() {
            if let Some(c) = self.conns.get_mut(id) {
                c.next = None;
                c.done = false;
                let w = World {
                    generation: f.gen,
                    rank: rank as u32,
                    world_size: size,
                    master: master.to_string(),
                    job: job.clone(),
                    restore_step: f.restore,
                    survivors: f.survivors as u32,
                };
                out.push(reply_to(c, &Reply::World(w)));
            }
        }
        let joined = f.ids.len() - f.survivors;
        let kind = match (f.gen == 0, f.lost_ranks.is_empty(), joined > 0) {
            (true, _, _) => "start",
            (false, false, true) => "lost+joined",
            (false, false, false) => "lost",
            (false, true, _) => "joined",
        };
        let now = unix_now();
        let restore = f.restore.unwrap_or(0);
        self.events.push(MembershipEvent {
            generation: f.gen,
            kind: kind.into(),
            world_size_before: f.world_before as u32,
            world_size_after: size,
            lost_ranks: f.lost_ranks,
            joined: joined as u32,
            restore_step: f.restore,
            reached_step: f.reached,
            steps_lost: f.reached.saturating_sub(restore),
            detected_unix_s: if f.gen == 0 { now } else { f.detected_unix },
            formed_unix_s: now,
            resumed_unix_s: None,
        });
        tracing::info!(
            generation = f.gen,
            world_size = size,
            kind,
            %master,
            "elastic coordinator: formed a generation"
        );
        // The lost connections of the broken generation are no longer referenced.
        self.conns.retain(|_, c| !c.lost);
        self.phase = Phase::Running {
            gen: f.gen,
            members: f.ids,
        };
        self.formed = Some(f.gen);
        self.world = size as usize;
        out
    }
}

/// A broken generation's facts, copied out of the phase.
struct Broken {
    gen: u64,
    members: Vec<ConnId>,
    detected: Instant,
    detected_unix: f64,
    short_since: Option<Instant>,
}

/// What forms a generation.
struct Formation {
    gen: u64,
    /// Its members by rank.
    ids: Vec<ConnId>,
    /// How many of `ids` (the first) are survivors.
    survivors: usize,
    restore: Option<u64>,
    lost_ranks: Vec<u32>,
    reached: u64,
    detected_unix: f64,
    world_before: usize,
}

impl Formation {
    fn start(ids: Vec<ConnId>) -> Formation {
        Formation {
            gen: 0,
            ids,
            survivors: 0,
            restore: None,
            lost_ranks: Vec::new(),
            reached: 0,
            detected_unix: 0.0,
            world_before: 0,
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
                Err(format!("role {} is not a member", i.role))
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
    fn the_common_step_is_the_largest_in_every_set() {
        assert_eq!(common_step(&[&[10, 20], &[20, 30]]), Some(20));
        assert_eq!(
            common_step(&[&[10, 20, 30], &[30, 20], &[20, 30, 40]]),
            Some(30)
        );
        assert_eq!(common_step(&[&[10], &[20]]), None);
        assert_eq!(common_step(&[&[5, 7]]), Some(7));
        assert_eq!(common_step(&[]), None);
        assert_eq!(common_step(&[&[], &[1]]), None);
    }

    #[test]
    fn the_config_needs_min_below_initial_below_max() {
        let ok = CoordinatorConfig::new(1, 3, 2, "t", "j");
        assert!(ok.validate().is_ok());
        for (min, max, initial) in [(0, 3, 2), (3, 3, 2), (1, 2, 3), (2, 1, 1)] {
            let c = CoordinatorConfig::new(min, max, initial, "t", "j");
            assert!(matches!(c.validate(), Err(ElasticError::Config(_))));
        }
    }
}
