//! MPI's own collectives on the transport's communicator ([`Mpi::native_all_reduce_f32`],
//! [`Mpi::native_barrier`]): blocking, with no deadline.

use std::ffi::{c_int, c_void};

use mpi::ffi;

use super::{error_string, Mpi, MAX_MESSAGE};
#[cfg(doc)]
use crate::Transport;
use crate::{Error, Result};

/// The reduction of [`Mpi::native_all_reduce_f32`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeOp {
    /// Element-wise sum (`MPI_SUM`).
    Sum,
    /// Sum divided by the world size.
    Mean,
    /// Element-wise minimum (`MPI_MIN`).
    Min,
    /// Element-wise maximum (`MPI_MAX`).
    Max,
}

impl Mpi {
    /// MPI's own `MPI_Allreduce` over `buf`, in place: the library's tuned algorithm, for
    /// comparison with ours or as the dense path when running under MPI. Blocking, with no
    /// deadline (a stalled rank hangs it); every rank must call it with the same length.
    /// MPI does not say what it sent, so [`Transport::bytes_sent`] does not count it.
    pub fn native_all_reduce_f32(&mut self, buf: &mut [f32], op: NativeOp) -> Result<()> {
        let count = c_int::try_from(buf.len()).map_err(|_| Error::FrameTooLarge {
            peer: self.rank,
            len: buf.len() as u64,
            max: MAX_MESSAGE as u64,
        })?;
        // SAFETY: the op and datatype handles are MPI's predefined constants.
        let mpi_op = unsafe {
            match op {
                NativeOp::Sum | NativeOp::Mean => ffi::RSMPI_SUM,
                NativeOp::Min => ffi::RSMPI_MIN,
                NativeOp::Max => ffi::RSMPI_MAX,
            }
        };
        let rc = match self.in_place {
            // SAFETY: MPI_IN_PLACE as the send buffer, `buf` valid for `count` floats.
            Some(p) => unsafe {
                ffi::MPI_Allreduce(
                    p as *const c_void,
                    buf.as_mut_ptr().cast(),
                    count,
                    ffi::RSMPI_FLOAT,
                    mpi_op,
                    self.comm,
                )
            },
            None => {
                let send = buf.to_vec();
                // SAFETY: distinct send and receive buffers of `count` floats.
                unsafe {
                    ffi::MPI_Allreduce(
                        send.as_ptr().cast(),
                        buf.as_mut_ptr().cast(),
                        count,
                        ffi::RSMPI_FLOAT,
                        mpi_op,
                        self.comm,
                    )
                }
            }
        };
        if rc != 0 {
            return Err(Error::Mpi {
                peer: None,
                code: rc,
                message: format!("MPI_Allreduce: {}", error_string(rc)),
            });
        }
        if op == NativeOp::Mean {
            let n = self.world_size as f32;
            buf.iter_mut().for_each(|x| *x /= n);
        }
        Ok(())
    }

    /// MPI's own `MPI_Barrier` on the transport's communicator (blocking, no deadline).
    pub fn native_barrier(&mut self) -> Result<()> {
        // SAFETY: a valid communicator.
        let rc = unsafe { ffi::MPI_Barrier(self.comm) };
        if rc != 0 {
            return Err(Error::Mpi {
                peer: None,
                code: rc,
                message: format!("MPI_Barrier: {}", error_string(rc)),
            });
        }
        Ok(())
    }
}
