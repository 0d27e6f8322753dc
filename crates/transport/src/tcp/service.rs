//! The transport's mutual challenge-response, offered to services outside the rank mesh
//! (the parameter server's shards and their clients): the same messages, MACs and token as
//! the mesh's handshake (`tcp::handshake`), through a small public surface.
//!
//! A service client names itself with an [`Identity`] (an id and a role); the hello carries
//! the id in its `rank` field, the role in its `port` field, and [`SERVICE_WORLD`] in its
//! `world_size` field, so a service hello is never taken for a rank's (no rank mesh has
//! that many ranks). The accepting side answers as `service_id` (its `rank` field), which
//! the client checks, so a client also learns it reached the service it meant.
//!
//! The MACs cover the whole hello, so once [`ServiceGate::next`] admits a connection its
//! identity is proven to come from a holder of the token, and nothing on the wire before
//! that point depends on anything but the token and fresh nonces.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::auth::NotTaken;
use super::frame::{Hello, HelloKind, CHALLENGE_LEN, CONFIRM_LEN, HELLO_LEN, JOB_LEN, PROOF_LEN};
use super::handshake::{self, ConnectFailure, Gate};

/// The `world_size` field of every service hello.
pub const SERVICE_WORLD: u32 = u32::MAX;

/// Bytes the connecting side sends during the handshake, all messages together (a proxy
/// that forwards whole service frames passes these through first).
pub const CONNECTING_SIDE_BYTES: usize = HELLO_LEN + PROOF_LEN;

/// Bytes the accepting side sends during the handshake.
pub const ACCEPTING_SIDE_BYTES: usize = CHALLENGE_LEN + CONFIRM_LEN;

/// Who a service client says it is (proven by the handshake's MACs, which cover it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The client's id (a parameter-server worker id).
    pub id: u32,
    /// The client's role, as the service defines it.
    pub role: u16,
}

/// Why a service does not take a client's identity: what the check passed to
/// [`ServiceGate::next`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdentityRefusal {
    /// A role the service does not take.
    #[error("role {role} is not one this service takes")]
    Role {
        /// The role the client announced.
        role: u16,
    },
    /// An id the service has no place for: not below its count of clients.
    #[error("client {id} is not below the service's client count {count}")]
    Id {
        /// The id the client announced.
        id: u32,
        /// The service's count of clients.
        count: u32,
    },
}

/// Why a service client's handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceAuthError {
    /// The other end answered but did not prove it knows the token, or answered as another
    /// service id.
    #[error("the service did not authenticate: {0}")]
    Impostor(String),
    /// The other end closed the connection (it refused us: wrong token, or an identity it
    /// does not take).
    #[error("the service closed the connection during the handshake (wrong token?)")]
    Closed,
    /// An I/O error, or the deadline passed.
    #[error("handshake i/o: {0}")]
    Io(#[from] io::Error),
}

/// The client side: runs the handshake on a fresh `stream` as `me`, expecting the service
/// to answer as `service_id`, within `deadline`. On success the stream is ready for the
/// service's own frames.
pub fn connect(
    stream: &mut TcpStream,
    token: &[u8],
    me: Identity,
    service_id: u32,
    deadline: Instant,
) -> Result<(), ServiceAuthError> {
    let hello = Hello {
        kind: HelloKind::Hello,
        rank: me.id,
        world_size: SERVICE_WORLD,
        port: me.role,
        nonce: rand::random(),
        job: [0; JOB_LEN],
    };
    handshake::connect(stream, token, &hello, service_id, deadline).map_err(|e| match e {
        ConnectFailure::Impostor(why) => ServiceAuthError::Impostor(why),
        ConnectFailure::Closed => ServiceAuthError::Closed,
        ConnectFailure::Io(e) => ServiceAuthError::Io(e),
    })
}

/// A connection whose handshake succeeded.
#[derive(Debug)]
pub struct ServiceConn {
    /// The connection (blocking mode).
    pub stream: TcpStream,
    /// Its remote address.
    pub from: SocketAddr,
    /// Who it proved to be.
    pub identity: Identity,
}

/// The service side: accepts connections on a listener and runs every pending handshake at
/// once (one `poll(2)` loop, a deadline per connection), as a rank does.
pub struct ServiceGate<'a> {
    gate: Gate<'a>,
}

impl<'a> ServiceGate<'a> {
    /// A gate on `listener` (made non-blocking) answering as `service_id`; each connection
    /// gets `limit` for its whole handshake.
    pub fn new(
        listener: &'a TcpListener,
        token: &'a [u8],
        service_id: u32,
        limit: Duration,
    ) -> io::Result<ServiceGate<'a>> {
        Ok(ServiceGate {
            gate: Gate::new(listener, token, service_id, limit)?,
        })
    }

    /// The next connection that proves the token and whose identity passes `check` (run
    /// before the service answers it, and again once it has proven itself); `None` once
    /// `deadline` passes. An error is the listener's (`accept(2)` failing, as on EMFILE):
    /// the half-open connections stay pending, so calling again resumes.
    pub fn next(
        &mut self,
        deadline: Instant,
        check: impl Fn(Identity) -> Result<(), IdentityRefusal>,
    ) -> io::Result<Option<ServiceConn>> {
        let identity = |h: &Hello| Identity {
            id: h.rank,
            role: h.port,
        };
        let admitted = self.gate.next(deadline, |h| {
            if h.kind != HelloKind::Hello || h.world_size != SERVICE_WORLD {
                return Err(NotTaken::NotService);
            }
            check(identity(h)).map_err(NotTaken::Identity)
        })?;
        Ok(admitted.map(|a| ServiceConn {
            identity: identity(&a.hello),
            stream: a.stream,
            from: a.from,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_one(
        token: &'static [u8],
        check: impl Fn(Identity) -> Result<(), IdentityRefusal> + Send + 'static,
    ) -> (SocketAddr, std::thread::JoinHandle<Option<Identity>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let h = std::thread::spawn(move || {
            let mut gate = ServiceGate::new(&listener, token, 7, Duration::from_secs(2)).unwrap();
            gate.next(Instant::now() + Duration::from_secs(3), check)
                .unwrap()
                .map(|c| c.identity)
        });
        (addr, h)
    }

    #[test]
    fn a_client_with_the_token_is_admitted_with_its_identity() {
        let (addr, h) = serve_one(b"secret", |_| Ok(()));
        let mut s = TcpStream::connect(addr).unwrap();
        let me = Identity { id: 3, role: 1 };
        connect(
            &mut s,
            b"secret",
            me,
            7,
            Instant::now() + Duration::from_secs(2),
        )
        .unwrap();
        assert_eq!(h.join().unwrap(), Some(me));
    }

    #[test]
    fn a_wrong_token_a_wrong_service_or_a_refused_identity_is_not_admitted() {
        let deadline = || Instant::now() + Duration::from_secs(2);
        // Wrong token: the client sees an impostor and the service admits nobody.
        let (addr, h) = serve_one(b"secret", |_| Ok(()));
        let mut s = TcpStream::connect(addr).unwrap();
        let me = Identity { id: 0, role: 0 };
        let e = connect(&mut s, b"guess", me, 7, deadline()).unwrap_err();
        assert!(matches!(e, ServiceAuthError::Impostor(_)), "{e:?}");
        drop(s);
        assert_eq!(h.join().unwrap(), None);
        // Another service id.
        let (addr, h) = serve_one(b"secret", |_| Ok(()));
        let mut s = TcpStream::connect(addr).unwrap();
        assert!(connect(&mut s, b"secret", me, 8, deadline()).is_err());
        drop(s);
        assert_eq!(h.join().unwrap(), None);
        // An identity the service does not take: closed before any proof.
        let (addr, h) = serve_one(b"secret", |i| {
            if i.id < 2 {
                Ok(())
            } else {
                Err(IdentityRefusal::Id { id: i.id, count: 2 })
            }
        });
        let mut s = TcpStream::connect(addr).unwrap();
        let e = connect(
            &mut s,
            b"secret",
            Identity { id: 5, role: 0 },
            7,
            deadline(),
        )
        .unwrap_err();
        assert!(matches!(e, ServiceAuthError::Closed), "{e:?}");
        assert_eq!(h.join().unwrap(), None);
    }
}
