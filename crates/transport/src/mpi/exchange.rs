//! One call's worth of messaging ([`Mpi`]'s `exchange`): an optional `MPI_Isend` from the
//! staging buffer and an optional `MPI_Improbe`/`MPI_Imrecv`, driven together until both are
//! done or the deadline passes, and the buffers MPI still holds after an error
//! ([`Stranded`]; see the module docs of [`super`]).

use std::ffi::c_int;
use std::time::Instant;

use mpi::ffi;

use super::{error_string, Mpi, MAX_MESSAGE, TAG};
use crate::{Error, Op, Result};

/// A request MPI still holds, with the buffer it reads or writes: kept until MPI lets go.
pub(super) struct Stranded {
    pub(super) req: ffi::MPI_Request,
    pub(super) _buf: Vec<u8>,
}

impl Mpi {
    fn check(&self, peer: usize, len: usize) -> Result<()> {
        crate::check_rank(peer, self.world_size)?;
        if len > MAX_MESSAGE {
            return Err(Error::FrameTooLarge {
                peer,
                len: len as u64,
                max: MAX_MESSAGE as u64,
            });
        }
        Ok(())
    }

    fn mpi_err(peer: usize, op: Op, call: &str, rc: c_int) -> Error {
        Error::Mpi {
            peer: Some(peer),
            code: rc,
            message: format!("{call} during {op}: {}", error_string(rc)),
        }
    }

    /// Lets go of stranded buffers whose requests MPI has finished.
    fn reap(&mut self) {
        self.stranded.retain_mut(|s| {
            let mut flag: c_int = 0;
            // SAFETY: `s.req` is an active request whose buffer `s` still owns.
            let rc = unsafe { ffi::MPI_Test(&mut s.req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            rc == 0 && flag == 0
        });
    }

    /// One call's worth of messaging: an optional send and an optional receive, driven
    /// together until both are done or the deadline passes.
    ///
    /// Longer than 120 lines on purpose: one test loop over the two MPI requests, whose
    /// buffers' lifetimes are argued once, in the SAFETY comment at its top; split up, that
    /// argument would have to hold across functions.
    pub(super) fn exchange(
        &mut self,
        send: Option<(usize, &[u8])>,
        recv: Option<(usize, Sink<'_>)>,
    ) -> Result<()> {
        if let Some((to, msg)) = send {
            self.check(to, msg.len())?;
        }
        if let Some((from, _)) = &recv {
            self.check(*from, 0)?;
        }
        if !self.stranded.is_empty() {
            self.reap();
        }
        // SAFETY (whole function): every pointer handed to MPI is either our staging buffer
        // or the receive target, which stay alive and untouched until the request completes
        // or is stranded together with its (owned) buffer; the slice case never returns
        // while its request is active (it aborts instead).
        let null_req = unsafe { ffi::RSMPI_REQUEST_NULL };
        let mut sreq = null_req;
        let mut send_len = 0;
        let to = send.map(|(to, _)| to).unwrap_or(0);
        if let Some((to, msg)) = send {
            self.stage.clear();
            self.stage.extend_from_slice(msg);
            send_len = msg.len();
            let rc = unsafe {
                ffi::MPI_Isend(
                    self.stage.as_ptr().cast(),
                    msg.len() as c_int,
                    ffi::RSMPI_UINT8_T,
                    to as c_int,
                    TAG,
                    self.comm,
                    &mut sreq,
                )
            };
            if rc != 0 {
                return Err(Self::mpi_err(to, Op::Send, "MPI_Isend", rc));
            }
        }
        let mut send_done = send.is_none();
        let (from, mut sink) = match recv {
            Some((f, s)) => (f, Some(s)),
            None => (0, None),
        };
        let mut recv_state = if sink.is_some() {
            RecvState::Probing
        } else {
            RecvState::Done
        };
        let mut rreq = null_req;
        // A message of the wrong length for a slice target lands here, to report it.
        let mut wrong_len: Option<Vec<u8>> = None;
        let mut deadline = Instant::now() + self.timeout;
        let mut overtime = false;
        let mut idle = 0u32;
        let outcome: Result<()> = loop {
            let mut progressed = false;
            if !send_done {
                let mut flag: c_int = 0;
                let rc = unsafe { ffi::MPI_Test(&mut sreq, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                if rc != 0 {
                    break Err(Self::mpi_err(to, Op::Send, "MPI_Test", rc));
                }
                if flag != 0 {
                    send_done = true;
                    progressed = true;
                    self.bytes_sent += send_len as u64;
                }
            }
            match recv_state {
                RecvState::Probing => {
                    let mut flag: c_int = 0;
                    let mut message: ffi::MPI_Message = unsafe { ffi::RSMPI_MESSAGE_NULL };
                    let mut status: ffi::MPI_Status = unsafe { std::mem::zeroed() };
                    let rc = unsafe {
                        ffi::MPI_Improbe(
                            from as c_int,
                            TAG,
                            self.comm,
                            &mut flag,
                            &mut message,
                            &mut status,
                        )
                    };
                    if rc != 0 {
                        break Err(Self::mpi_err(from, Op::Recv, "MPI_Improbe", rc));
                    }
                    if flag != 0 {
                        progressed = true;
                        let mut count: c_int = 0;
                        let rc =
                            unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
                        if rc != 0 || count < 0 {
                            break Err(Self::mpi_err(from, Op::Recv, "MPI_Get_count", rc));
                        }
                        let n = count as usize;
                        let target: *mut u8 = match sink.as_mut().expect("receiving") {
                            Sink::Vec(v) => {
                                v.clear();
                                v.resize(n, 0);
                                v.as_mut_ptr()
                            }
                            Sink::Slice(s) if s.len() == n => s.as_mut_ptr(),
                            Sink::Slice(_) => wrong_len.insert(vec![0u8; n]).as_mut_ptr(),
                        };
                        let rc = unsafe {
                            ffi::MPI_Imrecv(
                                target.cast(),
                                count,
                                ffi::RSMPI_UINT8_T,
                                &mut message,
                                &mut rreq,
                            )
                        };
                        if rc != 0 {
                            break Err(Self::mpi_err(from, Op::Recv, "MPI_Imrecv", rc));
                        }
                        recv_state = RecvState::Receiving;
                    }
                }
                RecvState::Receiving => {
                    let mut flag: c_int = 0;
                    let rc =
                        unsafe { ffi::MPI_Test(&mut rreq, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
                    if rc != 0 {
                        break Err(Self::mpi_err(from, Op::Recv, "MPI_Test", rc));
                    }
                    if flag != 0 {
                        progressed = true;
                        recv_state = RecvState::Done;
                    }
                }
                RecvState::Done => {}
            }
            if send_done && recv_state == RecvState::Done {
                break Ok(());
            }
            if progressed {
                idle = 0;
                deadline = Instant::now() + self.timeout;
                continue;
            }
            idle = idle.wrapping_add(1);
            if idle > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            if !idle.is_multiple_of(16) || Instant::now() < deadline {
                continue;
            }
            // The deadline passed with no progress. A slice receive half-way through its
            // message gets one more deadline (see the module docs).
            let slice_active = recv_state == RecvState::Receiving
                && wrong_len.is_none()
                && matches!(sink, Some(Sink::Slice(_)));
            if slice_active && !overtime {
                tracing::warn!(
                    peer = from,
                    "rank {from}: message stalled half-way for {:?}; waiting one more \
                     deadline before aborting the job",
                    self.timeout
                );
                overtime = true;
                deadline = Instant::now() + self.timeout;
                continue;
            }
            let (peer, op) = if recv_state != RecvState::Done {
                (from, Op::Recv)
            } else {
                (to, Op::Send)
            };
            break Err(Error::Timeout {
                peer,
                op,
                after: self.timeout,
            });
        };
        if let Err(err) = outcome {
            // Keep every buffer MPI may still touch (see the module docs).
            if !send_done {
                let buf = std::mem::take(&mut self.stage);
                self.stranded.push(Stranded {
                    req: sreq,
                    _buf: buf,
                });
            }
            if recv_state == RecvState::Receiving {
                let buf = match (wrong_len.take(), sink) {
                    (Some(b), _) => b,
                    (None, Some(Sink::Vec(v))) => std::mem::take(v),
                    (None, _) => abort_job(self.rank, &err),
                };
                self.stranded.push(Stranded {
                    req: rreq,
                    _buf: buf,
                });
            }
            return Err(err);
        }
        if let (Some(got), Some(Sink::Slice(s))) = (wrong_len, &sink) {
            return Err(Error::SizeMismatch {
                peer: from,
                expected: s.len(),
                got: got.len(),
            });
        }
        Ok(())
    }
}

/// Ends the whole MPI job after `err`: used only where returning would leave MPI writing
/// into memory the caller owns again.
fn abort_job(rank: usize, err: &Error) -> ! {
    let msg = format!(
        "gradwire mpi: rank {rank}: {err}; a receive into the caller's buffer is still in \
         flight, aborting the MPI job"
    );
    tracing::error!("{msg}");
    eprintln!("{msg}");
    // SAFETY: MPI is initialized; MPI_Abort does not return in practice.
    unsafe { ffi::MPI_Abort(ffi::RSMPI_COMM_WORLD, 1) };
    std::process::abort()
}

/// Where a receive lands.
pub(super) enum Sink<'a> {
    Vec(&'a mut Vec<u8>),
    Slice(&'a mut [u8]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecvState {
    Probing,
    Receiving,
    Done,
}
