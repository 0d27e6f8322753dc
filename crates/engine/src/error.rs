//! The engine's error type. Errors reach every pending handle, so the type is `Clone`
//! (transport and collective errors are shared through an `Arc`).

use std::sync::Arc;
use std::time::Duration;

use gradwire_codec::ConfigError;

/// Errors of the engine: configuration (at build, before anything runs), negotiation
/// (mismatches and stalls, naming the tensor and the ranks), and communication (naming the
/// failed rank).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A codec spec in the configuration does not parse.
    #[error("codec spec '{spec}': {source}")]
    CodecSpec {
        /// The spec given.
        spec: String,
        /// Why it does not parse.
        source: ConfigError,
    },
    /// A setting is out of range or malformed.
    #[error("invalid engine setting {field}: {reason}")]
    InvalidSetting {
        /// The setting's name.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A rule names (exactly, without wildcard) a tensor that is not in the tensor list.
    #[error("rule '{rule}' names tensor '{tensor}', which is not in the engine's tensor list")]
    UnknownTensorInRule {
        /// The rule, as written.
        rule: String,
        /// The name it gives.
        tensor: String,
    },
    /// The tensor list holds a name twice.
    #[error("tensor '{tensor}' is listed twice")]
    DuplicateTensor {
        /// The repeated name.
        tensor: String,
    },
    /// A codec cannot run under a strategy (e.g. a non-sparsifying codec under `sparse`).
    #[error("tensor '{tensor}': codec '{codec}' cannot run under strategy '{strategy}': {why}")]
    Incompatible {
        /// The tensor whose policy is impossible.
        tensor: String,
        /// The codec's canonical spec.
        codec: String,
        /// The strategy.
        strategy: String,
        /// Why not.
        why: &'static str,
    },
    /// Ranks disagree about a tensor (name, shape, dtype, operation or codec).
    #[error(
        "tensor '{tensor}': ranks {ranks:?} disagree with rank {reference} on its {field} \
         ({detail})"
    )]
    Mismatch {
        /// The tensor.
        tensor: String,
        /// What differs: `name`, `shape`, `dtype`, `op` or `codec`.
        field: &'static str,
        /// The lowest rank that submitted the tensor, whose view the others are compared to.
        reference: usize,
        /// The ranks whose view differs from `reference`'s.
        ranks: Vec<usize>,
        /// The differing values, for the log.
        detail: String,
    },
    /// `all_reduce` or `broadcast` got a buffer of another length than the tensor's shape.
    #[error("tensor '{tensor}': submitted {got} elements, its shape holds {expected}")]
    LengthMismatch {
        /// The tensor.
        tensor: String,
        /// Elements of the registered shape.
        expected: usize,
        /// Elements submitted.
        got: usize,
    },
    /// A tensor was submitted again before its previous submission completed.
    #[error("tensor '{tensor}' submitted again while still pending")]
    AlreadyPending {
        /// The tensor.
        tensor: String,
    },
    /// A tensor was submitted by some ranks but not others for longer than the abort
    /// threshold (the stall inspector).
    #[error(
        "tensor '{tensor}' stalled for {waited:?}: ranks {missing_ranks:?} never submitted it"
    )]
    Stalled {
        /// The tensor.
        tensor: String,
        /// The ranks that had not submitted it.
        missing_ranks: Vec<usize>,
        /// How long the first submitting rank had waited.
        waited: Duration,
    },
    /// The engine shut down while this tensor was submitted by some ranks only.
    #[error("engine shut down before ranks {missing_ranks:?} submitted tensor '{tensor}'")]
    NotSubmittedEverywhere {
        /// The tensor.
        tensor: String,
        /// The ranks that had not submitted it.
        missing_ranks: Vec<usize>,
    },
    /// A collective or the transport failed (a dead or stalled rank, named where known).
    #[error("{}communication failed: {source}", .peer.map(|p| format!("rank {p}: ")).unwrap_or_default())]
    Comm {
        /// The rank the failure concerns, if known.
        peer: Option<usize>,
        /// The underlying error.
        source: Arc<gradwire_collective::Error>,
    },
    /// A peer's negotiation message could not be parsed.
    #[error("rank {peer}: malformed negotiation message ({what})")]
    Protocol {
        /// The sender.
        peer: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// The engine has shut down (or its progress thread is gone).
    #[error("the engine has shut down")]
    ShutDown,
    /// [`Engine::save_state`](crate::Engine::save_state) or
    /// [`Engine::load_state`](crate::Engine::load_state) was called while operations were
    /// submitted and not yet run: a state is taken or restored between steps only (wait on
    /// every handle first).
    #[error(
        "the engine's state is saved and loaded between steps only: {} operation(s) pending \
         ({})",
        .tensors.len(),
        .tensors.join(", ")
    )]
    StatePending {
        /// The tensors submitted and not yet run on this rank.
        tensors: Vec<String>,
    },
    /// A saved [`EngineState`](crate::EngineState) does not fit this engine (another rank,
    /// world size or seed; another tensor list, policy or shape); nothing was loaded.
    #[error(
        "saved state does not fit this engine: {}{field} is {saved} in the state, {here} here",
        .tensor.as_ref().map(|t| format!("tensor '{t}': ")).unwrap_or_default()
    )]
    StateMismatch {
        /// The tensor concerned (`None` for the engine's own fields).
        tensor: Option<String>,
        /// What differs: `rank`, `world size`, `seed`, `tensor` (a name at a position,
        /// or a tensor missing or extra), `policy`, `shape` or `velocity`.
        field: &'static str,
        /// The state's value.
        saved: String,
        /// This engine's value.
        here: String,
    },
    /// A tensor's saved codec or all-reduce state was refused by its codec or all-reduce
    /// (damaged, or saved by another configuration); nothing was loaded.
    #[error("tensor '{tensor}': saved state refused: {source}")]
    StateRefused {
        /// The tensor.
        tensor: String,
        /// Why its codec or all-reduce refused the state.
        source: gradwire_codec::DecodeError,
    },
    /// Bytes that are not a saved engine state
    /// ([`EngineState::from_bytes`](crate::EngineState::from_bytes)).
    #[error("engine state: {0}")]
    StateFormat(#[from] crate::StateFormatError),
    /// [`Engine::all_reduce_encoded`](crate::Engine::all_reduce_encoded) refused a
    /// pre-encoded submission before queueing it (the engine stays usable).
    #[error("tensor '{tensor}': pre-encoded submission refused: {reason}")]
    EncodedRefused {
        /// The tensor named in the submission.
        tensor: String,
        /// Why.
        reason: EncodedRefusal,
    },
    /// Writing or reading a timeline file failed.
    #[error("timeline file {path}: {reason}")]
    Timeline {
        /// The file.
        path: String,
        /// What failed.
        reason: String,
    },
}

/// Why [`Engine::all_reduce_encoded`](crate::Engine::all_reduce_encoded) refused a payload
/// ([`Error::EncodedRefused`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodedRefusal {
    /// The name is not a registered tensor's.
    #[error("not a registered tensor")]
    NotRegistered,
    /// The tensor's strategy does not run a per-tensor encode (only `gather` and `sparse`
    /// do).
    #[error("its strategy '{0}' takes dense data only (payloads: gather and sparse)")]
    Strategy(crate::Strategy),
    /// The tensor belongs to a selection unit (`topk:scope=global` over several tensors):
    /// one codec selects over all of them at once.
    #[error("it belongs to a selection unit (topk scope=global over several tensors)")]
    SelectionUnit,
    /// The codec agrees on shared scalars in the round before it encodes (TernGrad), so a
    /// payload made before the round cannot be the one the engine would have made.
    #[error("codec '{0}' encodes with scalars agreed in the round")]
    SharedScalars(String),
    /// The engine's momentum correction runs on the dense data before its encode.
    #[error("momentum correction is on (it runs on the dense data before the encode)")]
    Momentum,
    /// A sparse codec whose payload cannot be read back as its exact (index, value) pairs.
    #[error("codec '{0}' under the sparse strategy: its payload does not give back its pairs")]
    Unsupported(String),
    /// The payload is not one the tensor's codec wrote for it (header or body).
    #[error("bad payload: {0}")]
    Payload(gradwire_codec::DecodeError),
}

impl Error {
    /// The rank this error concerns, where there is one (a failed peer).
    pub fn peer(&self) -> Option<usize> {
        match self {
            Error::Comm { peer, .. } => *peer,
            Error::Protocol { peer, .. } => Some(*peer),
            _ => None,
        }
    }
}

impl From<gradwire_collective::Error> for Error {
    fn from(e: gradwire_collective::Error) -> Self {
        Error::Comm {
            peer: e.peer(),
            source: Arc::new(e),
        }
    }
}

impl From<gradwire_transport::Error> for Error {
    fn from(e: gradwire_transport::Error) -> Self {
        gradwire_collective::Error::from(e).into()
    }
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, Error>;
