//! Splitting an [`Mpi`] into groups: the ranks agree on the groups over the transport, then
//! `MPI_Comm_split` gives each group a communicator of its own, numbered as agreed.

use std::ffi::c_int;
use std::sync::Arc;

use mpi::ffi;

use super::{error_string, Mpi};
use crate::split::{self, Group, Split};
use crate::{Error, Result};

/// `MPI_Comm_split` on the transport's communicator, after the ranks agreed on the groups
/// (see the [module docs](super)).
impl Split for Mpi {
    fn split(&mut self, color: u32, key: u32) -> Result<Group> {
        if !self.thread_multiple() {
            return Err(Error::Env {
                reason: format!(
                    "splitting the mpi transport needs MPI_THREAD_MULTIPLE (its groups are                      used from several threads); the library offers {:?}",
                    self.threading
                ),
            });
        }
        let seq = self.splits;
        self.splits += 1;
        let plan = split::agree(self, seq, color, key)?;
        // MPI takes a non-negative `int` color and an `int` key: the group's lowest parent
        // rank names it, and the group rank the plan gave orders it (MPI then numbers the
        // members exactly as the plan does).
        let mpi_color = plan
            .members
            .iter()
            .copied()
            .min()
            .expect("a rank is in its group");
        let (Ok(mpi_color), Ok(mpi_key)) = (c_int::try_from(mpi_color), c_int::try_from(plan.rank))
        else {
            return Err(Error::Misuse {
                what: "a group rank beyond MPI's int",
            });
        };
        let mut comm: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
        // SAFETY: a valid communicator; the out-pointer is a valid local.
        let rc = unsafe { ffi::MPI_Comm_split(self.comm, mpi_color, mpi_key, &mut comm) };
        if rc != 0 {
            return Err(plan.name_error(Error::Mpi {
                peer: None,
                code: rc,
                message: format!("MPI_Comm_split: {}", error_string(rc)),
            }));
        }
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: `comm` is the new, valid communicator; the out-pointers are valid locals.
        let rc = unsafe {
            let mut rc = ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN);
            if rc == 0 {
                rc = ffi::MPI_Comm_rank(comm, &mut rank);
            }
            if rc == 0 {
                rc = ffi::MPI_Comm_size(comm, &mut size);
            }
            rc
        };
        let numbered_alike = rank as usize == plan.rank && size as usize == plan.members.len();
        if rc != 0 || !numbered_alike {
            // SAFETY: the communicator was created above and is used by nothing else.
            unsafe { ffi::MPI_Comm_free(&mut comm) };
            return Err(plan.name_error(if rc != 0 {
                Error::Mpi {
                    peer: None,
                    code: rc,
                    message: format!("setting up the group's communicator: {}", error_string(rc)),
                }
            } else {
                Error::Misuse {
                    what: "MPI_Comm_split numbered the group unlike the agreed plan",
                }
            }));
        }
        let sub = Mpi {
            comm,
            rank: plan.rank,
            world_size: plan.members.len(),
            timeout: self.timeout,
            bytes_sent: 0,
            stage: Vec::new(),
            stranded: Vec::new(),
            in_place: self.in_place,
            library: self.library.clone(),
            threading: self.threading,
            splits: 0,
            _universe: Arc::clone(&self._universe),
        };
        tracing::debug!(
            rank = self.rank,
            color,
            group_rank = plan.rank,
            "mpi group communicator up"
        );
        Ok(Group::new(Box::new(sub), plan.color, plan.members))
    }
}
