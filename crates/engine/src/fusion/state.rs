//! A tensor's fusion class ([`Kind`]), its runtime state ([`TensorState`]) and one tensor of a
//! group as the executor sees it ([`Item`]).

use gradwire_codec::Codec;
use gradwire_collective::compressed::{PowerSgdAllReduce, QuantizedAllReduce, StripeAllReduce};

/// How a cached tensor travels (its fusion class).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Dense,
    Gather,
    Sparse,
    /// The tensors of a global-scope top-k policy under the gather strategy: one selection
    /// over their concatenation (the unit's index, see [`Kind::SparseUnit`]).
    GatherUnit(usize),
    /// The tensors of a global-scope top-k policy under the sparse all-reduce: one codec (on
    /// the group's first tensor) selects over their concatenation and one sparse all-reduce
    /// sums it; always one group holding the whole unit.
    SparseUnit(usize),
    Quantized,
    Stripe,
    PowerSgd,
    AllGather,
    Broadcast(usize),
    /// Nothing to move: ready means every rank arrived.
    Barrier,
}

impl Kind {
    pub(super) fn fusable(self) -> bool {
        !matches!(self, Kind::Quantized | Kind::Stripe | Kind::PowerSgd)
    }

    /// A selection unit: its tensors travel together whatever their size.
    pub(super) fn unit(self) -> bool {
        matches!(self, Kind::GatherUnit(_) | Kind::SparseUnit(_))
    }
}

/// Per-tensor runtime state.
pub(crate) struct TensorState {
    pub kind: Kind,
    pub codec: Option<Box<dyn Codec>>,
    pub quantized: Option<QuantizedAllReduce>,
    pub stripe: Option<StripeAllReduce>,
    pub powersgd: Option<PowerSgdAllReduce>,
    pub velocity: Option<Vec<f32>>,
}

/// One tensor of a group: its state and this rank's buffer (replaced by the result).
pub(crate) struct Item<'a> {
    pub state: &'a mut TensorState,
    pub data: &'a mut Vec<f32>,
    /// This rank's payload or pairs when it submitted the tensor pre-encoded (`data` is then
    /// zeros): used instead of encoding `data`, and the codec's state is left as it is.
    /// Only under [`Kind::Gather`] and [`Kind::Sparse`].
    pub encoded: Option<&'a crate::encoded::Encoded>,
    pub progress: gradwire_codec::Progress,
}
