//! The collective layer's error type: transport failures (which name the failed rank) plus
//! what only a collective can detect.

use gradwire_codec::DecodeError;

/// Errors of a collective operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A point-to-point call failed; the transport error names the rank concerned.
    #[error("transport: {0}")]
    Transport(#[from] gradwire_transport::Error),
    /// A root outside `0..world_size` was named.
    #[error("root {root} is out of range for a world of {world_size} ranks")]
    InvalidRoot {
        /// The root given.
        root: usize,
        /// The world size.
        world_size: usize,
    },
    /// A rank's contribution had another length than this rank's.
    #[error("rank {peer}: contributed {got} elements where this rank has {expected} (ranks disagree on the length)")]
    LengthMismatch {
        /// The rank whose length differs.
        peer: usize,
        /// This rank's length.
        expected: usize,
        /// The peer's length.
        got: usize,
    },
    /// An output buffer of the wrong size was passed.
    #[error("output buffer holds {got} elements, the collective needs {expected}")]
    BadOutputLength {
        /// The length needed.
        expected: usize,
        /// The length passed.
        got: usize,
    },
    /// A message from a peer did not follow the collective's wire format.
    #[error("rank {peer}: malformed message ({what})")]
    Malformed {
        /// The sender.
        peer: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// A peer's codec payload could not be decoded.
    #[error("rank {peer}: undecodable payload: {source}")]
    Decode {
        /// The rank whose payload this was.
        peer: usize,
        /// The decoder's complaint.
        source: DecodeError,
    },
    /// The codecs handed to a compressed collective cannot do what it needs.
    #[error("codec: {what}")]
    Codec {
        /// What is missing.
        what: &'static str,
    },
}

impl Error {
    /// The rank this error concerns, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::Transport(e) => e.peer(),
            Error::LengthMismatch { peer, .. }
            | Error::Malformed { peer, .. }
            | Error::Decode { peer, .. } => Some(*peer),
            Error::InvalidRoot { .. } | Error::BadOutputLength { .. } | Error::Codec { .. } => None,
        }
    }

    /// The same error with every rank it names passed through `f` (a sub-group's ranks
    /// reported as the job's).
    pub fn map_ranks(self, f: impl Fn(usize) -> usize) -> Error {
        match self {
            Error::Transport(e) => Error::Transport(e.map_ranks(f)),
            Error::LengthMismatch {
                peer,
                expected,
                got,
            } => Error::LengthMismatch {
                peer: f(peer),
                expected,
                got,
            },
            Error::Malformed { peer, what } => Error::Malformed {
                peer: f(peer),
                what,
            },
            Error::Decode { peer, source } => Error::Decode {
                peer: f(peer),
                source,
            },
            e @ (Error::InvalidRoot { .. }
            | Error::BadOutputLength { .. }
            | Error::Codec { .. }) => e,
        }
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
