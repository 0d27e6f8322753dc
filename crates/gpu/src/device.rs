//! One GPU: its context, the compiled kernels and launch helpers.
//!
//! [`Device::open`] checks that the driver and NVRTC libraries can be opened (a typed
//! [`Error::NoDriver`] / [`Error::NoNvrtc`] rather than cudarc's panic), takes the device's
//! primary context (the one PyTorch and every runtime-API program use, so their device
//! pointers are valid here) and compiles [`crate::kernels::SOURCE`] for its architecture.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use crate::error::{Error, Result};
use crate::kernels;

/// Threads per block of the element-wise kernels.
pub(crate) const THREADS: u32 = 256;

/// A GPU with the kernels loaded.
#[derive(Debug, Clone)]
pub struct Device {
    ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    funcs: Arc<HashMap<&'static str, CudaFunction>>,
}

/// Whether this machine has a CUDA driver library (without loading it twice or panicking).
pub fn driver_present() -> bool {
    // SAFETY: only probes for the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether an NVRTC library can be opened.
pub fn nvrtc_present() -> bool {
    // SAFETY: only probes for the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles the kernels to PTX for `arch` (needs only NVRTC, no GPU).
pub fn compile(arch: Option<&str>) -> Result<String> {
    if !nvrtc_present() {
        return Err(Error::NoNvrtc);
    }
    let opts = CompileOptions {
        options: kernels::options(arch),
        name: Some("gradwire.cu".into()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(kernels::SOURCE, opts)
        .map_err(|e| Error::Compile(format!("{e:?}")))?;
    Ok(ptx.to_src())
}

impl Device {
    /// GPU `ordinal`'s primary context with the kernels compiled and loaded.
    pub fn open(ordinal: usize) -> Result<Device> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        let arch = kernels::arch_for(major, minor);
        let ptx = compile(Some(&arch))?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx))?;
        let mut funcs = HashMap::new();
        for name in kernels::KERNELS {
            funcs.insert(*name, module.load_function(name)?);
        }
        Ok(Device {
            ctx,
            _module: module,
            funcs: Arc::new(funcs),
        })
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A new stream on this device.
    pub fn new_stream(&self) -> Result<Arc<CudaStream>> {
        Ok(self.ctx.new_stream()?)
    }

    /// The device's name.
    pub fn name(&self) -> Result<String> {
        Ok(self.ctx.name()?)
    }

    pub(crate) fn func(&self, name: &'static str) -> &CudaFunction {
        &self.funcs[name]
    }
}

/// A grid-stride launch over `n` elements.
pub(crate) fn elementwise(n: u64) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as u64).clamp(1, 132 * 16) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `blocks` blocks of `threads` threads.
pub(crate) fn blocks(blocks: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks.max(1) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Device {
    /// Fills `buf` on `stream` with the test pattern `((i * 7 + rank * 13) mod 101) - 50`
    /// (small integers: sums over ranks are exact in f32).
    pub fn fill_pattern(
        &self,
        stream: &Arc<CudaStream>,
        buf: &mut CudaSlice<f32>,
        rank: u32,
    ) -> Result<()> {
        use cudarc::driver::PushKernelArg;
        let n = buf.len() as u64;
        let mut b = stream.launch_builder(self.func("gw_fill_pattern"));
        b.arg(buf).arg(&n).arg(&rank);
        // SAFETY: n floats of buf.
        unsafe { b.launch(elementwise(n)) }?;
        Ok(())
    }
}

/// The value [`Device::fill_pattern`] puts at `i` on `rank`.
pub fn pattern(i: usize, rank: u32) -> f32 {
    ((i as u64 * 7 + rank as u64 * 13) % 101) as f32 - 50.0
}
