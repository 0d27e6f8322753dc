//! `dgc` (Deep Gradient Compression, Lin 2018) on the device.
//!
//! The DGC paper selects on the GPU by sampling: it estimates the threshold from 0.1% to 1%
//! of the velocity, keeps what lies above it, and re-selects exactly k among those
//! ("hierarchical selection"). Here, per compressed tensor: `gw_dgc_momentum` does the
//! momentum correction `u = m u + g; v = v + u` on the device, the sampled exact top-k of
//! `v` follows (`select.rs`), and `gw_zero_at` does momentum factor masking at the k sent
//! indices, on the device.
//!
//! Tensors sent dense (1-D ones, or below `min_dense`) run plain momentum on the device and
//! come to the host whole, as they travel. The result is the exact top-k, the CPU codec's,
//! so the payload bytes are the same; the gradient itself never leaves the device.
//! Refused: `clip>0` (local clipping needs the CPU codec's exact norm order).

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};
use gradwire_codec::external::{k_for, write_sparse};
use gradwire_codec::{
    segments, BuildContext, CodecId, DgcConfig, Progress, SparseGrad, StepRng, ValueFormat,
};

use super::select::Selector;
use super::{check_len, DeviceCodec};
use crate::device::{elementwise, Device};
use crate::error::{Error, Result};

/// DGC on the device: momentum `u` and velocity `v` live there.
pub struct DeviceDgc {
    dev: Device,
    stream: Arc<CudaStream>,
    n: usize,
    cfg: DgcConfig,
    rng: StepRng,
    epoch: f32,
    tensors: Vec<(Range<usize>, bool)>,
    u: CudaSlice<f32>,
    v: CudaSlice<f32>,
    dense: CudaSlice<f32>,
    selector: Selector,
    sel: SparseGrad,
}

impl DeviceDgc {
    /// DGC as `cfg` says for `ctx`'s rank and tensors, gradients of `n` elements.
    pub fn new(
        dev: &Device,
        stream: &Arc<CudaStream>,
        cfg: &DgcConfig,
        ctx: &BuildContext,
        n: usize,
    ) -> Result<Self> {
        if cfg.clip > 0.0 {
            return Err(Error::Unsupported("dgc clip>0".into()));
        }
        if n > u32::MAX as usize {
            return Err(crate::plan::PlanError::TooLarge {
                what: "gradient",
                value: n,
            }
            .into());
        }
        let matrix: Vec<bool> = if ctx.tensors.len() == ctx.layout.len() {
            ctx.tensors.iter().map(|t| t.is_matrix()).collect()
        } else {
            Vec::new()
        };
        let segs: Vec<Range<usize>> = segments(&ctx.layout, n).collect();
        let shaped = segs.len() == matrix.len();
        let tensors: Vec<(Range<usize>, bool)> = segs
            .into_iter()
            .enumerate()
            .map(|(t, s)| {
                let dense = match cfg.min_dense {
                    Some(min) => s.len() < min,
                    None if shaped => !matrix[t],
                    None => s.len() < 1024,
                };
                (s, dense)
            })
            .collect();
        let dense_max = tensors
            .iter()
            .filter(|t| t.1)
            .map(|t| t.0.len())
            .max()
            .unwrap_or(0);
        let longest = tensors
            .iter()
            .filter(|t| !t.1)
            .map(|t| t.0.len())
            .max()
            .unwrap_or(0);
        Ok(DeviceDgc {
            dev: dev.clone(),
            stream: stream.clone(),
            n,
            cfg: cfg.clone(),
            rng: StepRng::new(ctx.seed, ctx.rank),
            epoch: 0.0,
            u: stream.alloc_zeros::<f32>(n.max(1))?,
            v: stream.alloc_zeros::<f32>(n.max(1))?,
            dense: stream.alloc_zeros::<f32>(dense_max.max(1))?,
            selector: Selector::new(stream, longest)?,
            tensors,
            sel: SparseGrad::default(),
        })
    }

    /// The momentum `u` and velocity `v`, copied to the host.
    pub fn state(&self) -> Result<(Vec<f32>, Vec<f32>)> {
        Ok((
            self.stream.clone_dtoh(&self.u.slice(..self.n))?,
            self.stream.clone_dtoh(&self.v.slice(..self.n))?,
        ))
    }

    /// Bytes the last selection copied from the device to the host (samples, counts,
    /// candidates, dense tensors): what "the gradient never leaves the device" is measured by.
    pub fn last_host_bytes(&self) -> usize {
        self.selector.host_bytes
    }

    /// Selects this step's (index, value) pairs, advancing `u` and `v` as the CPU codec does.
    pub fn select(&mut self, grad: &CudaView<'_, f32>, out: &mut SparseGrad) -> Result<()> {
        check_len(self.n, grad)?;
        out.clear();
        self.selector.host_bytes = 0;
        let ratio = self.cfg.ratio_at(self.epoch);
        let mut rng = self.rng.next_stream();
        let m = self.cfg.momentum as f32;
        let nesterov = self.cfg.nesterov as i32;
        for ti in 0..self.tensors.len() {
            let (seg, dense) = self.tensors[ti].clone();
            let len = seg.len();
            if len == 0 {
                continue;
            }
            let base = seg.start as u32;
            let g = grad.slice(seg.clone());
            let n64 = len as u64;
            if dense {
                let mut u = self.u.slice_mut(seg.clone());
                let mut d = self.dense.slice_mut(..len);
                let mut b = self.stream.launch_builder(self.dev.func("gw_dgc_dense"));
                b.arg(&g)
                    .arg(&mut u)
                    .arg(&mut d)
                    .arg(&n64)
                    .arg(&m)
                    .arg(&nesterov);
                // SAFETY: len floats of each.
                unsafe { b.launch(elementwise(n64)) }?;
                let vals = self.stream.clone_dtoh(&self.dense.slice(..len))?;
                self.selector.host_bytes += 4 * len;
                out.indices.extend((0..len as u32).map(|i| base + i));
                out.values.extend_from_slice(&vals);
                continue;
            }
            let k = k_for(ratio, len);
            {
                let mut u = self.u.slice_mut(seg.clone());
                let mut v = self.v.slice_mut(seg.clone());
                let mut b = self.stream.launch_builder(self.dev.func("gw_dgc_momentum"));
                b.arg(&g)
                    .arg(&mut u)
                    .arg(&mut v)
                    .arg(&n64)
                    .arg(&m)
                    .arg(&nesterov);
                // SAFETY: len floats of each.
                unsafe { b.launch(elementwise(n64)) }?;
            }
            let v = self.v.slice(seg.clone());
            let cand = self
                .selector
                .top_k(&self.dev, &self.stream, &v, k, &mut rng)?;
            if !cand.is_empty() {
                let local: Vec<u32> = cand.iter().map(|c| c.0).collect();
                let nk32 = local.len() as u32;
                let idx = self.selector.upload(&self.stream, &local)?;
                let mut u = self.u.slice_mut(seg.clone());
                let mut v = self.v.slice_mut(seg.clone());
                let mut b = self.stream.launch_builder(self.dev.func("gw_zero_at"));
                b.arg(&mut u).arg(&mut v).arg(idx).arg(&nk32);
                // SAFETY: nk indices inside the tensor.
                unsafe { b.launch(elementwise(nk32 as u64)) }?;
            }
            for (i, val) in cand {
                out.indices.push(base + i);
                out.values.push(val);
            }
        }
        Ok(())
    }
}

impl DeviceCodec for DeviceDgc {
    fn id(&self) -> CodecId {
        CodecId::Dgc
    }

    fn set_progress(&mut self, progress: Progress) {
        self.rng.set_step(progress.step);
        self.epoch = progress.epoch;
    }

    fn encode(&mut self, grad: &CudaView<'_, f32>, out: &mut Vec<u8>) -> Result<()> {
        let mut sel = std::mem::take(&mut self.sel);
        let r = self.select(grad, &mut sel);
        if r.is_ok() {
            write_sparse(out, CodecId::Dgc, self.n, &sel, ValueFormat::Fp32);
        }
        self.sel = sel;
        r
    }
}
