//! Aluminum's host-transfer all-reduce: device → pinned host → any [`Transport`] → device,
//! pipelined in chunks on two copy streams so that the copies overlap the wire.
//!
//! Chunk `c` is copied down on the down stream into pinned slot `c % 3` (waiting only for
//! chunk `c - 3`'s copy up out of that slot), all-reduced on the host by the collective
//! chosen for its size (ring, recursive doubling, Rabenseifner) over TCP, shared memory or
//! MPI, and copied up on the up stream; up to two copies down run ahead of the wire. The
//! buffer's producer is respected: the copies start after the work already queued on the
//! buffer's stream, and [`HostTransfer::all_reduce`] returns once the copies up are done.
//!
//! The reduction itself runs on the host inside the collective, as in Aluminum's
//! host-transfer algorithm; its share of the time is reported apart from the wire by timing
//! the same number of additions ([`host_reduction_seconds`]).
//!
//! [`AsyncAllReduce`] is the non-blocking form (Aluminum's: the caller enqueues and goes on;
//! the host waits only when it asks): a progress thread owns the transport and the pinned
//! buffers, [`AsyncAllReduce::start`] hands it a device buffer and returns at once, its
//! copies down wait on the GPU for the kernels already queued on the buffer's stream, and
//! [`Pending::wait`] gives the buffer back, summed.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, PinnedHostSlice};
use gradwire_collective::{Collectives, ReduceOp, Transport};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::pipeline::{chunks, reuses, slot, AHEAD, SLOTS};

/// Where an all-reduce's time went, in seconds of this rank's wall clock.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timing {
    /// The whole call, until the last copy up finished.
    pub total: f64,
    /// Waiting for copies down (device → pinned host) that the wire did not hide.
    pub copy_down_wait: f64,
    /// In the host collectives (wire and host reduction).
    pub collective: f64,
    /// Waiting at the end for the last copies up.
    pub copy_up_wait: f64,
    /// Chunks.
    pub chunks: usize,
}

/// A pinned host buffer and its address (the copies address sub-ranges of it).
struct Slot {
    _mem: PinnedHostSlice<f32>,
    ptr: *mut f32,
    len: usize,
}

impl Slot {
    /// The first `len` elements, to write.
    ///
    /// # Safety
    /// No copy may be using them (the caller waited for the events of the copies that did),
    /// and the slice must be dropped before the slot's next copy is issued.
    unsafe fn get_mut(&mut self, len: usize) -> &mut [f32] {
        assert!(len <= self.len);
        // SAFETY: the allocation holds self.len floats; exclusivity is the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }

    /// The first `len` elements, to read.
    ///
    /// # Safety
    /// No copy may be writing them (the caller waited for the copy down's event).
    unsafe fn get(&self, len: usize) -> &[f32] {
        assert!(len <= self.len);
        // SAFETY: the allocation holds self.len floats; no writer, as the caller ensured.
        unsafe { std::slice::from_raw_parts(self.ptr, len) }
    }
}

/// A host-transfer all-reduce with its pinned buffers and copy streams.
pub struct HostTransfer {
    down: Arc<CudaStream>,
    up: Arc<CudaStream>,
    slots: Vec<Slot>,
    chunk: usize,
}

// SAFETY: the slots' pointers address pinned memory owned by the same struct (valid in every
// thread of the process); the struct is used by one thread at a time (`&mut self`).
unsafe impl Send for HostTransfer {}

impl HostTransfer {
    /// Chunks of `chunk` elements (Aluminum pipelines in chunks of about 1 MiB to 16 MiB).
    pub fn new(dev: &Device, chunk: usize) -> Result<Self> {
        let chunk = chunk.max(1);
        let mut slots = Vec::with_capacity(SLOTS);
        for _ in 0..SLOTS {
            // SAFETY: every slot is written by a copy down before the host reads it.
            let mut mem = unsafe { dev.context().alloc_pinned_with_flags::<f32>(chunk, 0) }?;
            let ptr = mem.as_mut_ptr()?;
            slots.push(Slot {
                _mem: mem,
                ptr,
                len: chunk,
            });
        }
        Ok(HostTransfer {
            down: dev.new_stream()?,
            up: dev.new_stream()?,
            slots,
            chunk,
        })
    }

    /// Sums `buf` over every rank of `t` in place; returns with the result complete on the
    /// device (the copies up waited for) and the time split.
    pub fn all_reduce<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        buf: &mut CudaSlice<f32>,
    ) -> Result<Timing> {
        let start = Instant::now();
        let n = buf.len();
        let parts = chunks(n, self.chunk);
        let mut timing = Timing {
            chunks: parts.len(),
            ..Timing::default()
        };
        // Start after the buffer's producer.
        self.down.join(buf.stream())?;
        let mut downs: Vec<Option<CudaEvent>> = (0..parts.len()).map(|_| None).collect();
        let mut ups: Vec<Option<CudaEvent>> = (0..parts.len()).map(|_| None).collect();
        let mut issued = 0usize;
        for c in 0..parts.len() {
            while issued < parts.len() && issued <= c + AHEAD {
                if let Some(old) = reuses(issued) {
                    if let Some(e) = &ups[old] {
                        self.down.wait(e)?;
                    }
                }
                let r = parts[issued].clone();
                let len = r.len();
                let src = buf.slice(r);
                // SAFETY: the slot's last reader (chunk issued - 3's copy up) is waited for
                // on this stream above; the host holds no slice of it now.
                let dst = unsafe { self.slots[slot(issued)].get_mut(len) };
                self.down.memcpy_dtoh(&src, dst)?;
                downs[issued] = Some(self.down.record_event(None)?);
                issued += 1;
            }
            let r = parts[c].clone();
            let len = r.len();
            let t0 = Instant::now();
            if let Some(e) = &downs[c] {
                e.synchronize()?;
            }
            timing.copy_down_wait += t0.elapsed().as_secs_f64();
            // SAFETY: chunk c's copy down finished; no copy touches the slot until chunk
            // c + 3's copy down, issued after this slice is dropped.
            let host = unsafe { self.slots[slot(c)].get_mut(len) };
            let t1 = Instant::now();
            t.all_reduce(host, ReduceOp::Sum)?;
            timing.collective += t1.elapsed().as_secs_f64();
            let mut dst = buf.slice_mut(r);
            // SAFETY: as above; the copy up only reads the slot.
            let src = unsafe { self.slots[slot(c)].get(len) };
            self.up.memcpy_htod(src, &mut dst)?;
            ups[c] = Some(self.up.record_event(None)?);
        }
        let t2 = Instant::now();
        self.up.synchronize()?;
        timing.copy_up_wait = t2.elapsed().as_secs_f64();
        timing.total = start.elapsed().as_secs_f64();
        Ok(timing)
    }
}

/// A running all-reduce: [`Pending::wait`] returns the summed buffer and its timing.
pub struct Pending {
    done: Receiver<Result<(CudaSlice<f32>, Timing)>>,
}

impl Pending {
    /// Waits for the all-reduce (the host blocks here, and only here).
    pub fn wait(self) -> Result<(CudaSlice<f32>, Timing)> {
        self.done.recv().unwrap_or(Err(Error::Unsupported(
            "the progress thread stopped".into(),
        )))
    }
}

type Job = (CudaSlice<f32>, Sender<Result<(CudaSlice<f32>, Timing)>>);

/// Non-blocking host-transfer all-reduces, run in order by one progress thread.
pub struct AsyncAllReduce {
    jobs: Option<Sender<Job>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl AsyncAllReduce {
    /// A progress thread owning `t` and a [`HostTransfer`] of `chunk`-element chunks.
    pub fn new<T: Transport + 'static>(dev: &Device, mut t: T, chunk: usize) -> Result<Self> {
        let mut ht = HostTransfer::new(dev, chunk)?;
        let (tx, rx) = channel::<Job>();
        let worker = std::thread::spawn(move || {
            for (mut buf, done) in rx {
                let r = ht.all_reduce(&mut t, &mut buf).map(|tm| (buf, tm));
                // A caller that dropped its Pending no longer wants the result.
                let _ = done.send(r);
            }
        });
        Ok(AsyncAllReduce {
            jobs: Some(tx),
            worker: Some(worker),
        })
    }

    /// Starts summing `buf` over the ranks and returns at once; every rank starts its
    /// all-reduces in the same order.
    pub fn start(&self, buf: CudaSlice<f32>) -> Pending {
        let (tx, rx) = channel();
        if let Some(jobs) = &self.jobs {
            if let Err(e) = jobs.send((buf, tx)) {
                let _ = e.0 .1.send(Err(Error::Unsupported(
                    "the progress thread stopped".into(),
                )));
            }
        }
        Pending { done: rx }
    }
}

impl Drop for AsyncAllReduce {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Seconds the host takes for the additions a ring all-reduce of `n` floats over `p` ranks
/// does on each rank (`(p - 1) / p * n`), measured on `reps` passes (the reduction's share
/// of [`Timing::collective`]).
pub fn host_reduction_seconds(n: usize, p: usize, reps: usize) -> f64 {
    let m = n * (p.max(1) - 1) / p.max(1);
    let a: Vec<f32> = (0..m).map(|i| (i % 97) as f32).collect();
    let mut acc = vec![0f32; m];
    // One untimed pass: the pages of `acc` are touched before the clock starts.
    for (x, y) in acc.iter_mut().zip(&a) {
        *x += *y;
    }
    let t = Instant::now();
    for _ in 0..reps.max(1) {
        for (x, y) in acc.iter_mut().zip(&a) {
            *x += *y;
        }
        std::hint::black_box(&mut acc);
    }
    t.elapsed().as_secs_f64() / reps.max(1) as f64
}
