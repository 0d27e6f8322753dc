//! Why an elastic worker's generation ended early ([`MemberError`]), and which of those
//! are a peer's failure, after which the world re-forms ([`MemberError::is_peer_failure`]).

use std::error::Error;
use std::net::{AddrParseError, SocketAddr};
use std::path::PathBuf;

use gradwire_run::elastic::ElasticError;
use gradwire_run::report::records::RecordError;
use gradwire_train::elastic::CommitFormatError;

use crate::checkpoint::CheckpointError;
use crate::rank::RankError;

/// Why an elastic worker's generation ended early. A variant that says what the worker was
/// doing keeps the cause as its [`Error::source`], so a front end printing the chain shows
/// both (`loading mnist: ...`).
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The data set does not load.
    #[error("loading {dataset}")]
    Load {
        /// The data set.
        dataset: &'static str,
        /// Why.
        source: gradwire_train::Error,
    },
    /// The membership coordinator did not answer a request.
    #[error("{what}")]
    Coordinator {
        /// The request (`asking for joiners`, ...).
        what: &'static str,
        /// Why.
        source: ElasticError,
    },
    /// The membership coordinator did not take the news that training resumed.
    #[error(transparent)]
    Membership(#[from] ElasticError),
    /// The generation's master address does not parse.
    #[error("the generation's master address")]
    Master(#[source] AddrParseError),
    /// This rank did not join the generation's TCP mesh.
    #[error("generation {generation}: joining the mesh at {master}")]
    Mesh {
        /// The generation.
        generation: u64,
        /// Rank 0's address.
        master: SocketAddr,
        /// Why.
        source: gradwire_transport::Error,
    },
    /// Rank 0 was asked to restore a step it holds no commit of.
    #[error("rank 0 holds no commit of step {step}")]
    NoCommit {
        /// The step.
        step: u64,
    },
    /// Rank 0's commit did not arrive.
    #[error("receiving rank 0's commit")]
    Broadcast(#[source] gradwire_collective::Error),
    /// Rank 0's commit is not one.
    #[error("rank 0's commit")]
    Commit(#[source] CommitFormatError),
    /// The engine does not start.
    #[error("rank {rank}: starting the engine")]
    Engine {
        /// This rank.
        rank: usize,
        /// Why.
        source: gradwire_train::Error,
    },
    /// The commit does not restore.
    #[error("rank {rank}: restoring step {step}")]
    Restore {
        /// This rank.
        rank: usize,
        /// The commit's step.
        step: u64,
        /// Why.
        source: gradwire_train::Error,
    },
    /// A folder could not be made.
    #[error("creating {}", path.display())]
    Create {
        /// The folder.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Training failed (the model, a commit, a collective of the engine).
    #[error(transparent)]
    Train(#[from] gradwire_train::Error),
    /// The finished epochs could not be read back from `metrics.jsonl`.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// An epoch's record could not be appended.
    #[error(transparent)]
    Record(#[from] RecordError),
    /// The final parameters or `run.json` could not be written.
    #[error(transparent)]
    Rank(#[from] RankError),
    /// An epoch's record could not be turned into JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

impl MemberError {
    /// Whether this is a peer's failure (a transport or collective error anywhere in its
    /// causes, or the engine's): the world is re-formed. Anything else (divergence, a bad
    /// setting) ends this worker.
    pub fn is_peer_failure(&self) -> bool {
        let mut next = self.cause();
        while let Some(e) = next {
            if e.is::<gradwire_transport::Error>()
                || e.is::<gradwire_collective::Error>()
                || matches!(
                    e.downcast_ref::<gradwire_train::Error>(),
                    Some(gradwire_train::Error::Engine(_))
                )
            {
                return true;
            }
            next = e.source();
        }
        false
    }

    /// The innermost cause: the error at the end of the [`Error::source`] chain (this one
    /// where it has none).
    pub fn root_cause(&self) -> &(dyn Error + 'static) {
        let mut e: &(dyn Error + 'static) = self;
        while let Some(next) = e.source() {
            e = next;
        }
        e
    }

    /// The error this one wraps, itself included in the chain walked for peer failures.
    fn cause(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            MemberError::Load { source, .. }
            | MemberError::Engine { source, .. }
            | MemberError::Restore { source, .. }
            | MemberError::Train(source) => Some(source),
            MemberError::Coordinator { source, .. } | MemberError::Membership(source) => {
                Some(source)
            }
            MemberError::Master(e) => Some(e),
            MemberError::Mesh { source, .. } => Some(source),
            MemberError::NoCommit { .. } => None,
            MemberError::Broadcast(e) => Some(e),
            MemberError::Commit(e) => Some(e),
            MemberError::Create { source, .. } | MemberError::Write { source, .. } => Some(source),
            MemberError::Checkpoint(e) => Some(e),
            MemberError::Record(e) => Some(e),
            MemberError::Rank(e) => Some(e),
            MemberError::Json(e) => Some(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_and_engine_failures_are_peer_failures_and_divergence_is_not() {
        let lost = MemberError::Mesh {
            generation: 1,
            master: "127.0.0.1:1".parse().unwrap(),
            source: gradwire_transport::Error::Timeout {
                peer: 2,
                op: gradwire_transport::Op::Recv,
                after: std::time::Duration::from_secs(1),
            },
        };
        assert!(lost.is_peer_failure());
        let diverged = MemberError::Train(gradwire_train::Error::Diverged {
            epoch: 1,
            step: 2,
            loss: f32::NAN,
        });
        assert!(!diverged.is_peer_failure());
        assert!(!MemberError::NoCommit { step: 3 }.is_peer_failure());
        assert_eq!(
            MemberError::NoCommit { step: 3 }.root_cause().to_string(),
            "rank 0 holds no commit of step 3"
        );
    }
}
