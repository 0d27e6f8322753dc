//! `terngrad` (Wen 2017) on the device.
//!
//! Per tensor of the layout (the output layer in float unless `output=ternary`, as the CPU
//! codec): the statistics in the CPU's order (16-lane f32 partials per 4096-element block,
//! summed in f64 per block, then over the blocks), the clip bound `c sigma` and the local
//! scale, then one thread per code word with the CPU's uniforms. [`DeviceCodec::local_scalars`]
//! and [`DeviceCodec::set_shared_scalars`] do the layer-wise scalar sharing. Same bytes as the
//! CPU codec. `ef=true` is refused. One deviation, outside the payload: `local_scalars`
//! reports 0 for a tensor sent in float (the CPU codec reports its max), a scale nobody uses.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};
use gradwire_codec::{
    segments, BuildContext, CodecId, Progress, StepRng, TensorRole, TernGradConfig,
};

use super::{check_len, Body, DeviceCodec};
use crate::device::{blocks, elementwise, Device};
use crate::error::{Error, Result};
use crate::plan::{stat_blocks, Plan};

/// TernGrad on the device.
pub struct DeviceTernGrad {
    dev: Device,
    stream: Arc<CudaStream>,
    n: usize,
    clip: f32,
    rng: StepRng,
    plan: Plan,
    /// Per run: whether it travels in float.
    float: Vec<bool>,
    /// The ternary runs' indices, in order (what the statistics are computed for).
    ternary: Vec<usize>,
    pieces: CudaSlice<u32>,
    npieces: usize,
    blocks: CudaSlice<u32>,
    nblocks: u32,
    tens: CudaSlice<u32>,
    sword: CudaSlice<u32>,
    partial: [CudaSlice<f32>; 3],
    bsum: [CudaSlice<f64>; 2],
    bmax: CudaSlice<f32>,
    bound: CudaSlice<f32>,
    local: CudaSlice<f32>,
    scale: CudaSlice<f32>,
    shared: CudaSlice<f32>,
    agreed: Option<Vec<f32>>,
    body: Body,
}

impl DeviceTernGrad {
    /// TernGrad as `cfg` says for `ctx`'s rank, layout and roles, gradients of `n` elements.
    pub fn new(
        dev: &Device,
        stream: &Arc<CudaStream>,
        cfg: &TernGradConfig,
        ctx: &BuildContext,
        n: usize,
    ) -> Result<Self> {
        if cfg.ef {
            return Err(Error::Unsupported("terngrad ef=true".into()));
        }
        let segs: Vec<Range<usize>> = segments(&ctx.layout, n).collect();
        let flags: Vec<bool> = if !cfg.ternarize_output && ctx.tensors.len() == ctx.layout.len() {
            ctx.tensors
                .iter()
                .map(|t| t.role == TensorRole::Output)
                .collect()
        } else {
            Vec::new()
        };
        let fits = segs.len() == flags.len();
        let float: Vec<bool> = (0..segs.len()).map(|t| fits && flags[t]).collect();
        let ranges: Vec<(Range<usize>, bool)> =
            segs.iter().cloned().zip(float.iter().copied()).collect();
        // Pieces index runs by their position among the ternary runs (the statistics' order).
        let mut plan = Plan::new(&ranges, 2, 1)?;
        let ternary: Vec<usize> = (0..segs.len()).filter(|&t| !float[t]).collect();
        for p in &mut plan.pieces {
            p.run = ternary
                .iter()
                .position(|&t| t == p.run as usize)
                .unwrap_or(0) as u32;
        }
        let tern_ranges: Vec<Range<usize>> = ternary.iter().map(|&t| segs[t].clone()).collect();
        let (blk, per) = stat_blocks(&tern_ranges);
        let nblocks = blk.len() / 2;
        let tens: Vec<u32> = per
            .iter()
            .zip(&tern_ranges)
            .flat_map(|(b, r)| [b.start as u32, b.len() as u32, r.len() as u32])
            .collect();
        let sword: Vec<u32> = ternary.iter().map(|&t| plan.runs[t].scale_word).collect();
        let nt = ternary.len().max(1);
        let nb = nblocks.max(1);
        Ok(DeviceTernGrad {
            dev: dev.clone(),
            stream: stream.clone(),
            n,
            clip: cfg.clip as f32,
            rng: StepRng::new(ctx.seed, ctx.rank),
            pieces: stream.clone_htod(&plan.piece_table())?,
            npieces: plan.pieces.len(),
            blocks: stream.clone_htod(&blk)?,
            nblocks: nblocks as u32,
            tens: stream.clone_htod(&tens)?,
            sword: stream.clone_htod(&sword)?,
            partial: [
                stream.alloc_zeros::<f32>(16 * nb)?,
                stream.alloc_zeros::<f32>(16 * nb)?,
                stream.alloc_zeros::<f32>(16 * nb)?,
            ],
            bsum: [
                stream.alloc_zeros::<f64>(nb)?,
                stream.alloc_zeros::<f64>(nb)?,
            ],
            bmax: stream.alloc_zeros::<f32>(nb)?,
            bound: stream.alloc_zeros::<f32>(nt)?,
            local: stream.alloc_zeros::<f32>(nt)?,
            scale: stream.alloc_zeros::<f32>(nt)?,
            shared: stream.alloc_zeros::<f32>(nt)?,
            agreed: None,
            body: Body::new(stream, plan.body_words)?,
            plan,
            float,
            ternary,
        })
    }

    /// Runs the three statistics kernels: `bound` and `local` per ternary tensor.
    fn stats(&mut self, grad: &CudaView<'_, f32>) -> Result<()> {
        if self.nblocks == 0 {
            return Ok(());
        }
        let nb = self.nblocks;
        let [ps, pq, pm] = &mut self.partial;
        let mut b = self
            .stream
            .launch_builder(self.dev.func("gw_tern_partials"));
        b.arg(grad)
            .arg(&self.blocks)
            .arg(&nb)
            .arg(ps)
            .arg(pq)
            .arg(pm);
        // SAFETY: 16 threads per block of the table; partials hold 16 per block.
        unsafe { b.launch(blocks((nb as usize * 16).div_ceil(256), 256)) }?;
        let [bs, bq] = &mut self.bsum;
        let mut b = self.stream.launch_builder(self.dev.func("gw_tern_blocks"));
        b.arg(&self.partial[0])
            .arg(&self.partial[1])
            .arg(&self.partial[2])
            .arg(&nb)
            .arg(bs)
            .arg(bq)
            .arg(&mut self.bmax);
        // SAFETY: nb blocks of partials in, nb sums out.
        unsafe { b.launch(elementwise(nb as u64)) }?;
        let nt = self.ternary.len() as u32;
        let mut b = self.stream.launch_builder(self.dev.func("gw_tern_stats"));
        b.arg(&self.bsum[0])
            .arg(&self.bsum[1])
            .arg(&self.bmax)
            .arg(&self.tens)
            .arg(&nt)
            .arg(&self.clip)
            .arg(&mut self.bound)
            .arg(&mut self.local);
        // SAFETY: nt tensors whose block ranges lie inside the block sums.
        unsafe { b.launch(elementwise(nt as u64)) }?;
        Ok(())
    }
}

impl DeviceCodec for DeviceTernGrad {
    fn id(&self) -> CodecId {
        CodecId::TernGrad
    }

    fn set_progress(&mut self, progress: Progress) {
        self.rng.set_step(progress.step);
    }

    fn local_scalars(&mut self, grad: &CudaView<'_, f32>) -> Result<Vec<f32>> {
        check_len(self.n, grad)?;
        self.stats(grad)?;
        let local = self.stream.clone_dtoh(&self.local)?;
        // One scalar per tensor, in the CPU codec's order. A tensor sent in float reports 0
        // here where the CPU codec reports its max: its scale is never used, and the ranks'
        // element-wise max is unchanged for every ternary tensor.
        let mut out = vec![0f32; self.float.len()];
        for (j, &t) in self.ternary.iter().enumerate() {
            out[t] = local[j];
        }
        Ok(out)
    }

    fn set_shared_scalars(&mut self, values: &[f32]) {
        self.agreed = Some(values.to_vec());
    }

    fn encode(&mut self, grad: &CudaView<'_, f32>, out: &mut Vec<u8>) -> Result<()> {
        check_len(self.n, grad)?;
        let key = self.rng.next_key();
        self.stats(grad)?;
        let nt = self.ternary.len() as u32;
        let has_shared: i32 = match self.agreed.take() {
            Some(v) => {
                let mine: Vec<f32> = self
                    .ternary
                    .iter()
                    .map(|&t| v.get(t).copied().unwrap_or(0.0))
                    .collect();
                if !mine.is_empty() {
                    self.stream
                        .memcpy_htod(&mine, &mut self.shared.slice_mut(..mine.len()))?;
                }
                1
            }
            None => 0,
        };
        if nt > 0 {
            let mut b = self.stream.launch_builder(self.dev.func("gw_tern_scale"));
            b.arg(&self.local)
                .arg(&self.shared)
                .arg(&self.sword)
                .arg(&nt)
                .arg(&mut self.scale)
                .arg(&mut self.body.dev)
                .arg(&has_shared);
            // SAFETY: nt tensors, each with a scale word inside the body.
            unsafe { b.launch(elementwise(nt as u64)) }?;
        }
        for (t, run) in self.plan.runs.iter().enumerate() {
            if self.float[t] && run.len > 0 {
                let mut b = self.stream.launch_builder(self.dev.func("gw_f32_words"));
                b.arg(grad)
                    .arg(&run.start)
                    .arg(&run.len)
                    .arg(&mut self.body.dev)
                    .arg(&run.scale_word);
                // SAFETY: the run lies inside the gradient and its words inside the body.
                unsafe { b.launch(elementwise(run.len as u64)) }?;
            }
        }
        if self.npieces > 0 {
            let mut b = self.stream.launch_builder(self.dev.func("gw_tern_pack"));
            b.arg(grad)
                .arg(&self.pieces)
                .arg(&self.bound)
                .arg(&self.scale)
                .arg(&mut self.body.dev)
                .arg(&key);
            // SAFETY: every piece's words lie inside its tensor and the body.
            unsafe { b.launch(blocks(self.npieces, 128)) }?;
        }
        self.body
            .finish(&self.stream, CodecId::TernGrad, self.n, out)
    }
}
