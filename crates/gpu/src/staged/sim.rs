//! A host simulation of device memory, streams and events, for the staged path's tests:
//! each stream is a thread that runs its tasks in order (as a CUDA stream runs its
//! kernels and copies), an event is a flag a stream sets when it reaches it, and "device"
//! memory is host memory that only stream tasks touch. Copies are as asynchronous as on a
//! GPU: a test can hold a stream back (a slow "kernel") and see that nothing queued after
//! it ran early.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::{DevicePtr, RawStream, StreamApi};
use crate::error::Result;

type Task = Box<dyn FnOnce() + Send>;
/// A stream: where its tasks go, and its thread.
type Stream = (Sender<Task>, Option<JoinHandle<()>>);

#[derive(Default)]
struct Inner {
    streams: Mutex<HashMap<u64, Stream>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let streams = std::mem::take(&mut *self.streams.lock().unwrap());
        for (_, (tx, t)) in streams {
            drop(tx);
            if let Some(t) = t {
                let _ = t.join();
            }
        }
    }
}

/// The simulated device (cheap to clone: clones share the streams).
#[derive(Clone, Default)]
pub(crate) struct Sim(Arc<Inner>);

/// A flag set when its stream reaches it.
#[derive(Clone, Default)]
pub(crate) struct SimEvent(Arc<(Mutex<bool>, Condvar)>);

impl SimEvent {
    fn set(&self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }

    fn wait(&self) {
        let mut done = self.0 .0.lock().unwrap();
        while !*done {
            done = self.0 .1.wait(done).unwrap();
        }
    }

    fn done(&self) -> bool {
        *self.0 .0.lock().unwrap()
    }
}

/// "Pinned" host memory: a boxed slice whose address the stream tasks write through.
pub(crate) struct SimPinned(Box<[f32]>);

/// "Device" memory: only stream tasks read and write it, through its address.
pub(crate) struct SimMem(Box<[f32]>);

impl SimMem {
    /// Its address.
    pub(crate) fn ptr(&self) -> DevicePtr {
        DevicePtr(self.0.as_ptr() as u64)
    }
}

impl Sim {
    /// A new stream, running its tasks in order on a thread of its own.
    pub(crate) fn stream(&self) -> RawStream {
        let (tx, rx) = channel::<Task>();
        let t = std::thread::spawn(move || {
            for task in rx {
                task();
            }
        });
        let mut streams = self.0.streams.lock().unwrap();
        let id = streams.len() as u64 + 1;
        streams.insert(id, (tx, Some(t)));
        RawStream(id)
    }

    /// Queues `task` on `stream`.
    pub(crate) fn launch(&self, stream: RawStream, task: impl FnOnce() + Send + 'static) {
        let streams = self.0.streams.lock().unwrap();
        streams[&stream.0].0.send(Box::new(task)).unwrap();
    }

    /// An event recorded on `stream` now.
    pub(crate) fn record(&self, stream: RawStream) -> SimEvent {
        let e = SimEvent::default();
        let set = e.clone();
        self.launch(stream, move || set.set());
        e
    }

    /// `len` floats of device memory, zero.
    pub(crate) fn alloc(&self, len: usize) -> SimMem {
        SimMem(vec![0.0; len].into_boxed_slice())
    }

    /// A "kernel" on `stream`: writes `values` to `mem` (which must outlive the task).
    pub(crate) fn write(&self, stream: RawStream, mem: &SimMem, values: Vec<f32>) {
        assert!(values.len() <= mem.0.len());
        let dst = mem.ptr().0 as usize;
        self.launch(stream, move || {
            // SAFETY: the test keeps `mem` alive until the stream has run this, and only
            // stream tasks touch it.
            let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut f32, values.len()) };
            d.copy_from_slice(&values);
        });
    }

    /// A "kernel" on `stream` that reads `mem`, and the host waiting for it: what a later
    /// kernel on that stream would see.
    pub(crate) fn read(&self, stream: RawStream, mem: &SimMem) -> Vec<f32> {
        let out = Arc::new(Mutex::new(Vec::new()));
        let (o, src, len) = (out.clone(), mem.ptr().0 as usize, mem.0.len());
        self.launch(stream, move || {
            // SAFETY: as in `write`.
            let s = unsafe { std::slice::from_raw_parts(src as *const f32, len) };
            *o.lock().unwrap() = s.to_vec();
        });
        self.record(stream).wait();
        let v = out.lock().unwrap().clone();
        v
    }

    /// A "kernel" on `stream` that runs until `gate` is opened (holds the stream back).
    pub(crate) fn hold(&self, stream: RawStream) -> SimEvent {
        let gate = SimEvent::default();
        let g = gate.clone();
        self.launch(stream, move || g.wait());
        gate
    }

    /// Opens a gate made by [`Sim::hold`].
    pub(crate) fn open(gate: &SimEvent) {
        gate.set();
    }
}

impl StreamApi for Sim {
    type Pinned = SimPinned;
    type Event = SimEvent;

    fn alloc_pinned(&self, len: usize) -> Result<SimPinned> {
        Ok(SimPinned(vec![f32::NAN; len].into_boxed_slice()))
    }

    fn pinned_len(buf: &SimPinned) -> usize {
        buf.0.len()
    }

    unsafe fn host_mut(buf: &mut SimPinned) -> &mut [f32] {
        &mut buf.0
    }

    unsafe fn copy_down(
        &self,
        stream: RawStream,
        src: DevicePtr,
        dst: &mut SimPinned,
        len: usize,
    ) -> Result<SimEvent> {
        assert!(len <= dst.0.len());
        let (s, d) = (src.0 as usize, dst.0.as_mut_ptr() as usize);
        self.launch(stream, move || {
            // SAFETY: the StreamApi contract: both stay allocated and untouched until the
            // event completes.
            unsafe { std::ptr::copy_nonoverlapping(s as *const f32, d as *mut f32, len) };
        });
        Ok(self.record(stream))
    }

    unsafe fn copy_up(
        &self,
        stream: RawStream,
        src: &SimPinned,
        dst: DevicePtr,
        len: usize,
    ) -> Result<SimEvent> {
        assert!(len <= src.0.len());
        let (s, d) = (src.0.as_ptr() as usize, dst.0 as usize);
        self.launch(stream, move || {
            // SAFETY: as in copy_down.
            unsafe { std::ptr::copy_nonoverlapping(s as *const f32, d as *mut f32, len) };
        });
        Ok(self.record(stream))
    }

    fn record(&self, stream: RawStream) -> Result<SimEvent> {
        Ok(Sim::record(self, stream))
    }

    fn synchronize(&self, event: &SimEvent) -> Result<()> {
        event.wait();
        Ok(())
    }

    fn is_done(&self, event: &SimEvent) -> Result<bool> {
        Ok(event.done())
    }
}
