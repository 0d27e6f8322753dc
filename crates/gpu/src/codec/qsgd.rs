//! `qsgd` (Alistarh 2017) on the device, fixed-width coding.
//!
//! The buckets are the CPU codec's (runs of `bucket` inside each tensor). Per encode the host
//! draws the step's 32-bit key from the same `StepRng` as the CPU codec; one block per bucket
//! takes its scale (`norm=max` in parallel, `norm=l2` in the CPU's lane order), then one
//! thread per code word rounds each element stochastically with the CPU's uniform of its
//! global index. Same bytes as the CPU codec. Elias coding and `ef=true` are refused.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};
use gradwire_codec::external::qsgd_buckets;
use gradwire_codec::{BuildContext, CodecId, Progress, QsgdCoding, QsgdConfig, QsgdNorm, StepRng};

use super::{check_len, Body, DeviceCodec};
use crate::device::{blocks, Device};
use crate::error::{Error, Result};
use crate::plan::Plan;

/// QSGD on the device.
pub struct DeviceQsgd {
    dev: Device,
    stream: Arc<CudaStream>,
    n: usize,
    cfg: QsgdConfig,
    rng: StepRng,
    runs: CudaSlice<u32>,
    nruns: u32,
    pieces: CudaSlice<u32>,
    npieces: usize,
    inv: CudaSlice<f32>,
    body: Body,
}

impl DeviceQsgd {
    /// QSGD as `cfg` says for `ctx`'s rank and layout, gradients of `n` elements.
    pub fn new(
        dev: &Device,
        stream: &Arc<CudaStream>,
        cfg: &QsgdConfig,
        ctx: &BuildContext,
        n: usize,
    ) -> Result<Self> {
        if cfg.coding == QsgdCoding::Elias {
            return Err(Error::Unsupported("qsgd coding=elias".into()));
        }
        if cfg.ef {
            return Err(Error::Unsupported("qsgd ef=true".into()));
        }
        let bks = qsgd_buckets(&ctx.layout, n, cfg.bucket);
        let plan = Plan::new(
            &bks.into_iter().map(|r| (r, false)).collect::<Vec<_>>(),
            cfg.width(),
            1,
        )?;
        Ok(DeviceQsgd {
            dev: dev.clone(),
            stream: stream.clone(),
            n,
            cfg: cfg.clone(),
            rng: StepRng::new(ctx.seed, ctx.rank),
            runs: stream.clone_htod(&plan.run_table())?,
            nruns: plan.runs.len() as u32,
            pieces: stream.clone_htod(&plan.piece_table())?,
            npieces: plan.pieces.len(),
            inv: stream.alloc_zeros::<f32>(plan.runs.len().max(1))?,
            body: Body::new(stream, plan.body_words)?,
        })
    }
}

impl DeviceCodec for DeviceQsgd {
    fn id(&self) -> CodecId {
        CodecId::Qsgd
    }

    fn set_progress(&mut self, progress: Progress) {
        self.rng.set_step(progress.step);
    }

    fn encode(&mut self, grad: &CudaView<'_, f32>, out: &mut Vec<u8>) -> Result<()> {
        check_len(self.n, grad)?;
        let key = self.rng.next_key();
        let s = self.cfg.levels as i32;
        let sf = s as f32;
        if self.nruns > 0 {
            let l2: i32 = (self.cfg.norm == QsgdNorm::L2) as i32;
            let mut b = self.stream.launch_builder(self.dev.func("gw_qsgd_scales"));
            b.arg(grad)
                .arg(&self.runs)
                .arg(&self.nruns)
                .arg(&l2)
                .arg(&sf)
                .arg(&mut self.body.dev)
                .arg(&mut self.inv);
            // SAFETY: one block per bucket of the run table, inside the gradient and body.
            unsafe { b.launch(blocks(self.nruns as usize, 128)) }?;
        }
        if self.npieces > 0 {
            let width = self.cfg.width();
            let mut b = self.stream.launch_builder(self.dev.func("gw_qsgd_pack"));
            b.arg(grad)
                .arg(&self.pieces)
                .arg(&self.inv)
                .arg(&mut self.body.dev)
                .arg(&width)
                .arg(&s)
                .arg(&sf)
                .arg(&key);
            // SAFETY: every piece's words lie inside its bucket and the body.
            unsafe { b.launch(blocks(self.npieces, 128)) }?;
        }
        self.body.finish(&self.stream, CodecId::Qsgd, self.n, out)
    }
}
