//! What can go wrong between a member and the coordinator.

use std::io;

use gradwire_transport::tcp::service::ServiceAuthError;

use super::message::MessageError;

/// Why an elastic operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ElasticError {
    /// The world sizes are out of order (`1 <= min <= initial <= max` must hold).
    #[error("elastic configuration: need 1 <= min <= initial <= max, got min {min}, initial {initial}, max {max}")]
    Sizes {
        /// The fewest members.
        min: usize,
        /// The members the first generation waits for.
        initial: usize,
        /// The most members.
        max: usize,
    },
    /// `max` does not fit a rank (`u32`).
    #[error("elastic configuration: max {max} does not fit a rank")]
    TooMany {
        /// The most members asked for.
        max: usize,
    },
    /// `GRADWIRE_ELASTIC` does not name a coordinator's address.
    #[error("{var}={value:?}: {reason}")]
    Address {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why it names no address.
        reason: String,
    },
    /// A socket failed (binding, connecting, writing).
    #[error("elastic i/o: {0}")]
    Io(#[from] io::Error),
    /// The coordinator's handshake failed (wrong token, or not a coordinator).
    #[error("authenticating with the coordinator: {0}")]
    Auth(#[from] ServiceAuthError),
    /// A frame could not be read, or the coordinator closed the connection.
    #[error("coordinator message: {0}")]
    Message(#[from] MessageError),
    /// The coordinator ended the run for this member; the text says why.
    #[error("the coordinator aborted the run: {0}")]
    Aborted(String),
    /// No reply came in time. The connection may be inside a frame: drop the member.
    #[error("timed out waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
    },
    /// The other side broke the protocol (an unexpected reply, an earlier timeout).
    #[error("elastic protocol: {0}")]
    Protocol(String),
}
