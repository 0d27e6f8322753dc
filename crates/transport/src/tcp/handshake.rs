//! The handshake over sockets: [`connect`] runs the connecting side on one blocking stream,
//! [`Gate`] the accepting side of every pending connection on a listener at once. The
//! messages, their order and the proofs are those of [`super::auth`] (the connecting side
//! proves first; the accepting side answers nothing derived from the token until then).
//!
//! What this does not do: encrypt or authenticate the frames that follow (an attacker on the
//! path can still read or alter them), or make a weak token strong (an impostor at the
//! address a rank dials gets one proof to test guesses against offline). Use a long random
//! `GRADWIRE_TOKEN`.
//!
//! The gate runs one `poll(2)` loop over the listener and every half-open connection, each
//! with its own whole-connection deadline, so silent, slow or dribbling strangers cost the
//! real ranks nothing. At most [`MAX_PENDING`] connections are half open: beyond, the oldest
//! that has not sent a valid hello is dropped, and only when every one has, the one that has
//! waited longest for its proof (a real rank answers within a round trip). A connection is
//! read as soon as it is accepted, so a real rank's hello, sent right after it connects,
//! puts it ahead of the silent. When `accept(2)` runs out of descriptors (`EMFILE` and the
//! like) the gate stops accepting for [`ACCEPT_BACKOFF`] and goes on with the connections it
//! has. Dropped connections are logged at most once per interval with counts
//! (`tcp::refusals`).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::auth::{Acceptor, Initiator, NotTaken, Refusal};
use super::frame::{Hello, CHALLENGE_LEN, CONFIRM_LEN, HELLO_LEN, PROOF_LEN};
use super::refusals::RefusalLog;
use super::sys::{poll, read_exact_before, remaining};

/// Most half-open connections the accepting side keeps.
pub(super) const MAX_PENDING: usize = 256;

/// How long the gate stops accepting after `accept(2)` ran out of descriptors or memory.
pub(super) const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Why the connecting side's handshake failed.
#[derive(Debug)]
pub(super) enum ConnectFailure {
    /// The other end answered but did not prove it knows the token (or is not the rank we
    /// meant to reach, or refused our proof): not to be trusted; try again.
    Impostor(String),
    /// The other end closed the connection before it answered our hello (it refused the
    /// hello: another job or world size, or it had no room for us).
    Closed,
    /// An I/O error, or the deadline passed.
    Io(io::Error),
}

/// The connecting side of the handshake on a fresh connection: sends `hello`, checks that
/// the other end is rank `expect_rank`, proves that we know `token`, and checks that the
/// other end knows it too.
pub(super) fn connect(
    stream: &mut TcpStream,
    token: &[u8],
    hello: &Hello,
    expect_rank: u32,
    deadline: Instant,
) -> Result<(), ConnectFailure> {
    let mut init = Initiator::new(hello, expect_rank);
    let io = |init: &Initiator, e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
            if init.proved() =>
        {
            ConnectFailure::Impostor(
                "it closed the connection after our proof: it refused it (another token there?)"
                    .into(),
            )
        }
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe => ConnectFailure::Closed,
        _ => ConnectFailure::Io(e),
    };
    stream
        .set_write_timeout(Some(remaining(deadline)))
        .map_err(|e| io(&init, e))?;
    stream.write_all(init.hello()).map_err(|e| io(&init, e))?;
    let mut cb = [0u8; CHALLENGE_LEN];
    read_exact_before(stream, &mut cb, deadline).map_err(|e| io(&init, e))?;
    let proof = init
        .on_challenge(&cb, token)
        .map_err(|r| ConnectFailure::Impostor(r.to_string()))?;
    stream.write_all(&proof).map_err(|e| io(&init, e))?;
    let mut kb = [0u8; CONFIRM_LEN];
    read_exact_before(stream, &mut kb, deadline).map_err(|e| io(&init, e))?;
    init.on_confirm(&kb, token)
        .map_err(|r| ConnectFailure::Impostor(r.to_string()))?;
    stream.set_write_timeout(None).map_err(|e| io(&init, e))?;
    Ok(())
}

/// A connection whose handshake succeeded.
pub(super) struct Admitted {
    /// The connection (blocking mode).
    pub stream: TcpStream,
    /// Its remote address.
    pub from: SocketAddr,
    /// What the connecting side announced (its proof covered all of it).
    pub hello: Hello,
}

/// Why the gate dropped a half-open connection.
#[derive(Debug)]
enum Dropped {
    /// The handshake refused it.
    Refused(Refusal),
    /// It did not finish within the limit.
    Expired(Duration),
    /// Room was needed for another (see the module doc).
    Evicted,
    /// It closed the connection.
    Closed,
    /// Its socket failed.
    Broken(io::Error),
}

impl Dropped {
    /// A short phrase for the counts of the log.
    fn kind(&self) -> &'static str {
        match self {
            Dropped::Refused(Refusal::WrongToken) => "wrong token",
            Dropped::Refused(Refusal::NotWanted(_)) => "hello not taken",
            Dropped::Refused(_) => "malformed",
            Dropped::Expired(_) => "too slow",
            Dropped::Evicted => "evicted for room",
            Dropped::Closed => "closed early",
            Dropped::Broken(_) => "socket error",
        }
    }
}

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dropped::Refused(r) => write!(f, "{r}"),
            Dropped::Expired(limit) => write!(f, "handshake not finished within {limit:?}"),
            Dropped::Evicted => write!(
                f,
                "too many half-open connections ({MAX_PENDING}): dropped for room"
            ),
            Dropped::Closed => write!(f, "closed during the handshake"),
            Dropped::Broken(e) => write!(f, "handshake i/o failed ({e})"),
        }
    }
}

/// What a half-open connection is reading.
enum Stage {
    /// The hello (the connection has not yet sent a valid one).
    Hello { got: usize, buf: [u8; HELLO_LEN] },
    /// The proof (it sent a valid hello and got our challenge).
    Proof { got: usize, buf: [u8; PROOF_LEN] },
}

struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    expires: Instant,
    /// When it was accepted, or (once it sent a valid hello) when our challenge went out.
    since: Instant,
    acceptor: Acceptor,
    stage: Stage,
}

impl Pending {
    /// Whether it has sent a valid hello.
    fn vouched(&self) -> bool {
        matches!(self.stage, Stage::Proof { .. })
    }
}

/// What one pass over a half-open connection achieved.
enum Advance {
    /// Waiting for more bytes.
    Wait,
    /// The handshake succeeded.
    Done(Hello),
    /// The connection is dropped, for this reason.
    Drop(Dropped),
}

/// The accepting side: drives every pending handshake on a listener at once.
pub(super) struct Gate<'a> {
    listener: &'a TcpListener,
    token: &'a [u8],
    rank: u32,
    limit: Duration,
    pending: Vec<Pending>,
    /// No `accept(2)` before this (it ran out of descriptors).
    paused_until: Option<Instant>,
    log: RefusalLog,
}

impl<'a> Gate<'a> {
    /// A gate on `listener` for rank `rank`; each connection gets `limit` for its whole
    /// handshake.
    pub fn new(
        listener: &'a TcpListener,
        token: &'a [u8],
        rank: u32,
        limit: Duration,
    ) -> io::Result<Gate<'a>> {
        listener.set_nonblocking(true)?;
        Ok(Gate {
            listener,
            token,
            rank,
            limit,
            pending: Vec::new(),
            paused_until: None,
            log: RefusalLog::new(rank),
        })
    }

    /// The next connection that proves the token and whose hello passes `check` (run before
    /// we answer it, and again once it has proven itself); `None` once `deadline` passes.
    /// Dropped connections are logged, at most a line per interval. An error is the
    /// listener's own (not a connection's, and not running out of descriptors, which only
    /// pauses accepting).
    pub fn next(
        &mut self,
        deadline: Instant,
        check: impl Fn(&Hello) -> Result<(), NotTaken>,
    ) -> io::Result<Option<Admitted>> {
        loop {
            let accepting = self.paused_until.is_none_or(|t| Instant::now() >= t);
            if accepting {
                self.paused_until = None;
                self.accept_some(&check)?;
            }
            let now = Instant::now();
            let mut i = 0;
            while i < self.pending.len() {
                let p = &mut self.pending[i];
                let step = if now >= p.expires {
                    Advance::Drop(Dropped::Expired(self.limit))
                } else {
                    advance(p, self.token, &check)
                };
                match step {
                    Advance::Wait => i += 1,
                    Advance::Drop(why) => {
                        let p = self.pending.swap_remove(i);
                        self.log.dropped(p.from, why.kind(), &why);
                    }
                    Advance::Done(hello) => {
                        let p = self.pending.swap_remove(i);
                        p.stream.set_nonblocking(false)?;
                        return Ok(Some(Admitted {
                            stream: p.stream,
                            from: p.from,
                            hello,
                        }));
                    }
                }
            }
            self.log.tick();
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let mut wake = self
                .pending
                .iter()
                .map(|p| p.expires)
                .fold(deadline, Instant::min);
            if let Some(t) = self.paused_until {
                wake = wake.min(t);
            }
            let mut fds = Vec::with_capacity(1 + self.pending.len());
            if self.paused_until.is_none() {
                fds.push(libc::pollfd {
                    fd: self.listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            for p in &self.pending {
                fds.push(libc::pollfd {
                    fd: p.stream.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            poll(&mut fds, wake.saturating_duration_since(now))?;
        }
    }

    /// Accepts the connections waiting on the listener (at most [`MAX_PENDING`] per call, so
    /// a steady flood cannot keep the gate from the connections it has), reading each at
    /// once as far as its challenge.
    fn accept_some(&mut self, check: &impl Fn(&Hello) -> Result<(), NotTaken>) -> io::Result<()> {
        for _ in 0..MAX_PENDING {
            let (stream, from) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if is_out_of_resources(&e) => {
                    self.paused_until = Some(Instant::now() + ACCEPT_BACKOFF);
                    let any = SocketAddr::from(([0, 0, 0, 0], 0));
                    self.log.dropped(
                        any,
                        "not accepted (out of descriptors)",
                        &format_args!("accept failed ({e}): not accepting for {ACCEPT_BACKOFF:?}"),
                    );
                    return Ok(());
                }
                Err(e) if is_transient(&e) => continue,
                Err(e) => return Err(e),
            };
            if let Err(e) = stream.set_nonblocking(true) {
                self.log.dropped(from, "socket error", &Dropped::Broken(e));
                continue;
            }
            let now = Instant::now();
            let mut p = Pending {
                stream,
                from,
                expires: now + self.limit,
                since: now,
                acceptor: Acceptor::new(self.rank),
                stage: Stage::Hello {
                    got: 0,
                    buf: [0; HELLO_LEN],
                },
            };
            match read_hello(&mut p, check) {
                Ok(()) => self.pending.push(p),
                Err(why) => {
                    self.log.dropped(p.from, why.kind(), &why);
                    continue;
                }
            }
            if self.pending.len() > MAX_PENDING {
                let victim = evictee(&self.pending);
                let p = self.pending.swap_remove(victim);
                self.log
                    .dropped(p.from, Dropped::Evicted.kind(), &Dropped::Evicted);
            }
        }
        Ok(())
    }
}

/// Which connection to drop for room: the oldest of those that have not sent a valid hello;
/// when every one has, the one that has waited longest for its proof.
fn evictee(pending: &[Pending]) -> usize {
    let oldest = |vouched: bool| {
        (0..pending.len())
            .filter(|&i| pending[i].vouched() == vouched)
            .min_by_key(|&i| pending[i].since)
    };
    oldest(false).or_else(|| oldest(true)).unwrap_or(0)
}

/// `accept(2)` ran out of something it may have again soon.
fn is_out_of_resources(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// `accept(2)` failed because of the connection it was taking (it died meanwhile, or its
/// network did): the next one may be fine.
fn is_transient(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Interrupted
        || e.kind() == io::ErrorKind::ConnectionAborted
        || matches!(
            e.raw_os_error(),
            Some(
                libc::EPROTO
                    | libc::ENOPROTOOPT
                    | libc::EHOSTDOWN
                    | libc::ENONET
                    | libc::EHOSTUNREACH
                    | libc::EOPNOTSUPP
                    | libc::ENETUNREACH
                    | libc::ENETDOWN
                    | libc::EPERM
            )
        )
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        self.log.flush();
    }
}

/// Reads into `buf[*got..]` as far as the socket allows: `Ok(true)` once full.
fn fill(stream: &mut TcpStream, buf: &mut [u8], got: &mut usize) -> Result<bool, Dropped> {
    while *got < buf.len() {
        match stream.read(&mut buf[*got..]) {
            Ok(0) => return Err(Dropped::Closed),
            Ok(k) => *got += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Dropped::Broken(e)),
        }
    }
    Ok(true)
}

/// Writes a whole handshake message on a non-blocking socket. It is at most a few dozen
/// bytes into a socket whose send buffer holds nothing else (the other side read everything
/// we sent before, or it could not have answered), so a write that cannot take it whole
/// only comes from a broken connection.
fn send(stream: &mut TcpStream, msg: &[u8]) -> Result<(), Dropped> {
    loop {
        match stream.write(msg) {
            Ok(k) if k == msg.len() => return Ok(()),
            Ok(_) => {
                return Err(Dropped::Broken(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "a handshake message did not fit the socket",
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Dropped::Broken(e)),
        }
    }
}

/// Reads the hello if it has arrived and, when it is taken, sends the challenge.
fn read_hello(
    p: &mut Pending,
    check: &impl Fn(&Hello) -> Result<(), NotTaken>,
) -> Result<(), Dropped> {
    let Stage::Hello { got, buf } = &mut p.stage else {
        return Ok(());
    };
    if !fill(&mut p.stream, buf, got)? {
        return Ok(());
    }
    let challenge = p
        .acceptor
        .on_hello(&buf[..], rand::random(), check)
        .map_err(Dropped::Refused)?;
    send(&mut p.stream, &challenge)?;
    p.stage = Stage::Proof {
        got: 0,
        buf: [0; PROOF_LEN],
    };
    p.since = Instant::now();
    Ok(())
}

/// Moves one half-open connection as far as its socket allows.
fn advance(
    p: &mut Pending,
    token: &[u8],
    check: &impl Fn(&Hello) -> Result<(), NotTaken>,
) -> Advance {
    if let Err(why) = read_hello(p, check) {
        return Advance::Drop(why);
    }
    let Stage::Proof { got, buf } = &mut p.stage else {
        return Advance::Wait;
    };
    match fill(&mut p.stream, buf, got) {
        Ok(true) => {}
        Ok(false) => return Advance::Wait,
        Err(why) => return Advance::Drop(why),
    }
    let (hello, confirm) = match p.acceptor.on_proof(&buf[..], token, check) {
        Ok(v) => v,
        Err(r) => return Advance::Drop(Dropped::Refused(r)),
    };
    match send(&mut p.stream, &confirm) {
        Ok(()) => Advance::Done(hello),
        Err(why) => Advance::Drop(why),
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::auth::{connect_mac, job_digest};
    use super::super::frame::{HelloKind, Proof};
    use super::*;

    fn hello(rank: u32) -> Hello {
        Hello {
            kind: HelloKind::Hello,
            rank,
            world_size: 2,
            port: 1,
            nonce: rand::random(),
            job: job_digest(""),
        }
    }

    fn pending(vouched: bool, age_ms: u64, listener: &TcpListener) -> Pending {
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let since = Instant::now() - Duration::from_millis(age_ms);
        Pending {
            from: stream.local_addr().unwrap(),
            stream,
            expires: since + Duration::from_secs(60),
            since,
            acceptor: Acceptor::new(0),
            stage: if vouched {
                Stage::Proof {
                    got: 0,
                    buf: [0; PROOF_LEN],
                }
            } else {
                Stage::Hello {
                    got: 0,
                    buf: [0; HELLO_LEN],
                }
            },
        }
    }

    /// The oldest silent connection goes first, even when a connection with a valid hello
    /// is older; only among those with valid hellos, the one waiting longest for its proof.
    #[test]
    fn eviction_spares_valid_hellos() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let ps = vec![
            pending(true, 900, &l),
            pending(false, 100, &l),
            pending(false, 500, &l),
            pending(true, 50, &l),
        ];
        assert_eq!(evictee(&ps), 2);
        let ps = vec![pending(true, 100, &l), pending(true, 800, &l)];
        assert_eq!(evictee(&ps), 1);
    }

    /// The connecting side sends its proof before the accepting side sends anything derived
    /// from the token: a stranger that stops after the challenge holds nothing but a nonce.
    #[test]
    fn a_stranger_gets_no_mac_before_it_proves() {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = l.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let mut gate = Gate::new(&l, b"secret", 0, Duration::from_secs(2)).unwrap();
            gate.next(Instant::now() + Duration::from_millis(1500), |_| Ok(()))
                .unwrap()
                .map(|a| a.hello.rank)
        });
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let hb = hello(1).encode();
        s.write_all(&hb).unwrap();
        let mut ch = [0u8; CHALLENGE_LEN];
        s.read_exact(&mut ch).unwrap();
        // Nothing but the challenge (magic, rank, nonce) came, and no more is coming.
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut more = [0u8; 1];
        assert!(matches!(s.read(&mut more), Err(e) if e.kind() == io::ErrorKind::WouldBlock));
        // A wrong proof closes the connection without a confirm.
        let proof = Proof {
            mac: connect_mac(b"guess", &hb, &ch),
        };
        s.write_all(&proof.encode()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        assert!(rest.is_empty(), "a confirm after a wrong proof");
        assert_eq!(h.join().unwrap(), None);
    }
}
