//! The stager's thread: it takes the submissions in order and hands each to the engine once
//! its copy down has completed (the host copy, through `Engine::all_reduce`/`broadcast`) or
//! once the encoder has encoded it on the device (the payload, through
//! `Engine::all_reduce_encoded`), and counts what came to the host.

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

use gradwire_codec::Progress;
use gradwire_engine::Engine;

use super::pool::Pool;
use super::{lock, DevicePtr, Job, Op, Shared, StagerStats, StreamApi};
use crate::error::{Error, Result};

/// What the stager's thread owns.
pub(super) struct Worker<A: StreamApi> {
    pub(super) api: Arc<A>,
    pub(super) pool: Arc<Mutex<Pool<A>>>,
    pub(super) engine: Arc<Engine>,
    pub(super) encoder: Option<Shared<A>>,
    pub(super) stats: Arc<Mutex<StagerStats>>,
}

impl<A: StreamApi> Worker<A> {
    /// Submissions in order, each once its copy down (or its encode) is done.
    pub(super) fn run(self, rx: Receiver<Job<A>>) {
        for job in rx {
            match job {
                Job::Flush => self.engine.flush(),
                Job::Submit {
                    op,
                    copied,
                    buf,
                    len,
                    prescale,
                    reply,
                } => {
                    let outcome = self.submit(op, &copied, buf, len, prescale);
                    // A caller that dropped its ticket no longer wants the handle.
                    let _ = reply.send(outcome);
                }
                Job::Encode {
                    name,
                    src,
                    len,
                    ready,
                    progress,
                    reply,
                } => {
                    let outcome = self.encode(&name, src, len, &ready, progress);
                    let _ = reply.send(outcome);
                }
            }
        }
    }

    fn submit(
        &self,
        op: Op,
        copied: &A::Event,
        mut buf: A::Pinned,
        len: usize,
        prescale: f32,
    ) -> Result<gradwire_engine::Handle> {
        // On an error the copy's state is unknown: the buffer is not reused.
        self.api.synchronize(copied)?;
        // SAFETY: the copy down into `buf` has completed, and nothing else has it.
        let host = unsafe { A::host_mut(&mut buf) };
        let data: Vec<f32> = if prescale == 1.0 {
            host[..len].to_vec()
        } else {
            host[..len].iter().map(|v| v * prescale).collect()
        };
        lock(&self.pool).give(buf, None);
        {
            let mut st = lock(&self.stats);
            st.staged += 1;
            st.staged_bytes += (len * std::mem::size_of::<f32>()) as u64;
        }
        Ok(match op {
            Op::AllReduce(name) => self.engine.all_reduce(&name, data),
            Op::Broadcast(name, root) => self.engine.broadcast(&name, data, root),
        })
    }

    fn encode(
        &self,
        name: &str,
        src: DevicePtr,
        len: usize,
        ready: &A::Event,
        progress: Progress,
    ) -> Result<gradwire_engine::Handle> {
        let enc = self
            .encoder
            .as_ref()
            .ok_or_else(|| Error::Stager("an encode without an encoder".into()))?;
        let mut payload = Vec::new();
        // SAFETY: `src` is the submitter's (its contract holds until the handle is waited
        // on, which is after this), and the encoder waits for `ready` before reading it.
        unsafe { lock(enc).encode(name, src, len, ready, progress, &mut payload) }?;
        {
            let mut st = lock(&self.stats);
            st.encoded += 1;
            st.encoded_bytes += (len * std::mem::size_of::<f32>()) as u64;
            st.payload_bytes += payload.len() as u64;
        }
        Ok(self.engine.all_reduce_encoded(name, payload))
    }
}
