//! [`StreamApi`] on the CUDA driver: raw device pointers and streams in a device's primary
//! context (the context PyTorch's caching allocator and streams live in, so a tensor's
//! `data_ptr()` and `torch.cuda.current_stream().cuda_stream` are valid here), pinned
//! buffers from `cuMemHostAlloc`, events without timing.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use super::{DevicePtr, RawStream, StreamApi};
use crate::error::{Error, Result};

/// GPU `ordinal`'s primary context, driven through raw pointers and streams.
#[derive(Debug, Clone)]
pub struct CudaApi {
    ctx: Arc<CudaContext>,
}

impl CudaApi {
    /// The primary context of GPU `ordinal` (a typed [`Error::NoDriver`] on a machine
    /// without a CUDA driver).
    pub fn primary(ordinal: usize) -> Result<Self> {
        if !crate::device::driver_present() {
            return Err(Error::NoDriver);
        }
        Ok(CudaApi {
            ctx: CudaContext::new(ordinal)?,
        })
    }

    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }
}

/// Page-locked host memory from `cuMemHostAlloc`.
pub struct CudaPinned {
    ptr: *mut f32,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is process-wide host memory, valid on every thread; access is
// governed by the StreamApi contract (events), not by the thread.
unsafe impl Send for CudaPinned {}

impl Drop for CudaPinned {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc in `alloc_pinned`, freed once; the pool
            // frees a buffer only after its last copy's event completed.
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }
}

/// A `CUevent` recorded on a stream.
pub struct CudaMark {
    event: sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: CUDA events may be used from any thread of the process.
unsafe impl Send for CudaMark {}

impl CudaMark {
    /// The raw event (for a stream of this context to wait on).
    pub fn raw(&self) -> sys::CUevent {
        self.event
    }
}

impl Drop for CudaMark {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created in `mark`, destroyed once (CUDA releases it when it completes).
            let _ = unsafe { result::event::destroy(self.event) };
        }
    }
}

impl CudaApi {
    fn mark(&self, stream: RawStream) -> Result<CudaMark> {
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?;
        let mark = CudaMark {
            event,
            ctx: self.ctx.clone(),
        };
        // SAFETY: a live event on a stream of this context (the caller's contract).
        unsafe { result::event::record(event, stream.0 as sys::CUstream) }?;
        Ok(mark)
    }
}

impl StreamApi for CudaApi {
    type Pinned = CudaPinned;
    type Event = CudaMark;

    fn alloc_pinned(&self, len: usize) -> Result<CudaPinned> {
        self.ctx.bind_to_thread()?;
        let bytes = len.max(1) * std::mem::size_of::<f32>();
        // SAFETY: a plain allocation; freed in Drop.
        let ptr = unsafe { result::malloc_host(bytes, 0) }?;
        Ok(CudaPinned {
            ptr: ptr.cast(),
            len,
            ctx: self.ctx.clone(),
        })
    }

    fn pinned_len(buf: &CudaPinned) -> usize {
        buf.len
    }

    unsafe fn host_mut(buf: &mut CudaPinned) -> &mut [f32] {
        // SAFETY: `len` floats allocated; no copy in flight (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(buf.ptr, buf.len) }
    }

    unsafe fn copy_down(
        &self,
        stream: RawStream,
        src: DevicePtr,
        dst: &mut CudaPinned,
        len: usize,
    ) -> Result<CudaMark> {
        self.ctx.bind_to_thread()?;
        if len > dst.len {
            return Err(Error::Length {
                want: dst.len,
                got: len,
            });
        }
        // SAFETY: the caller's contract: `src` holds `len` floats on this device, `dst`
        // is not touched until the event completes.
        unsafe {
            let host = std::slice::from_raw_parts_mut(dst.ptr, len);
            result::memcpy_dtoh_async(host, src.0 as sys::CUdeviceptr, stream.0 as sys::CUstream)?;
        }
        self.mark(stream)
    }

    unsafe fn copy_up(
        &self,
        stream: RawStream,
        src: &CudaPinned,
        dst: DevicePtr,
        len: usize,
    ) -> Result<CudaMark> {
        self.ctx.bind_to_thread()?;
        if len > src.len {
            return Err(Error::Length {
                want: src.len,
                got: len,
            });
        }
        // SAFETY: the caller's contract: `dst` holds `len` floats on this device, `src` is
        // not written until the event completes.
        unsafe {
            let host = std::slice::from_raw_parts(src.ptr, len);
            result::memcpy_htod_async(dst.0 as sys::CUdeviceptr, host, stream.0 as sys::CUstream)?;
        }
        self.mark(stream)
    }

    fn record(&self, stream: RawStream) -> Result<CudaMark> {
        self.ctx.bind_to_thread()?;
        self.mark(stream)
    }

    fn synchronize(&self, event: &CudaMark) -> Result<()> {
        self.ctx.bind_to_thread()?;
        // SAFETY: a live event of this context.
        unsafe { result::event::synchronize(event.event) }?;
        Ok(())
    }

    fn is_done(&self, event: &CudaMark) -> Result<bool> {
        self.ctx.bind_to_thread()?;
        // SAFETY: a live event of this context.
        match unsafe { result::event::query(event.event) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}
