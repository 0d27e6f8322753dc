//! Device tensors through `gradwire-engine`: Aluminum's host-transfer path, stream-ordered
//! and non-blocking, with the engine's negotiation, fusion and per-tensor policies.
//!
//! A gradient that lives on the GPU is submitted as a device pointer and the stream its
//! producer runs on ([`Stager::all_reduce`]). Nothing blocks the caller:
//!
//! 1. the copy down (device → a pinned host buffer) is enqueued on the caller's stream, so it
//!    starts after the kernels already queued there (the backward pass that produces the
//!    gradient), and an event is recorded after it;
//! 2. the stager's thread waits for that event (the host waits, but on the stager's thread,
//!    not the caller's) and submits the host copy to the engine, which negotiates, fuses,
//!    compresses per the tensor's policy and all-reduces it as it does any tensor;
//! 3. [`Staged::wait_into`] waits for the engine's result (the host waits only when asked,
//!    as in Aluminum) and enqueues the copy up on the stream the caller names: kernels the
//!    caller queues on that stream afterwards (the optimizer step) see the sum, without the
//!    host ever waiting for the GPU.
//!
//! With an [`Encoder`] ([`Stager::with_encoder`]; on a GPU, [`device_codecs::DeviceCodecs`]),
//! a tensor whose policy's codec runs on the device is not copied down at all: the stager's
//! thread has the device codec encode it once its producer's event has completed, and
//! submits only the payload (`Engine::all_reduce_encoded`), which is byte for byte the
//! payload the engine's own codec would have written. [`Stager::stats`] counts both paths'
//! bytes to the host.
//!
//! Pinned buffers come from a [`pool`] and return to it tagged with the event of the copy
//! that last uses them; a buffer is handed out again only once that event has completed.
//!
//! The device is reached through the [`StreamApi`] trait: [`cuda::CudaApi`] (behind the
//! `cuda` feature) calls the CUDA driver on raw pointers and streams (a PyTorch tensor's
//! `data_ptr()` and `torch.cuda.current_stream().cuda_stream` in the primary context, which
//! PyTorch and cudarc share), and the tests run the same code against a host simulation of
//! streams and events, so the ordering and buffer reuse are checked without a GPU.
//!
//! Deviation from Aluminum, deliberate: completion is host-driven. Aluminum can make a
//! stream wait on a flag that its progress thread sets (`cuStreamWaitValue32`), so that not
//! even the wait is on the host; here the caller's thread calls [`Staged::wait_into`], which
//! returns as soon as the copy up is enqueued. A stream waiting on a flag that a dead peer
//! never lets be set would hang the GPU with no error to report; a host wait ends in the
//! engine's error naming the peer.

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod device_codecs;
mod encoder;
pub mod pool;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;
mod ticket;
mod worker;

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use gradwire_codec::Progress;
use gradwire_engine::Engine;

use crate::error::{Error, Result};
pub use encoder::{Encoder, StagerStats};
use pool::Pool;
pub use ticket::Staged;
use ticket::{stopped, State};
use worker::Worker;

/// A device address (a `CUdeviceptr`, or `tensor.data_ptr()` of a CUDA tensor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePtr(pub u64);

/// A stream handle (a `CUstream`, or `torch.cuda.current_stream().cuda_stream`); `0` is the
/// legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawStream(pub u64);

/// What the staged path needs from a GPU: pinned host buffers, copies enqueued on a
/// caller's stream, and events to wait for or ask about.
pub trait StreamApi: Send + Sync + 'static {
    /// A pinned (page-locked) host buffer of `f32`.
    type Pinned: Send + 'static;
    /// A completion marker recorded on a stream.
    type Event: Send + 'static;

    /// A pinned buffer of `len` floats.
    fn alloc_pinned(&self, len: usize) -> Result<Self::Pinned>;

    /// Its length in floats.
    fn pinned_len(buf: &Self::Pinned) -> usize;

    /// Its contents, to write.
    ///
    /// # Safety
    /// No copy that reads or writes the buffer may be in flight.
    unsafe fn host_mut(buf: &mut Self::Pinned) -> &mut [f32];

    /// Enqueues on `stream` a copy of `len` floats from `src` into `dst`, and returns an
    /// event recorded after it.
    ///
    /// # Safety
    /// `src` must address `len` floats on this device that stay allocated until the copy
    /// is done; `dst` must hold `len` floats and not be touched until the event completes.
    unsafe fn copy_down(
        &self,
        stream: RawStream,
        src: DevicePtr,
        dst: &mut Self::Pinned,
        len: usize,
    ) -> Result<Self::Event>;

    /// Enqueues on `stream` a copy of the first `len` floats of `src` to `dst`, and returns
    /// an event recorded after it.
    ///
    /// # Safety
    /// `dst` must address `len` floats on this device that nothing else writes until the
    /// copy is done; `src` must not be written until the event completes.
    unsafe fn copy_up(
        &self,
        stream: RawStream,
        src: &Self::Pinned,
        dst: DevicePtr,
        len: usize,
    ) -> Result<Self::Event>;

    /// An event recorded on `stream` now (after the work queued there so far).
    fn record(&self, stream: RawStream) -> Result<Self::Event>;

    /// Blocks the calling thread until `event` has completed.
    fn synchronize(&self, event: &Self::Event) -> Result<()>;

    /// Whether `event` has completed; never blocks.
    fn is_done(&self, event: &Self::Event) -> Result<bool>;
}

/// Which collective a staged tensor goes through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    AllReduce(String),
    Broadcast(String, usize),
}

impl Op {
    fn name(&self) -> &str {
        match self {
            Op::AllReduce(n) | Op::Broadcast(n, _) => n,
        }
    }
}

/// Work for the stager's thread, in submission order.
pub(crate) enum Job<A: StreamApi> {
    Submit {
        op: Op,
        copied: A::Event,
        buf: A::Pinned,
        len: usize,
        prescale: f32,
        reply: Sender<Result<gradwire_engine::Handle>>,
    },
    Encode {
        name: String,
        src: DevicePtr,
        len: usize,
        ready: A::Event,
        progress: Progress,
        reply: Sender<Result<gradwire_engine::Handle>>,
    },
    Flush,
}

/// The encoder and the stager's decision per tensor name (encoded on the device or not).
pub(crate) type Shared<A> = Arc<Mutex<Box<dyn Encoder<A>>>>;

/// Submits device tensors to an [`Engine`] through pinned host buffers (see the module
/// doc). Every rank submits the same names, as with the engine itself.
pub struct Stager<A: StreamApi> {
    api: Arc<A>,
    engine: Arc<Engine>,
    encoder: Option<Shared<A>>,
    /// Per tensor name: whether the encoder takes it.
    routes: Mutex<HashMap<String, bool>>,
    stats: Arc<Mutex<StagerStats>>,
    pool: Arc<Mutex<Pool<A>>>,
    jobs: Option<Sender<Job<A>>>,
    thread: Option<JoinHandle<()>>,
}

impl<A: StreamApi> std::fmt::Debug for Stager<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager").finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<A: StreamApi> Stager<A> {
    /// A stager over `api` that submits to `engine` from a thread of its own, every tensor
    /// through a pinned host copy.
    pub fn new(api: A, engine: Arc<Engine>) -> Result<Self> {
        Stager::start(api, engine, None)
    }

    /// A stager whose `encoder` encodes on the device the all-reduced tensors it accepts
    /// (the others go through pinned host copies).
    pub fn with_encoder(api: A, engine: Arc<Engine>, encoder: Box<dyn Encoder<A>>) -> Result<Self> {
        Stager::start(api, engine, Some(Arc::new(Mutex::new(encoder))))
    }

    fn start(api: A, engine: Arc<Engine>, encoder: Option<Shared<A>>) -> Result<Self> {
        let api = Arc::new(api);
        let pool = Arc::new(Mutex::new(Pool::new(api.clone())));
        let stats = Arc::new(Mutex::new(StagerStats::default()));
        let (tx, rx) = channel::<Job<A>>();
        let ctx = Worker {
            api: api.clone(),
            pool: pool.clone(),
            engine: engine.clone(),
            encoder: encoder.clone(),
            stats: stats.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("gradwire-stager-{}", engine.rank()))
            .spawn(move || ctx.run(rx))
            .map_err(|e| Error::Stager(format!("cannot start its thread: {e}")))?;
        Ok(Stager {
            api,
            engine,
            encoder,
            routes: Mutex::new(HashMap::new()),
            stats,
            pool,
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    /// Bytes and tensors that went each way so far.
    pub fn stats(&self) -> StagerStats {
        *lock(&self.stats)
    }

    /// Whether the encoder takes tensor `name` of `len` elements (asked once per name).
    fn encodes(&self, name: &str, len: usize) -> bool {
        let Some(enc) = &self.encoder else {
            return false;
        };
        let mut routes = lock(&self.routes);
        if let Some(&r) = routes.get(name) {
            return r;
        }
        let r = lock(enc).accepts(name, len, self.engine.codec_context(name));
        routes.insert(name.to_string(), r);
        r
    }

    /// Starts the engine's all-reduce (mean over ranks, through the tensor's policy) of the
    /// `len` floats at `src`, each multiplied by `prescale` on the host, once the work
    /// already queued on `stream` has produced them; returns at once.
    ///
    /// # Safety
    /// `src` must address `len` floats on the device that stay allocated, and are not
    /// written by later work, until the returned [`Staged`] is waited on.
    pub unsafe fn all_reduce(
        &self,
        name: &str,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
        prescale: f32,
    ) -> Result<Staged<A>> {
        // SAFETY: the caller's contract.
        unsafe { self.stage(Op::AllReduce(name.into()), src, len, stream, prescale) }
    }

    /// Starts the engine's broadcast of rank `root`'s `len` floats at `src` (every rank
    /// passes a buffer of the same length); returns at once.
    ///
    /// # Safety
    /// As [`Stager::all_reduce`].
    pub unsafe fn broadcast(
        &self,
        name: &str,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
        root: usize,
    ) -> Result<Staged<A>> {
        // SAFETY: the caller's contract.
        unsafe { self.stage(Op::Broadcast(name.into(), root), src, len, stream, 1.0) }
    }

    /// Says that the submissions so far form one burst: the engine is flushed once the
    /// stager's thread has submitted them all (see `Engine::flush`).
    pub fn flush(&self) {
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job::Flush);
        }
    }

    unsafe fn stage(
        &self,
        op: Op,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
        prescale: f32,
    ) -> Result<Staged<A>> {
        if let Op::AllReduce(name) = &op {
            if prescale == 1.0 && self.encodes(name, len) {
                let ready = self.api.record(stream)?;
                let (tx, rx) = channel();
                let job = Job::Encode {
                    name: name.clone(),
                    src,
                    len,
                    ready,
                    progress: self.engine.progress(),
                    reply: tx,
                };
                return self.send(name.clone(), len, job, rx);
            }
        }
        let mut buf = lock(&self.pool).take(len)?;
        // SAFETY: `src` is the caller's; `buf` came from the pool, so no copy uses it, and
        // it goes to the stager's thread, which waits for `copied` before touching it.
        let copied = unsafe { self.api.copy_down(stream, src, &mut buf, len) };
        let copied = match copied {
            Ok(e) => e,
            Err(e) => {
                lock(&self.pool).give(buf, None);
                return Err(e);
            }
        };
        let (tx, rx) = channel();
        let name = op.name().to_string();
        let job = Job::Submit {
            op,
            copied,
            buf,
            len,
            prescale,
            reply: tx,
        };
        self.send(name, len, job, rx)
    }

    fn send(
        &self,
        name: String,
        len: usize,
        job: Job<A>,
        rx: Receiver<Result<gradwire_engine::Handle>>,
    ) -> Result<Staged<A>> {
        let sent = self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok());
        if !sent {
            return Err(stopped());
        }
        Ok(Staged {
            name,
            len,
            state: State::Submitting(rx),
            api: self.api.clone(),
            pool: self.pool.clone(),
        })
    }
}

impl<A: StreamApi> Drop for Stager<A> {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Pinned buffers still tagged with a copy up are waited for before they are freed.
        lock(&self.pool).drain();
    }
}
