//! The handshake: both ends of a new connection prove to each other that they know the
//! shared token, without sending it.
//!
//! ```text
//! connecting rank                                accepting rank (rank 0, or a lower rank)
//!   hello {kind, rank, world_size, port, Nc}  ─▶  checks kind, world size, rank
//!                                             ◀─  challenge {rank, Ns, HMAC(token, "accept" | hello | rank, Ns)}
//!   checks the accepting rank's MAC
//!   proof {HMAC(token, "connect" | hello | challenge)} ─▶  checks the connecting rank's MAC
//! ```
//! Both nonces are fresh random bytes, the two MACs carry different labels and each covers
//! everything sent before it, so no proof can be replayed or reflected. Tags are compared in
//! constant time (`hmac`'s `verify_slice`, built on `subtle`). The accepting side proves
//! first, in its first reply, so a connecting rank never sends anything derived from the
//! token to a stranger posing as rank 0 (or as a lower rank).
//!
//! What this does not do: encrypt or authenticate the frames that follow (an attacker on the
//! path can still read or alter them), or make a weak token strong (an observer of one
//! exchange can test guesses offline). Use a long random `GRADWIRE_TOKEN`.
//!
//! The accepting side runs every pending handshake at once ([`Gate`]): one `poll(2)` loop
//! over the listener and every half-open connection, each with its own whole-connection
//! deadline, so silent, slow or dribbling strangers cost the real ranks nothing.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::frame::{
    Challenge, Hello, Proof, CHALLENGE_LEN, CHALLENGE_SIGNED_LEN, HELLO_LEN, MAC_LEN, PROOF_LEN,
};
use super::sys::{poll, read_exact_before};

type HmacSha256 = Hmac<Sha256>;

const ACCEPT_LABEL: &[u8] = b"gradwire accept";
const CONNECT_LABEL: &[u8] = b"gradwire connect";

/// Room for the longer of a hello and a proof.
const INBUF_LEN: usize = if HELLO_LEN > PROOF_LEN {
    HELLO_LEN
} else {
    PROOF_LEN
};

/// Most half-open connections the accepting side keeps; beyond, the oldest is dropped.
const MAX_PENDING: usize = 256;

fn keyed(token: &[u8], label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(token).expect("HMAC takes keys of any length");
    m.update(label);
    for p in parts {
        m.update(p);
    }
    m
}

/// The accepting side's MAC: over the hello and the signed part of its challenge.
pub(super) fn accept_mac(
    token: &[u8],
    hello: &[u8; HELLO_LEN],
    signed: &[u8; CHALLENGE_SIGNED_LEN],
) -> [u8; MAC_LEN] {
    keyed(token, ACCEPT_LABEL, &[hello, signed])
        .finalize()
        .into_bytes()
        .into()
}

/// The connecting side's MAC: over the hello and the whole challenge.
pub(super) fn connect_mac(
    token: &[u8],
    hello: &[u8; HELLO_LEN],
    challenge: &[u8; CHALLENGE_LEN],
) -> [u8; MAC_LEN] {
    keyed(token, CONNECT_LABEL, &[hello, challenge])
        .finalize()
        .into_bytes()
        .into()
}

/// Checks a MAC in constant time.
fn verify(token: &[u8], label: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    keyed(token, label, parts).verify_slice(tag).is_ok()
}

/// Why the connecting side's handshake failed.
#[derive(Debug)]
pub(super) enum ConnectFailure {
    /// The other end answered but did not prove it knows the token (or is not the rank we
    /// meant to reach): not to be trusted; try again.
    Impostor(String),
    /// The other end closed the connection (it refused us: wrong token or world size?).
    Closed,
    /// An I/O error, or the deadline passed.
    Io(io::Error),
}

/// The connecting side of the handshake on a fresh connection: sends `hello`, checks that
/// the other end is rank `expect_rank` and knows `token`, then sends our proof.
pub(super) fn connect(
    stream: &mut TcpStream,
    token: &[u8],
    hello: &Hello,
    expect_rank: u32,
    deadline: Instant,
) -> Result<(), ConnectFailure> {
    let io = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe => ConnectFailure::Closed,
        _ => ConnectFailure::Io(e),
    };
    let hello_bytes = hello.encode();
    stream
        .set_write_timeout(Some(super::sys::remaining(deadline)))
        .map_err(io)?;
    stream.write_all(&hello_bytes).map_err(io)?;
    let mut cb = [0u8; CHALLENGE_LEN];
    read_exact_before(stream, &mut cb, deadline).map_err(io)?;
    let ch = Challenge::decode(&cb)
        .map_err(|e| ConnectFailure::Impostor(format!("malformed challenge ({e:?})")))?;
    if ch.rank != expect_rank {
        return Err(ConnectFailure::Impostor(format!(
            "answered as rank {}",
            ch.rank
        )));
    }
    let signed = Challenge::encode_signed(ch.rank, &ch.nonce);
    if !verify(token, ACCEPT_LABEL, &[&hello_bytes, &signed], &ch.mac) {
        return Err(ConnectFailure::Impostor(
            "it does not prove it knows the token".into(),
        ));
    }
    let proof = Proof {
        mac: connect_mac(token, &hello_bytes, &cb),
    };
    stream.write_all(&proof.encode()).map_err(io)?;
    stream.set_write_timeout(None).map_err(io)?;
    Ok(())
}

/// A connection whose handshake succeeded.
pub(super) struct Admitted {
    /// The connection (blocking mode).
    pub stream: TcpStream,
    /// Its remote address.
    pub from: SocketAddr,
    /// What the connecting rank announced (its MAC covered all of it).
    pub hello: Hello,
}

/// Where a half-open connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Reading the hello.
    Hello,
    /// Writing our challenge.
    Challenge,
    /// Reading the proof.
    Proof,
}

struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    expires: Instant,
    stage: Stage,
    got: usize,
    inbuf: [u8; INBUF_LEN],
    hello: [u8; HELLO_LEN],
    challenge: [u8; CHALLENGE_LEN],
}

/// What one pass over a half-open connection achieved.
enum Advance {
    /// Waiting for the socket to become readable (`true`) or writable (`false`).
    Wait(bool),
    /// The handshake succeeded.
    Done(Hello),
    /// The connection is refused, for this reason.
    Refuse(String),
}

/// The accepting side: drives every pending handshake on a listener at once.
pub(super) struct Gate<'a> {
    listener: &'a TcpListener,
    token: &'a [u8],
    rank: u32,
    limit: Duration,
    pending: Vec<Pending>,
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
        })
    }

    /// The next connection that proves the token and whose hello passes `check` (also run
    /// before we answer it); `None` once `deadline` passes. Refusals are logged.
    pub fn next(
        &mut self,
        deadline: Instant,
        check: impl Fn(&Hello) -> Result<(), String>,
    ) -> io::Result<Option<Admitted>> {
        loop {
            self.accept_all()?;
            let now = Instant::now();
            let mut i = 0;
            let mut interest = Vec::with_capacity(self.pending.len());
            while i < self.pending.len() {
                let p = &mut self.pending[i];
                let step = if now >= p.expires {
                    Advance::Refuse(format!("handshake not finished within {:?}", self.limit))
                } else {
                    advance(p, self.token, self.rank, &check)
                };
                match step {
                    Advance::Wait(read) => {
                        interest.push(read);
                        i += 1;
                    }
                    Advance::Refuse(why) => {
                        let p = self.pending.swap_remove(i);
                        tracing::warn!(from = %p.from, rank = self.rank, "refused a connection: {why}");
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
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let wake = self
                .pending
                .iter()
                .map(|p| p.expires)
                .fold(deadline, Instant::min);
            let mut fds = Vec::with_capacity(1 + self.pending.len());
            fds.push(libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            for (p, &read) in self.pending.iter().zip(&interest) {
                fds.push(libc::pollfd {
                    fd: p.stream.as_raw_fd(),
                    events: if read { libc::POLLIN } else { libc::POLLOUT },
                    revents: 0,
                });
            }
            poll(&mut fds, wake.saturating_duration_since(now))?;
        }
    }

    /// Accepts every connection waiting on the listener.
    fn accept_all(&mut self) -> io::Result<()> {
        loop {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    if let Err(e) = stream.set_nonblocking(true) {
                        tracing::warn!(%from, "dropped a connection: {e}");
                        continue;
                    }
                    if self.pending.len() >= MAX_PENDING {
                        let oldest = (0..self.pending.len())
                            .min_by_key(|&i| self.pending[i].expires)
                            .expect("pending is full");
                        let p = self.pending.swap_remove(oldest);
                        tracing::warn!(from = %p.from, "refused a connection: too many half-open connections");
                    }
                    self.pending.push(Pending {
                        stream,
                        from,
                        expires: Instant::now() + self.limit,
                        stage: Stage::Hello,
                        got: 0,
                        inbuf: [0; INBUF_LEN],
                        hello: [0; HELLO_LEN],
                        challenge: [0; CHALLENGE_LEN],
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A connection that died before we took it (ECONNABORTED) and the like.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Reads into `buf[*got..]` as far as the socket allows: `Ok(true)` once full.
fn fill(stream: &mut TcpStream, buf: &mut [u8], got: &mut usize) -> Result<bool, String> {
    while *got < buf.len() {
        match stream.read(&mut buf[*got..]) {
            Ok(0) => return Err("closed during the handshake".into()),
            Ok(k) => *got += k,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("handshake unreadable ({e})")),
        }
    }
    Ok(true)
}

/// Moves one half-open connection as far as its socket allows.
fn advance(
    p: &mut Pending,
    token: &[u8],
    rank: u32,
    check: &impl Fn(&Hello) -> Result<(), String>,
) -> Advance {
    loop {
        match p.stage {
            Stage::Hello => {
                match fill(&mut p.stream, &mut p.inbuf[..HELLO_LEN], &mut p.got) {
                    Ok(true) => {}
                    Ok(false) => return Advance::Wait(true),
                    Err(why) => return Advance::Refuse(why),
                }
                let hello = match Hello::decode(&p.inbuf[..HELLO_LEN]) {
                    Ok(h) => h,
                    Err(e) => return Advance::Refuse(format!("malformed hello ({e:?})")),
                };
                if let Err(why) = check(&hello) {
                    return Advance::Refuse(why);
                }
                p.hello.copy_from_slice(&p.inbuf[..HELLO_LEN]);
                let nonce = rand::random();
                let signed = Challenge::encode_signed(rank, &nonce);
                let ch = Challenge {
                    rank,
                    nonce,
                    mac: accept_mac(token, &p.hello, &signed),
                };
                p.challenge = ch.encode();
                p.stage = Stage::Challenge;
                p.got = 0;
            }
            Stage::Challenge => {
                while p.got < CHALLENGE_LEN {
                    match p.stream.write(&p.challenge[p.got..]) {
                        Ok(0) => return Advance::Refuse("closed during the handshake".into()),
                        Ok(k) => p.got += k,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            return Advance::Wait(false)
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Advance::Refuse(format!("handshake unwritable ({e})")),
                    }
                }
                p.stage = Stage::Proof;
                p.got = 0;
            }
            Stage::Proof => {
                match fill(&mut p.stream, &mut p.inbuf[..PROOF_LEN], &mut p.got) {
                    Ok(true) => {}
                    Ok(false) => return Advance::Wait(true),
                    Err(why) => return Advance::Refuse(why),
                }
                let proof = match Proof::decode(&p.inbuf[..PROOF_LEN]) {
                    Ok(pr) => pr,
                    Err(e) => return Advance::Refuse(format!("malformed proof ({e:?})")),
                };
                if !verify(token, CONNECT_LABEL, &[&p.hello, &p.challenge], &proof.mac) {
                    return Advance::Refuse("wrong token".into());
                }
                let hello = Hello::decode(&p.hello).expect("decoded before");
                // Checked again: another connection may have claimed the rank meanwhile.
                return match check(&hello) {
                    Ok(()) => Advance::Done(hello),
                    Err(why) => Advance::Refuse(why),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_depend_on_token_label_and_transcript() {
        let h = [1u8; HELLO_LEN];
        let s = [2u8; CHALLENGE_SIGNED_LEN];
        let a = accept_mac(b"k", &h, &s);
        assert_ne!(a, accept_mac(b"k2", &h, &s));
        assert_ne!(a, accept_mac(b"k", &[3u8; HELLO_LEN], &s));
        assert!(verify(b"k", ACCEPT_LABEL, &[&h, &s], &a));
        assert!(!verify(b"k", CONNECT_LABEL, &[&h, &s], &a));
        assert!(!verify(b"k", ACCEPT_LABEL, &[&h, &s], &a[..31]));
        let c = [4u8; CHALLENGE_LEN];
        assert_ne!(connect_mac(b"k", &h, &c), connect_mac(b"", &h, &c));
    }
}
