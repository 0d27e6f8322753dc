//! `onebit` (1-bit SGD, Seide 2014) on the device, with its error feedback.
//!
//! The columns are the CPU codec's (`OneBit::columns`, from the tensors' shapes or runs of
//! 2048). Per encode: `r = r + g` (feedback), the two means of each column summed in the
//! CPU's 16 lanes by 16 threads (`gw_onebit_scales`), then one thread per sign-bit word,
//! which also leaves `r = x - decode(x)` (`gw_onebit_pack`). Same bytes as
//! `onebit:column=...,ef=...` on the CPU, and the same residual.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};
use gradwire_codec::{BuildContext, CodecId, OneBit, OneBitConfig};

use super::{check_len, Body, DeviceCodec};
use crate::device::{blocks, elementwise, Device};
use crate::error::Result;
use crate::plan::Plan;

/// 1-bit SGD on the device.
pub struct DeviceOneBit {
    dev: Device,
    stream: Arc<CudaStream>,
    n: usize,
    ef: bool,
    runs: CudaSlice<u32>,
    nruns: u32,
    pieces: CudaSlice<u32>,
    npieces: usize,
    scales: CudaSlice<f32>,
    residual: CudaSlice<f32>,
    body: Body,
}

impl DeviceOneBit {
    /// 1-bit SGD as `cfg` says over gradients of `n` elements laid out as `ctx` says.
    pub fn new(
        dev: &Device,
        stream: &Arc<CudaStream>,
        cfg: &OneBitConfig,
        ctx: &BuildContext,
        n: usize,
    ) -> Result<Self> {
        let cols = OneBit::with_columns(cfg.column, ctx).columns(n);
        let plan = Plan::new(
            &cols.into_iter().map(|r| (r, false)).collect::<Vec<_>>(),
            1,
            2,
        )?;
        Ok(DeviceOneBit {
            dev: dev.clone(),
            stream: stream.clone(),
            n,
            ef: cfg.ef,
            runs: stream.clone_htod(&plan.run_table())?,
            nruns: plan.runs.len() as u32,
            pieces: stream.clone_htod(&plan.piece_table())?,
            npieces: plan.pieces.len(),
            scales: stream.alloc_zeros::<f32>(2 * plan.runs.len().max(1))?,
            residual: stream.alloc_zeros::<f32>(n.max(1))?,
            body: Body::new(stream, plan.body_words)?,
        })
    }

    /// The residual (what the payloads left out), copied to the host.
    pub fn residual(&self) -> Result<Vec<f32>> {
        Ok(self.stream.clone_dtoh(&self.residual.slice(..self.n))?)
    }
}

impl DeviceCodec for DeviceOneBit {
    fn id(&self) -> CodecId {
        CodecId::OneBit
    }

    fn encode(&mut self, grad: &CudaView<'_, f32>, out: &mut Vec<u8>) -> Result<()> {
        check_len(self.n, grad)?;
        let n = self.n as u64;
        if !self.ef {
            let mut x = self.residual.slice_mut(..self.n);
            self.stream.memcpy_dtod(grad, &mut x)?;
        } else if n > 0 {
            let mut b = self.stream.launch_builder(self.dev.func("gw_add"));
            b.arg(&mut self.residual).arg(grad).arg(&n);
            // SAFETY: n floats of each buffer.
            unsafe { b.launch(elementwise(n)) }?;
        }
        if self.nruns > 0 {
            let mut b = self
                .stream
                .launch_builder(self.dev.func("gw_onebit_scales"));
            b.arg(&self.residual)
                .arg(&self.runs)
                .arg(&self.nruns)
                .arg(&mut self.body.dev)
                .arg(&mut self.scales);
            // SAFETY: the run table holds nruns runs inside the gradient and the body.
            unsafe { b.launch(blocks((self.nruns as usize).div_ceil(8), 128)) }?;
        }
        if self.npieces > 0 {
            let fb: i32 = 1;
            let mut b = self.stream.launch_builder(self.dev.func("gw_onebit_pack"));
            b.arg(&mut self.residual)
                .arg(&self.pieces)
                .arg(&self.scales)
                .arg(&mut self.body.dev)
                .arg(&fb);
            // SAFETY: every piece's words lie inside its run and the body.
            unsafe { b.launch(blocks(self.npieces, 128)) }?;
        }
        self.body.finish(&self.stream, CodecId::OneBit, self.n, out)
    }
}
