//! Who may talk to a shard, and as whom.
//!
//! Every connection to a shard opens with the TCP transport's mutual challenge-response
//! (`gradwire_transport::tcp::service`: HMAC-SHA256 on the shared token, the token never
//! crosses the wire) before any PS frame. The client's hello names its worker id and its
//! [`Role`]; the MACs cover both, so once admitted the connection is bound to that
//! [`Peer`] for its whole life. A peer that fails the handshake gets no PS byte at all:
//! no value, no "ok", and no error reply that could echo a worker's incarnation or sequence
//! numbers.
//!
//! The token is `GRADWIRE_PS_TOKEN` if set, else `GRADWIRE_TOKEN` ([`token_from_env`]): the
//! second is the job token launchers pass to ranks; the first lets shards and workers share
//! a token when a launcher (such as `gradwire launch`) makes up its own `GRADWIRE_TOKEN` for
//! the ranks. An empty token still runs the handshake (anyone can compute it), which is why
//! a shard listening off loopback refuses to start with one unless told it may.
//!
//! What a bound connection may do (checked by the shard, see `shard/auth.rs`): requests
//! naming a worker (hello, heartbeat, leave, push, pull) only for its own worker id;
//! creating a table (`Init`), checkpoints and Sandblaster's vector ops only as the
//! [`Role::Coordinator`]. A worker's `Init` of a table the coordinator created is
//! acknowledged when it matches (so every worker may make the same `init` calls).

use std::net::{IpAddr, TcpStream};
use std::time::Instant;

use gradwire_transport::tcp::service::{self, Identity, ServiceAuthError};

use crate::spec::WorkerId;

/// The environment variable read first for the PS token.
pub const PS_TOKEN_ENV: &str = "GRADWIRE_PS_TOKEN";
/// The job token, read when [`PS_TOKEN_ENV`] is unset.
pub const JOB_TOKEN_ENV: &str = "GRADWIRE_TOKEN";

/// The id every shard answers the handshake as (shards are told apart by address, not by
/// this id, so shards started without `--shard-id` still work).
pub(crate) const SERVICE_ID: u32 = 0x5053_0001;

/// The PS token from the environment: `GRADWIRE_PS_TOKEN`, else `GRADWIRE_TOKEN`, else
/// empty.
pub fn token_from_env() -> String {
    [PS_TOKEN_ENV, JOB_TOKEN_ENV]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
        .unwrap_or_default()
}

/// What a connection may do beyond its own worker's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Its own pushes, pulls, heartbeats, hello and leave; `Init` only of tables that exist.
    Worker,
    /// A worker's rights, plus creating tables, checkpoints and Sandblaster's vector ops.
    Coordinator,
}

impl Role {
    fn code(self) -> u16 {
        match self {
            Role::Worker => 0,
            Role::Coordinator => 1,
        }
    }

    fn from_code(c: u16) -> Option<Role> {
        match c {
            0 => Some(Role::Worker),
            1 => Some(Role::Coordinator),
            _ => None,
        }
    }
}

/// Who an admitted connection proved to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer {
    /// The worker id the connection is bound to.
    pub worker: WorkerId,
    /// Its role.
    pub role: Role,
}

impl Peer {
    /// As the handshake carries it.
    pub(crate) fn identity(self) -> Identity {
        Identity {
            id: self.worker.0,
            role: self.role.code(),
        }
    }

    /// From a handshake's identity; `None` for an unknown role.
    pub(crate) fn from_identity(i: Identity) -> Option<Peer> {
        Role::from_code(i.role).map(|role| Peer {
            worker: WorkerId(i.id),
            role,
        })
    }
}

/// Runs the client side of the handshake on a fresh connection to a shard, as `peer`,
/// proving `token` within `deadline`. On success the stream carries PS frames.
pub fn connect(
    stream: &mut TcpStream,
    token: &str,
    peer: Peer,
    deadline: Instant,
) -> Result<(), ServiceAuthError> {
    service::connect(
        stream,
        token.as_bytes(),
        peer.identity(),
        SERVICE_ID,
        deadline,
    )
}

/// Whether a shard listening on `ip` may start with `token`: a token is needed off
/// loopback unless `insecure` says otherwise.
pub fn may_listen(ip: IpAddr, token: &str, insecure: bool) -> bool {
    ip.is_loopback() || !token.is_empty() || insecure
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip_through_the_identity_and_unknown_roles_are_refused() {
        for role in [Role::Worker, Role::Coordinator] {
            let p = Peer {
                worker: WorkerId(7),
                role,
            };
            assert_eq!(Peer::from_identity(p.identity()), Some(p));
        }
        assert_eq!(Peer::from_identity(Identity { id: 0, role: 2 }), None);
    }

    #[test]
    fn off_loopback_needs_a_token_or_insecure() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        let v6: IpAddr = "::1".parse().unwrap();
        assert!(may_listen(lo, "", false));
        assert!(may_listen(v6, "", false));
        assert!(!may_listen(any, "", false));
        assert!(may_listen(any, "t", false));
        assert!(may_listen(any, "", true));
    }
}
