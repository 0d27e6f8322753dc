//! `topk` (Aji & Heafield 2017) on the device.
//!
//! Per encode, with error feedback (`ef=true`, the default): `r = r + g` on the device
//! (`gw_add`), the exact top-k of `r` by the sampled selection shared with DGC (`select.rs`),
//! one top-k over the whole gradient (`scope=global`, the paper's) or per tensor
//! (`scope=tensor`); the sent values are rounded to the value format on the host (k of
//! them), and what the rounding left (0 for fp32) is written back into `r` at the sent
//! indices (`gw_scatter_set`). Without feedback the selection reads the gradient itself. Same
//! pairs, so the same bytes, as the CPU codec.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};
use gradwire_codec::external::{k_for, write_sparse};
use gradwire_codec::{
    segments, BuildContext, CodecId, Progress, SparseGrad, StepRng, TopKConfig, TopKScope,
};

use super::select::Selector;
use super::{check_len, DeviceCodec};
use crate::device::{elementwise, Device};
use crate::error::Result;

/// Top-k gradient dropping on the device.
pub struct DeviceTopK {
    dev: Device,
    stream: Arc<CudaStream>,
    n: usize,
    cfg: TopKConfig,
    rng: StepRng,
    ratio: f64,
    segs: Vec<Range<usize>>,
    /// The residual (with `ef`), or the gradient's copy (without).
    x: CudaSlice<f32>,
    selector: Selector,
    sel: SparseGrad,
}

impl DeviceTopK {
    /// Top-k as `cfg` says for `ctx`'s rank and layout, gradients of `n` elements.
    pub fn new(
        dev: &Device,
        stream: &Arc<CudaStream>,
        cfg: &TopKConfig,
        ctx: &BuildContext,
        n: usize,
    ) -> Result<Self> {
        if n > u32::MAX as usize {
            return Err(crate::plan::PlanError::TooLarge {
                what: "gradient",
                value: n,
            }
            .into());
        }
        let segs: Vec<Range<usize>> = match cfg.scope {
            TopKScope::Global => std::iter::once(0..n).collect(),
            TopKScope::Tensor => segments(&ctx.layout, n).collect(),
        };
        let longest = segs.iter().map(|s| s.len()).max().unwrap_or(0);
        Ok(DeviceTopK {
            dev: dev.clone(),
            stream: stream.clone(),
            n,
            cfg: cfg.clone(),
            rng: StepRng::new(ctx.seed, ctx.rank),
            ratio: cfg.ratio_at(0.0),
            segs,
            x: stream.alloc_zeros::<f32>(n.max(1))?,
            selector: Selector::new(stream, longest)?,
            sel: SparseGrad::default(),
        })
    }

    /// Bytes the last selection copied from the device to the host.
    pub fn last_host_bytes(&self) -> usize {
        self.selector.host_bytes
    }

    /// The residual, copied to the host (zeros without error feedback).
    pub fn residual(&self) -> Result<Vec<f32>> {
        if !self.cfg.ef {
            return Ok(vec![0.0; self.n]);
        }
        Ok(self.stream.clone_dtoh(&self.x.slice(..self.n))?)
    }

    /// Selects this step's (index, value) pairs, advancing the residual as the CPU codec does.
    pub fn select(&mut self, grad: &CudaView<'_, f32>, out: &mut SparseGrad) -> Result<()> {
        check_len(self.n, grad)?;
        out.clear();
        self.selector.host_bytes = 0;
        let n64 = self.n as u64;
        if self.cfg.ef {
            if n64 > 0 {
                let mut b = self.stream.launch_builder(self.dev.func("gw_add"));
                b.arg(&mut self.x).arg(grad).arg(&n64);
                // SAFETY: n floats of each.
                unsafe { b.launch(elementwise(n64)) }?;
            }
        } else if n64 > 0 {
            let mut x = self.x.slice_mut(..self.n);
            self.stream.memcpy_dtod(grad, &mut x)?;
        }
        let mut rng = self.rng.next_stream();
        let vf = self.cfg.values;
        for seg in self.segs.clone() {
            let k = k_for(self.ratio, seg.len());
            let base = seg.start as u32;
            let x = self.x.slice(seg.clone());
            let cand = self
                .selector
                .top_k(&self.dev, &self.stream, &x, k, &mut rng)?;
            if cand.is_empty() {
                continue;
            }
            let sent: Vec<f32> = cand.iter().map(|c| vf.round(c.1)).collect();
            if self.cfg.ef {
                let local: Vec<u32> = cand.iter().map(|c| c.0).collect();
                let left: Vec<f32> = cand.iter().zip(&sent).map(|(c, v)| c.1 - v).collect();
                let nk = local.len();
                let nk32 = nk as u32;
                let left_dev = self.stream.clone_htod(&left)?;
                let idx = self.selector.upload(&self.stream, &local)?;
                let mut r = self.x.slice_mut(seg.clone());
                let mut b = self.stream.launch_builder(self.dev.func("gw_scatter_set"));
                b.arg(&mut r).arg(idx).arg(&left_dev).arg(&nk32);
                // SAFETY: nk indices inside the tensor, nk values.
                unsafe { b.launch(elementwise(nk as u64)) }?;
            }
            for ((i, _), v) in cand.into_iter().zip(sent) {
                out.indices.push(base + i);
                out.values.push(v);
            }
        }
        Ok(())
    }
}

impl DeviceCodec for DeviceTopK {
    fn id(&self) -> CodecId {
        CodecId::TopK
    }

    fn set_progress(&mut self, progress: Progress) {
        self.rng.set_step(progress.step);
        self.ratio = self.cfg.ratio_at(progress.epoch);
    }

    fn encode(&mut self, grad: &CudaView<'_, f32>, out: &mut Vec<u8>) -> Result<()> {
        let mut sel = std::mem::take(&mut self.sel);
        let r = self.select(grad, &mut sel);
        if r.is_ok() {
            write_sparse(out, CodecId::TopK, self.n, &sel, self.cfg.values);
        }
        self.sel = sel;
        r
    }
}
