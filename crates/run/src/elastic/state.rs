//! The coordinator's state and its formation rules (the module doc of [`super`] states
//! them): what each admitted connection asked for, which generation runs, and what to
//! answer. The threads of [`super::coordinator`] change it under one lock and write the
//! replies it returns once the lock is released.

use std::collections::{HashMap, HashSet};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::coordinator::{CoordinatorConfig, Outcome};
use super::message::{encode_reply, MembershipEvent, Reply, Request, World};

/// The reason joiners (and late `Next`s) get once every member has finished.
const FINISHED: &str = "the run finished";

/// An admitted connection's id.
pub(super) type ConnId = u64;

/// A reply to write once the state's lock is released.
pub(super) struct Out {
    pub(super) to: Arc<Mutex<TcpStream>>,
    pub(super) frame: Vec<u8>,
}

/// A `Next` awaiting its world.
pub(super) struct NextReq {
    commits: Vec<u64>,
    reached: u64,
    /// Arrival order among all `Next`s.
    seq: u64,
}

/// One admitted connection.
pub(super) struct Conn {
    pub(super) writer: Arc<Mutex<TcpStream>>,
    /// A handle to shut the socket down without waiting on a writer.
    pub(super) shut: TcpStream,
    pub(super) next: Option<NextReq>,
    pub(super) done: bool,
    /// Closed, sent garbage, or evicted: it takes no further part.
    pub(super) lost: bool,
}

pub(super) enum Phase {
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

pub(super) struct State {
    pub(super) conns: HashMap<ConnId, Conn>,
    phase: Phase,
    pub(super) events: Vec<MembershipEvent>,
    pub(super) next_conn: ConnId,
    next_seq: u64,
    pub(super) formed: Option<u64>,
    pub(super) world: usize,
    /// The configuration's `max`.
    max: usize,
    pub(super) stopping: bool,
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
    pub(super) fn new(now: Instant, max: usize) -> State {
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

    pub(super) fn outcome(&self) -> Option<Outcome> {
        match &self.phase {
            Phase::Over(o) => Some(o.clone()),
            _ => None,
        }
    }

    pub(super) fn live(&self) -> usize {
        self.conns.values().filter(|c| !c.lost).count()
    }

    /// A request from connection `id`.
    pub(super) fn request(&mut self, id: ConnId, req: Request) -> Vec<Out> {
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
    pub(super) fn gone(&mut self, id: ConnId) -> Vec<Out> {
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
    pub(super) fn abort(&mut self, reason: String) -> Vec<Out> {
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
    pub(super) fn form(
        &mut self,
        cfg: &CoordinatorConfig,
        now: Instant,
    ) -> (Vec<Out>, Option<Instant>) {
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

    /// The live members of broken generation `b` that have not asked for the next world:
    /// awaited until the detection plus the timeout (that deadline is returned), then
    /// evicted (their connections shut) so the survivors can go on.
    fn evict_silent(
        &mut self,
        cfg: &CoordinatorConfig,
        now: Instant,
        b: &Broken,
        live: &[ConnId],
    ) -> Option<Instant> {
        let awaited: Vec<ConnId> = live
            .iter()
            .copied()
            .filter(|m| self.conns.get(m).is_some_and(|c| c.next.is_none()))
            .collect();
        if awaited.is_empty() {
            return None;
        }
        let deadline = b.detected + cfg.timeout;
        if now < deadline {
            return Some(deadline);
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
        None
    }

    /// After generation `b` broke: the run's end when every live member finished, else the
    /// next generation of the survivors (and joiners that fit) at their newest common commit,
    /// or a deadline to wait for, or the run's abort naming why.
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
        if let Some(deadline) = self.evict_silent(cfg, now, &b, &live) {
            return (Vec::new(), Some(deadline));
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
}
