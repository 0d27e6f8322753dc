//! One worker of an elastic all-reduce run (`gradwire train --elastic MIN:MAX`; TorchElastic's
//! rendezvous, Horovod Elastic's `hvd.elastic.run` with `state.commit()`), generation after
//! generation until the run ends ([`run_member`]).
//!
//! The membership coordinator (`gradwire_run::elastic`) forms each *generation* of the
//! world: every process learns its rank and world size from it and builds a fresh TCP mesh
//! under the generation's job id and the job's token. Every `--commit-every` steps each rank
//! commits its state in memory (`Trainer::commit`: parameters, optimizer, codec residuals,
//! the epoch's order; the two newest are kept).
//!
//! - **A rank dies** (or stalls past the transport's deadline): the survivors' collectives
//!   fail naming it ([`MemberError::is_peer_failure`]), each asks the coordinator for the
//!   next world with the steps of the commits it holds; the coordinator forms a generation
//!   of the survivors (and any waiting joiner) at the newest step all of them committed.
//!   Rank 0 broadcasts its commit, every rank restores it (`Trainer::restore_elsewhere`:
//!   its own codec state where it fits, the epoch's untaken samples, the lost rank's too,
//!   dealt over the new world) and training goes on with fewer ranks, losing at most the
//!   steps since the last commit. A lost rank's codec residual is lost with it (see
//!   `gradwire_train::elastic`).
//! - **A process joins**: it waits at the coordinator; at the next commit rank 0 learns of
//!   it, the ranks agree, and the next generation admits it; it receives the state by the
//!   same broadcast and starts with fresh codec state.
//! - The learning rate is kept as it is when the world (and so the global batch) changes,
//!   as Horovod Elastic does by default.
//!
//! Rank 0 of the current generation reports the epochs ([`ElasticProgress`];
//! `metrics.jsonl` continues across generations, an epoch re-run after a restore replaces
//! its line) and, at the end, writes `run.json` with the membership events (`membership`:
//! each generation's cause, world sizes, restore step, steps lost, and the seconds from
//! detection to the new world and to training again).

mod error;
mod generation;
mod kept;
mod progress;

use std::time::Duration;

use gradwire_run::elastic::Member;
use gradwire_run::launch::elastic::{transport_timeout, EVICT_MARGIN};

pub use error::MemberError;
pub use progress::ElasticProgress;

use crate::elastic::Elastic;
use crate::Plan;
use generation::{generation, End, Generation};
use kept::Kept;

/// Re-forms in a row without a training step after which a worker gives up.
pub const MAX_IDLE_REFORMS: u32 = 5;

/// One worker of an elastic run, generation after generation, until the run ends.
/// `threads_given`: whether the plan's thread count was asked for (else the host's cores
/// are shared among the launcher's processes, `GRADWIRE_LOCAL_SIZE`). The mesh's token is
/// `GRADWIRE_TOKEN`.
pub fn run_member(
    plan: &Plan,
    elastic: &Elastic,
    mut member: Member,
    threads_given: bool,
    progress: &mut dyn ElasticProgress,
) -> Result<(), MemberError> {
    let local = std::env::var("GRADWIRE_LOCAL_SIZE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let threads = match local {
        Some(n) if !threads_given => gradwire_train::threads_per_worker(
            std::thread::available_parallelism().map_or(1, |c| c.get()),
            n,
        ),
        _ => plan.threads,
    };
    gradwire_train::init_threads(threads);
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .map_err(|source| MemberError::Load {
            dataset: plan.dataset.name(),
            source,
        })?;
    let token = std::env::var("GRADWIRE_TOKEN").unwrap_or_default();
    let mut kept = Kept::default();
    // The longest a world may take to form: survivors awaited, then joiners awaited.
    let wait = 3 * (transport_timeout() + EVICT_MARGIN) + Duration::from_secs(120);
    // Re-forms in a row without a step taken: a failure the peers did not cause (one that
    // recurs in every world) ends the worker instead of looping.
    let mut idle_reforms = 0;
    loop {
        let before = kept.reached;
        let world = member
            .next_world(&kept.steps(), kept.reached, wait)
            .map_err(|source| MemberError::Coordinator {
                what: "asking the elastic coordinator for the next world",
                source,
            })?;
        let g = Generation {
            plan,
            elastic,
            data: &data,
            token: &token,
            world: &world,
        };
        match generation(&g, &mut member, &mut kept, progress) {
            Ok(End::Finished) => {
                return member.done().map_err(|source| MemberError::Coordinator {
                    what: "telling the coordinator the run is done",
                    source,
                });
            }
            Ok(End::Grow) => continue,
            Err(e) if e.is_peer_failure() && idle_reforms < MAX_IDLE_REFORMS => {
                idle_reforms = if kept.reached > before {
                    0
                } else {
                    idle_reforms + 1
                };
                progress.note(&format!(
                    "generation {} rank {}: {}; re-forming the world",
                    world.generation,
                    world.rank,
                    e.root_cause()
                ));
            }
            Err(e) => return Err(e),
        }
    }
}
