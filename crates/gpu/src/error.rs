//! The crate's error type.

/// What can go wrong on the device side.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No CUDA driver library (`libcuda.so`) could be opened: no GPU on this machine.
    #[error("no CUDA driver found (libcuda.so): this machine has no usable NVIDIA GPU")]
    NoDriver,
    /// No NVRTC library (`libnvrtc.so`) could be opened to compile the kernels.
    #[error("no NVRTC library found (libnvrtc.so): install the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put it on LD_LIBRARY_PATH")]
    NoNvrtc,
    /// A CUDA driver call failed.
    #[cfg(feature = "cuda")]
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// The kernels did not compile.
    #[error("NVRTC could not compile the kernels: {0}")]
    Compile(String),
    /// A table would not fit the kernels' 32-bit indices.
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    /// A configuration the device codec does not implement.
    #[error("the device codec does not implement {0}; use the CPU codec")]
    Unsupported(String),
    /// The gradient's length differs from the one the codec was built for.
    #[error("gradient of {got} elements given to a device codec built for {want}")]
    Length {
        /// The built length.
        want: usize,
        /// The given length.
        got: usize,
    },
    /// The engine failed the operation (a dead peer, a mismatched tensor: named).
    #[error(transparent)]
    Engine(#[from] gradwire_engine::Error),
    /// The staged path's own thread failed.
    #[error("the device stager: {0}")]
    Stager(String),
    /// The collective over the host transport failed.
    #[error(transparent)]
    Collective(#[from] gradwire_collective::Error),
}

/// `Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
