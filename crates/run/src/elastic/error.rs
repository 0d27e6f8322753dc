//! What can go wrong between a member and the coordinator.

use std::io;

use gradwire_transport::tcp::service::ServiceAuthError;

use super::message::MessageError;

/// Why an elastic operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ElasticError {
    /// The configuration or the environment is invalid; the text says what to change.
    #[error("elastic configuration: {0}")]
    Config(String),
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
