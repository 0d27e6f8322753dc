//! The transport's error type: every variant that concerns a peer names its rank.

use std::time::Duration;

/// What a rank was doing when a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Sending a message.
    Send,
    /// Receiving a message.
    Recv,
    /// Connecting or handshaking.
    Connect,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Send => "send",
            Op::Recv => "receive",
            Op::Connect => "connect",
        })
    }
}

/// Errors of the transport layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A peer did not answer within the deadline.
    #[error("rank {peer}: timed out after {after:?} during {op} (peer dead or stalled?)")]
    Timeout {
        /// The rank that stalled.
        peer: usize,
        /// What this rank was doing.
        op: Op,
        /// The deadline that passed.
        after: Duration,
    },
    /// A peer closed its connection (it exited or crashed).
    #[error("rank {peer}: connection closed during {op} (peer exited or crashed)")]
    PeerClosed {
        /// The rank that went away.
        peer: usize,
        /// What this rank was doing.
        op: Op,
    },
    /// A peer's process died without closing its end (shared memory: its pid is gone).
    #[error("rank {peer}: process {pid} died during {op}")]
    PeerDied {
        /// The rank that died.
        peer: usize,
        /// Its process id.
        pid: u32,
        /// What this rank was doing.
        op: Op,
    },
    /// A shared-memory ring shared with a peer is malformed or corrupt.
    #[error("rank {peer}: bad shared-memory ring: {source}")]
    BadRing {
        /// The peer at the other end of the ring.
        peer: usize,
        /// What was wrong.
        source: crate::shm::header::HeaderError,
    },
    /// An I/O error on the connection to a peer.
    #[error("rank {peer}: I/O error during {op}: {source}")]
    Io {
        /// The peer of the failed connection.
        peer: usize,
        /// What this rank was doing.
        op: Op,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Another rank reported that this rank failed; the job is over.
    #[error("rank {peer} failed (reported by rank {reported_by})")]
    PeerFailed {
        /// The rank that failed.
        peer: usize,
        /// The rank that noticed it and told us.
        reported_by: usize,
    },
    /// A frame header announced a message larger than the configured limit.
    #[error("rank {peer}: frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge {
        /// The sender of the frame (or the receiver, for an oversized send).
        peer: usize,
        /// The announced length.
        len: u64,
        /// The configured limit.
        max: u64,
    },
    /// A frame header was malformed (wrong magic).
    #[error("rank {peer}: malformed frame header ({what})")]
    BadFrame {
        /// The sender of the frame.
        peer: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// A message had another length than the caller expected.
    #[error("rank {peer}: expected a message of {expected} bytes, got {got}")]
    SizeMismatch {
        /// The sender of the message.
        peer: usize,
        /// The length the caller expected.
        expected: usize,
        /// The length that arrived.
        got: usize,
    },
    /// A rank outside `0..world_size` was named.
    #[error("rank {rank} is out of range for a world of {world_size} ranks")]
    InvalidRank {
        /// The rank named.
        rank: usize,
        /// The world size.
        world_size: usize,
    },
    /// Forming the mesh failed.
    #[error("rendezvous failed: {reason}")]
    Rendezvous {
        /// What went wrong.
        reason: String,
    },
    /// A call out of order, such as a second [`crate::SplitStep::post`] before the first
    /// step was completed (a bug in the caller).
    #[error("transport used out of order: {what}")]
    Misuse {
        /// What was out of order.
        what: &'static str,
    },
    /// An MPI call failed (feature `mpi`); `peer` is the rank of the point-to-point call.
    #[error("MPI error{}: {message}", .peer.map(|p| format!(" with rank {p}")).unwrap_or_default())]
    Mpi {
        /// The peer of the failed call, if it had one.
        peer: Option<usize>,
        /// MPI's error code.
        code: i32,
        /// MPI's error string and the call that failed.
        message: String,
    },
    /// The token is empty and the master address is not loopback, so any host that reaches
    /// it could join the job (refused unless [`crate::tcp::TcpConfig::insecure`]).
    #[error(
        "GRADWIRE_TOKEN is not set and the master address {master} is not loopback: any host \
         that reaches it could join this job. Set GRADWIRE_TOKEN to the same long random value \
         on every rank (for example the output of `openssl rand -hex 16`), or set \
         GRADWIRE_INSECURE=1 to run without a token on a network you trust"
    )]
    NoToken {
        /// The master address.
        master: std::net::SocketAddr,
    },
    /// The environment did not describe a valid rank.
    #[error("environment: {reason}")]
    Env {
        /// What was missing or malformed.
        reason: String,
    },
    /// A call of a group's transport (made by [`crate::split`]) failed: `source` is the error
    /// in the group's own numbering, and the message adds the group and the global rank of
    /// the peer (its rank in the transport first split), as in "partition group 1: rank 0
    /// (global rank 2): timed out after 2s during receive".
    #[error("{}", in_group_message(.group, *.global_peer, *.global_reported_by, .source))]
    InGroup {
        /// The group's label ([`crate::split::Group::label`]).
        group: String,
        /// The global rank of the peer `source` names (its group rank is `source.peer()`).
        global_peer: Option<usize>,
        /// For [`Error::PeerFailed`]: the global rank of the rank that reported it.
        global_reported_by: Option<usize>,
        /// The error in the group's numbering.
        source: Box<Error>,
    },
    /// A rank's message during a split was malformed or did not match this rank's call (it
    /// called `split` a different number of times, or not at that point).
    #[error("rank {peer}: bad split message: {source}")]
    BadSplit {
        /// The rank that sent it.
        peer: usize,
        /// What was wrong.
        source: crate::split::offer::OfferError,
    },
    /// This transport cannot be split into groups ([`crate::split`]).
    #[error("split is not supported on the {transport} transport")]
    SplitUnsupported {
        /// The transport's name.
        transport: &'static str,
    },
    /// [`crate::split::grid`] was asked for a grid that is not the world's size.
    #[error(
        "a grid of {replicas} replicas x {partitions} partitions needs {} ranks, the world has \
         {world_size}", .replicas.saturating_mul(*.partitions)
    )]
    BadGrid {
        /// Ranks in the world.
        world_size: usize,
        /// Replicas asked for.
        replicas: usize,
        /// Partitions per replica asked for.
        partitions: usize,
    },
}

/// The message of [`Error::InGroup`]: the group, then the peer by group and global rank.
fn in_group_message(
    group: &str,
    global_peer: Option<usize>,
    global_reported_by: Option<usize>,
    source: &Error,
) -> String {
    let with_global = |r: usize, g: Option<usize>| match g {
        Some(g) => format!("rank {r} (global rank {g})"),
        None => format!("rank {r}"),
    };
    match (source, source.peer()) {
        (Error::PeerFailed { peer, reported_by }, _) => format!(
            "{group}: {} failed (reported by {})",
            with_global(*peer, global_peer),
            with_global(*reported_by, global_reported_by)
        ),
        (e, Some(p)) => {
            let text = e.to_string();
            let named = with_global(p, global_peer);
            match text.strip_prefix(&format!("rank {p}: ")) {
                Some(rest) => format!("{group}: {named}: {rest}"),
                None => format!("{group}: {named}: {text}"),
            }
        }
        (e, None) => format!("{group}: {e}"),
    }
}

impl Error {
    /// The peer this error concerns, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::Timeout { peer, .. }
            | Error::PeerClosed { peer, .. }
            | Error::Io { peer, .. }
            | Error::FrameTooLarge { peer, .. }
            | Error::BadFrame { peer, .. }
            | Error::SizeMismatch { peer, .. }
            | Error::PeerFailed { peer, .. }
            | Error::PeerDied { peer, .. }
            | Error::BadRing { peer, .. } => Some(*peer),
            Error::Mpi { peer, .. } => *peer,
            Error::BadSplit { peer, .. } => Some(*peer),
            Error::InGroup { source, .. } => source.peer(),
            Error::InvalidRank { .. }
            | Error::SplitUnsupported { .. }
            | Error::BadGrid { .. }
            | Error::Rendezvous { .. }
            | Error::Misuse { .. }
            | Error::NoToken { .. }
            | Error::Env { .. } => None,
        }
    }

    /// The global rank of the peer this error concerns: for an error of a group's transport
    /// ([`Error::InGroup`]) the peer's rank in the transport first split, otherwise
    /// [`Error::peer`].
    pub fn global_peer(&self) -> Option<usize> {
        match self {
            Error::InGroup { global_peer, .. } => *global_peer,
            e => e.peer(),
        }
    }

    /// The group an error of a group's transport happened in ([`Error::InGroup`]).
    pub fn group(&self) -> Option<&str> {
        match self {
            Error::InGroup { group, .. } => Some(group),
            _ => None,
        }
    }

    /// The error without its group: the source of [`Error::InGroup`], in the group's
    /// numbering, otherwise the error itself (to match on what happened).
    pub fn ungrouped(&self) -> &Error {
        match self {
            Error::InGroup { source, .. } => source.ungrouped(),
            e => e,
        }
    }

    /// The same error with every rank it names passed through `f`: a sub-group of ranks
    /// (its own numbering) reports the job's ranks this way.
    pub fn map_ranks(self, f: impl Fn(usize) -> usize) -> Error {
        match self {
            Error::Timeout { peer, op, after } => Error::Timeout {
                peer: f(peer),
                op,
                after,
            },
            Error::PeerClosed { peer, op } => Error::PeerClosed { peer: f(peer), op },
            Error::PeerDied { peer, pid, op } => Error::PeerDied {
                peer: f(peer),
                pid,
                op,
            },
            Error::BadRing { peer, source } => Error::BadRing {
                peer: f(peer),
                source,
            },
            Error::Io { peer, op, source } => Error::Io {
                peer: f(peer),
                op,
                source,
            },
            Error::PeerFailed { peer, reported_by } => Error::PeerFailed {
                peer: f(peer),
                reported_by: f(reported_by),
            },
            Error::FrameTooLarge { peer, len, max } => Error::FrameTooLarge {
                peer: f(peer),
                len,
                max,
            },
            Error::BadFrame { peer, what } => Error::BadFrame {
                peer: f(peer),
                what,
            },
            Error::SizeMismatch {
                peer,
                expected,
                got,
            } => Error::SizeMismatch {
                peer: f(peer),
                expected,
                got,
            },
            Error::Mpi {
                peer,
                code,
                message,
            } => Error::Mpi {
                peer: peer.map(&f),
                code,
                message,
            },
            Error::BadSplit { peer, source } => Error::BadSplit {
                peer: f(peer),
                source,
            },
            // Global ranks stay as they are: they number the world, not the caller's view.
            Error::InGroup {
                group,
                global_peer,
                global_reported_by,
                source,
            } => Error::InGroup {
                group,
                global_peer,
                global_reported_by,
                source: Box::new(source.map_ranks(f)),
            },
            e @ (Error::InvalidRank { .. }
            | Error::SplitUnsupported { .. }
            | Error::BadGrid { .. }
            | Error::Rendezvous { .. }
            | Error::Misuse { .. }
            | Error::NoToken { .. }
            | Error::Env { .. }) => e,
        }
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
