//! Tensor fusion: ready tensors of one kind are packed into groups of at most
//! `fusion_bytes` raw fp32 bytes (`plan_groups`) and each group travels as one collective.
//!
//! **Fused and unfused results are bit-identical**, by construction, per strategy:
//! - *dense* with [`DenseAlgorithm::Canonical`](crate::DenseAlgorithm): every element is summed
//!   in an order set by the world alone (the hypercube tree on power-of-two worlds, rank order
//!   otherwise) whatever its position in the buffer (see `dense.rs`); with
//!   `DenseAlgorithm::Tree` (always Rabenseifner) along the hypercube tree. With
//!   `DenseAlgorithm::Collective` this does **not** hold (a ring sums an element in an order
//!   set by its chunk), and is not claimed.
//! - *gather*: codec state and encoding stay per tensor; only the payloads are concatenated
//!   (each with a u32 length) into one all-gather; shared scalars (TernGrad) of all tensors go
//!   in one max all-reduce (max is exact); each tensor decodes its ranks' payloads in rank
//!   order exactly as `GatherDecode` does.
//! - *sparse*: each tensor selects its pairs with its own codec; the pair lists are
//!   concatenated with index offsets and summed by one sparse all-reduce over the fused index
//!   space. Each index's sum has the same operands in the same recursive-doubling order as
//!   unfused (the dense switch changes the encoding, not the arithmetic; `x + 0.0 == x` except
//!   for `-0.0`).
//! - *pre-encoded* submissions ([`crate::Engine::all_reduce_encoded`], gather and sparse
//!   only): the rank's payload takes the place of its encode under gather, the pairs read
//!   back from it the place of its `encode_sparse` under sparse; the rest is as above.
//! - *selection units* (`topk:scope=global` under sparse or gather): the unit's tensors are
//!   always one group, whatever `fusion_bytes` says, and one codec selects over their
//!   concatenation (the unit's definition, not an optimization: there is no unfused form).
//! - *quantized*: never fused (the ring's chunks, hence each chunk codec's quantization and the
//!   summation order, depend on the tensor's length).
//! - *stripe*, *powersgd*: never fused either: the stripes (whole columns of each tensor) and
//!   PowerSGD's `P`/`Q` factors are planned per tensor, with their residuals and warm-start
//!   `Q` in the tensor's state; a group of whatever happened to be ready together would need
//!   other plans (and other results) every cycle. Each tensor runs its own
//!   `StripeAllReduce` / `PowerSgdAllReduce`, exactly as run directly.
//! - all-gather: payloads concatenated; broadcast: one broadcast per root.
//!
//! Files: `state.rs` (a tensor's fusion class and runtime state), `plan.rs` (grouping ready
//! tensors), `clock.rs` (a group's timeline phases), `pack.rs` (laying tensors end to end and
//! back, splitting fused payloads), `exec.rs` (the executor that runs one group).

mod clock;
mod exec;
mod pack;
mod plan;
mod state;

pub(crate) use clock::Clock;
pub(crate) use exec::Exec;
pub(crate) use plan::plan_groups;
pub(crate) use state::{Item, Kind, TensorState};
