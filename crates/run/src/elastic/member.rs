//! The member's side: one authenticated connection to the coordinator for the whole run,
//! one request at a time.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use gradwire_transport::tcp::service::{self, Identity};

use super::coordinator::{COORDINATOR_ID, ROLE_MEMBER};
use super::message::{
    decode_reply, encode_request, read_frame, MembershipEvent, MessageError, Reply, Request, World,
};
use super::ElasticError;

/// The variable that gives a worker its coordinator's address (`host:port`).
pub const ENV_ELASTIC: &str = "GRADWIRE_ELASTIC";

/// The variable that gives the token (may be empty).
pub const ENV_TOKEN: &str = "GRADWIRE_TOKEN";

/// How long a handshake may take.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

/// How long the answer to a request other than `Next` is awaited (they are answered at
/// once).
const REPLY_WAIT: Duration = Duration::from_secs(30);

/// How long the coordinator may take to read a request.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Pause between connection attempts.
const RETRY: Duration = Duration::from_millis(50);

/// A worker's connection to the coordinator.
#[derive(Debug)]
pub struct Member {
    stream: TcpStream,
    /// Set once the connection is out of step (a timeout inside a reply, a bad reply):
    /// every later call fails with it.
    broken: Option<String>,
}

/// Reads from a stream until a deadline (`None`: no deadline).
struct Deadlined<'a> {
    stream: &'a TcpStream,
    deadline: Option<Instant>,
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let timeout = match self.deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                Some(left)
            }
            None => None,
        };
        self.stream.set_read_timeout(timeout)?;
        let mut s = self.stream;
        s.read(buf)
    }
}

impl Member {
    /// Connects to the coordinator at `addr`, retrying refused connections until `deadline`
    /// has passed, and proves `token` (as role [`ROLE_MEMBER`], id this process's id).
    pub fn connect(
        addr: SocketAddr,
        token: &str,
        deadline: Duration,
    ) -> Result<Member, ElasticError> {
        let start = Instant::now();
        let end = start.checked_add(deadline);
        let mut stream = loop {
            let left = end.map(|e| e.saturating_duration_since(Instant::now()));
            let attempt = left
                .unwrap_or(Duration::MAX)
                .clamp(Duration::from_millis(10), Duration::from_secs(5));
            match TcpStream::connect_timeout(&addr, attempt) {
                Ok(s) => break s,
                Err(e) => {
                    if end.is_some_and(|e| Instant::now() + RETRY >= e) {
                        return Err(ElasticError::Io(e));
                    }
                    std::thread::sleep(RETRY);
                }
            }
        };
        stream.set_nodelay(true)?;
        let me = Identity {
            id: std::process::id(),
            role: ROLE_MEMBER,
        };
        service::connect(
            &mut stream,
            token.as_bytes(),
            me,
            COORDINATOR_ID,
            Instant::now() + HANDSHAKE_LIMIT,
        )?;
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
        Ok(Member {
            stream,
            broken: None,
        })
    }

    /// The member this process should be: `None` when [`ENV_ELASTIC`] is unset or empty,
    /// else a connection to it (token from [`ENV_TOKEN`], empty if unset).
    pub fn from_env(deadline: Duration) -> Result<Option<Member>, ElasticError> {
        let addr = match std::env::var(ENV_ELASTIC) {
            Ok(a) if !a.trim().is_empty() => a,
            _ => return Ok(None),
        };
        let resolved = addr
            .trim()
            .to_socket_addrs()
            .map_err(|e| ElasticError::Address {
                var: ENV_ELASTIC,
                value: addr.clone(),
                reason: e.to_string(),
            })?
            .next()
            .ok_or_else(|| ElasticError::Address {
                var: ENV_ELASTIC,
                value: addr.clone(),
                reason: "names no address".into(),
            })?;
        let token = std::env::var(ENV_TOKEN).unwrap_or_default();
        Member::connect(resolved, &token, deadline).map(Some)
    }

    /// Asks for the next world (blocks until the coordinator forms it, at most `wait`).
    /// `commits`: the global steps of the commits this member holds; `reached`: the last
    /// step it completed (both empty/0 for a new member).
    pub fn next_world(
        &mut self,
        commits: &[u64],
        reached: u64,
        wait: Duration,
    ) -> Result<World, ElasticError> {
        let req = Request::Next {
            commits: commits.to_vec(),
            reached,
        };
        match self.call(&req, wait, "the next world")? {
            Reply::World(w) => {
                if let Err(e) = w.master.parse::<SocketAddr>() {
                    return Err(self.out_of_step(format!(
                        "the coordinator sent a bad master address {:?}: {e}",
                        w.master
                    )));
                }
                Ok(w)
            }
            other => Err(self.unexpected("World", &other)),
        }
    }

    /// Whether a new member waits with room for it (asked by rank 0 at a commit).
    pub fn pending(&mut self) -> Result<bool, ElasticError> {
        match self.call(&Request::Pending, REPLY_WAIT, "the pending answer")? {
            Reply::Pending(p) => Ok(p),
            other => Err(self.unexpected("Pending", &other)),
        }
    }

    /// Reports that `generation` trains again since `unix_s` (seconds since the epoch).
    pub fn resumed(&mut self, generation: u64, unix_s: f64) -> Result<(), ElasticError> {
        let req = Request::Resumed { generation, unix_s };
        self.ack(&req, "the resumed acknowledgement")
    }

    /// Reports that this member finished the run.
    pub fn done(&mut self) -> Result<(), ElasticError> {
        self.ack(&Request::Done, "the done acknowledgement")
    }

    /// The membership events so far.
    pub fn events(&mut self) -> Result<Vec<MembershipEvent>, ElasticError> {
        match self.call(&Request::Events, REPLY_WAIT, "the events")? {
            Reply::Events(e) => Ok(e),
            other => Err(self.unexpected("Events", &other)),
        }
    }

    fn ack(&mut self, req: &Request, what: &'static str) -> Result<(), ElasticError> {
        match self.call(req, REPLY_WAIT, what)? {
            Reply::Ack => Ok(()),
            other => Err(self.unexpected("Ack", &other)),
        }
    }

    /// Sends `req` and reads its reply; an `Abort` is [`ElasticError::Aborted`].
    fn call(
        &mut self,
        req: &Request,
        wait: Duration,
        what: &'static str,
    ) -> Result<Reply, ElasticError> {
        if let Some(why) = &self.broken {
            return Err(ElasticError::Protocol(why.clone()));
        }
        if let Err(e) = self.stream.write_all(&encode_request(req)) {
            self.broken = Some(format!("an earlier request failed: {e}"));
            return Err(ElasticError::Io(e));
        }
        let mut r = Deadlined {
            stream: &self.stream,
            deadline: Instant::now().checked_add(wait),
        };
        let body = match read_frame(&mut r) {
            Ok(b) => b,
            Err(MessageError::Io(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                self.broken = Some(format!("no reply came for {what} in time"));
                return Err(ElasticError::Timeout { what });
            }
            Err(e) => {
                self.broken = Some(format!("reading {what} failed: {e}"));
                return Err(ElasticError::Message(e));
            }
        };
        match decode_reply(&body) {
            Ok(Reply::Abort(why)) => Err(ElasticError::Aborted(why)),
            Ok(r) => Ok(r),
            Err(e) => {
                self.broken = Some(format!("the coordinator sent a malformed reply: {e}"));
                Err(ElasticError::Message(e))
            }
        }
    }

    fn out_of_step(&mut self, why: String) -> ElasticError {
        self.broken = Some(why.clone());
        ElasticError::Protocol(why)
    }

    fn unexpected(&mut self, wanted: &str, got: &Reply) -> ElasticError {
        self.out_of_step(format!("expected a {wanted} reply, got {got:?}"))
    }
}
