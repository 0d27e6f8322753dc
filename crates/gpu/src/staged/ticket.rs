//! A staged collective as its submitter holds it ([`Staged`]): where it is (with the stager's
//! thread, in the engine, or failed before), and the wait that queues the result's copy back
//! to the device on the caller's stream.

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use super::pool::Pool;
use super::{lock, DevicePtr, RawStream, StreamApi};
use crate::error::{Error, Result};

/// Where a staged collective is.
pub(super) enum State {
    /// The stager's thread has not yet handed it to the engine.
    Submitting(Receiver<Result<gradwire_engine::Handle>>),
    /// In the engine.
    Submitted(gradwire_engine::Handle),
    /// Failed before reaching the engine.
    Failed(Error),
}

pub(super) fn stopped() -> Error {
    Error::Stager("its thread stopped before submitting".into())
}

/// A staged collective: [`Staged::test`] never blocks; [`Staged::wait_into`] or
/// [`Staged::wait_host`] wait for it once.
pub struct Staged<A: StreamApi> {
    pub(super) name: String,
    pub(super) len: usize,
    pub(super) state: State,
    pub(super) api: Arc<A>,
    pub(super) pool: Arc<Mutex<Pool<A>>>,
}

impl<A: StreamApi> std::fmt::Debug for Staged<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged")
            .field("name", &self.name)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl<A: StreamApi> Staged<A> {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the engine's result is ready (or the operation failed); never blocks.
    pub fn test(&mut self) -> bool {
        if let State::Submitting(rx) = &self.state {
            self.state = match rx.try_recv() {
                Ok(Ok(h)) => State::Submitted(h),
                Ok(Err(e)) => State::Failed(e),
                Err(std::sync::mpsc::TryRecvError::Empty) => return false,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => State::Failed(stopped()),
            };
        }
        match &self.state {
            State::Submitted(h) => h.test(),
            _ => true,
        }
    }

    /// Waits for the engine's result and returns it on the host.
    pub fn wait_host(self) -> Result<Vec<f32>> {
        let h = match self.state {
            State::Submitting(rx) => rx.recv().unwrap_or_else(|_| Err(stopped()))?,
            State::Submitted(h) => h,
            State::Failed(e) => return Err(e),
        };
        Ok(h.wait()?)
    }

    /// Waits for the engine's result (the host blocks here, and only here), then enqueues
    /// on `stream` its copy, each value multiplied by `scale`, to the `len` floats at `dst`,
    /// and returns without waiting for the GPU: work queued on `stream` afterwards reads the
    /// result.
    ///
    /// # Safety
    /// `dst` must address `len` floats on the device that nothing else writes until the
    /// copy (ordered on `stream`) is done.
    pub unsafe fn wait_into(
        self,
        dst: DevicePtr,
        len: usize,
        stream: RawStream,
        scale: f32,
    ) -> Result<()> {
        let (api, pool) = (self.api.clone(), self.pool.clone());
        let data = self.wait_host()?;
        if data.len() != len {
            return Err(Error::Length {
                want: len,
                got: data.len(),
            });
        }
        let mut buf = lock(&pool).take(len)?;
        {
            // SAFETY: a buffer from the pool has no copy in flight.
            let host = unsafe { A::host_mut(&mut buf) };
            if scale == 1.0 {
                host[..len].copy_from_slice(&data);
            } else {
                for (h, v) in host.iter_mut().zip(&data) {
                    *h = v * scale;
                }
            }
        }
        // SAFETY: `dst` is the caller's; `buf` is not written again until the copy's event
        // completes (the pool holds it until then).
        let up = unsafe { api.copy_up(stream, &buf, dst, len) };
        match up {
            Ok(e) => {
                lock(&pool).give(buf, Some(e));
                Ok(())
            }
            Err(e) => {
                lock(&pool).give(buf, None);
                Err(e)
            }
        }
    }
}
