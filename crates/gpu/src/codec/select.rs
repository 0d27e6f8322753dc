//! Exact top-k on the device by sampling, as the DGC paper selects on the GPU: shared by
//! [`super::dgc`] and [`super::topk`].
//!
//! For a tensor `x` already on the device and a count `k`:
//! 1. the threshold from a sample: the CPU codecs' positions (runs of 16 at jittered
//!    strides, 0.1% to 1% of the tensor, from the same `(seed, rank, step)` stream), their
//!    keys gathered on the device and brought to the host, an order statistic with the CPU
//!    codecs' margin (`c + 3 sqrt(c) + 2` expected hits);
//! 2. the candidates above it, compacted on the device in index order (`gw_tile_counts`,
//!    `gw_scan_counts`, `gw_compact_ordered`: counts per 4096-element tile, their prefix
//!    sums, each tile's hits written from its offset), brought to the host (a little more
//!    than k pairs); if fewer than k came out the threshold is lowered as the CPU codecs
//!    lower it;
//! 3. the exact cut to the k largest on the host, ties to the lowest index: the CPU codecs'
//!    own `cut_to_k`.
//!
//! The result is the exact top-k, the CPU codecs', so payloads are byte-identical; the
//! tensor itself never leaves the device ([`Selector::host_bytes`] counts what does).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};
use gradwire_codec::external::{cut_to_k, ThresholdEstimate};
use rand_chacha::ChaCha8Rng;

use crate::device::{blocks, elementwise, Device};
use crate::error::Result;

/// Consecutive elements per sample run (`ThresholdEstimate::sample_runs`).
const SAMPLE_RUN: usize = 16;
/// Most samples per tensor (the CPU estimator's bound).
const MAX_SAMPLES: usize = 1 << 18;
/// Elements per tile of the ordered compaction (`GW_TILE` in the kernels).
const TILE: usize = 4096;

/// The device buffers and host state of [`Selector::top_k`].
pub(crate) struct Selector {
    pos: CudaSlice<u32>,
    keys: CudaSlice<u32>,
    count: CudaSlice<u32>,
    tile_counts: CudaSlice<u32>,
    tile_offsets: CudaSlice<u32>,
    cand_idx: CudaSlice<u32>,
    cand_val: CudaSlice<f32>,
    cap: usize,
    est: ThresholdEstimate,
    scratch: Vec<u32>,
    /// Bytes copied device → host since the owner last cleared it.
    pub(crate) host_bytes: usize,
}

impl Selector {
    /// Buffers for tensors of up to `longest` elements.
    pub(crate) fn new(stream: &Arc<CudaStream>, longest: usize) -> Result<Selector> {
        let tiles = longest.div_ceil(TILE).max(1);
        let cap = 4096;
        Ok(Selector {
            pos: stream.alloc_zeros::<u32>(MAX_SAMPLES + SAMPLE_RUN)?,
            keys: stream.alloc_zeros::<u32>(MAX_SAMPLES + SAMPLE_RUN)?,
            count: stream.alloc_zeros::<u32>(1)?,
            tile_counts: stream.alloc_zeros::<u32>(tiles)?,
            tile_offsets: stream.alloc_zeros::<u32>(tiles)?,
            cand_idx: stream.alloc_zeros::<u32>(cap)?,
            cand_val: stream.alloc_zeros::<f32>(cap)?,
            cap,
            est: ThresholdEstimate::default(),
            scratch: Vec::new(),
            host_bytes: 0,
        })
    }

    /// Copies `local` indices to the device (in the candidates' buffer, free after a cut).
    pub(crate) fn upload(
        &mut self,
        stream: &Arc<CudaStream>,
        local: &[u32],
    ) -> Result<&CudaSlice<u32>> {
        if local.len() > self.cap {
            self.cap = local.len().next_power_of_two();
            self.cand_idx = stream.alloc_zeros::<u32>(self.cap)?;
            self.cand_val = stream.alloc_zeros::<f32>(self.cap)?;
        }
        if !local.is_empty() {
            stream.memcpy_htod(local, &mut self.cand_idx.slice_mut(..local.len()))?;
        }
        Ok(&self.cand_idx)
    }

    /// The candidates of `x` whose key exceeds `thr`: their count, the first `cap` written.
    fn compact(
        &mut self,
        dev: &Device,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, f32>,
        thr: u32,
    ) -> Result<usize> {
        let len = x.len() as u64;
        let tiles = x.len().div_ceil(TILE) as u32;
        let mut b = stream.launch_builder(dev.func("gw_tile_counts"));
        b.arg(x).arg(&len).arg(&thr).arg(&mut self.tile_counts);
        // SAFETY: one block per tile of len floats; tiles counts out.
        unsafe { b.launch(blocks(tiles as usize, 256)) }?;
        let mut b = stream.launch_builder(dev.func("gw_scan_counts"));
        b.arg(&self.tile_counts)
            .arg(&tiles)
            .arg(&mut self.tile_offsets)
            .arg(&mut self.count);
        // SAFETY: tiles counts in, tiles offsets and one total out.
        unsafe { b.launch(blocks(1, 1024)) }?;
        let cap = self.cap as u32;
        let mut b = stream.launch_builder(dev.func("gw_compact_ordered"));
        b.arg(x)
            .arg(&len)
            .arg(&thr)
            .arg(&self.tile_offsets)
            .arg(&cap)
            .arg(&mut self.cand_idx)
            .arg(&mut self.cand_val);
        // SAFETY: one block per tile; at most cap slots written.
        unsafe { b.launch(blocks(tiles as usize, 256)) }?;
        let c = stream.clone_dtoh(&self.count)?;
        self.host_bytes += 4;
        Ok(c[0] as usize)
    }

    /// The exact top `k` of `x` by magnitude as (local index, value), in index order; ties
    /// to the lowest index; all non-zeros when fewer than `k` are non-zero.
    pub(crate) fn top_k(
        &mut self,
        dev: &Device,
        stream: &Arc<CudaStream>,
        x: &CudaView<'_, f32>,
        k: usize,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<(u32, f32)>> {
        let len = x.len();
        let mut thr = 0u32;
        let mut pos: Vec<u32> = Vec::new();
        if self.est.sample_runs(len, k, rng, |s| {
            pos.extend(s as u32..(s + SAMPLE_RUN) as u32)
        }) {
            let np = pos.len();
            stream.memcpy_htod(&pos, &mut self.pos.slice_mut(..np))?;
            let np32 = np as u32;
            let mut b = stream.launch_builder(dev.func("gw_gather_keys"));
            b.arg(x).arg(&self.pos).arg(&np32).arg(&mut self.keys);
            // SAFETY: np positions inside the tensor, np keys out.
            unsafe { b.launch(elementwise(np as u64)) }?;
            let keys = stream.clone_dtoh(&self.keys.slice(..np))?;
            self.host_bytes += 4 * np;
            thr = self.est.first_from_keys(&keys);
        }
        let count = loop {
            let c = self.compact(dev, stream, x, thr)?;
            if c > self.cap {
                self.cap = c.next_power_of_two();
                self.cand_idx = stream.alloc_zeros::<u32>(self.cap)?;
                self.cand_val = stream.alloc_zeros::<f32>(self.cap)?;
                continue;
            }
            if c < k {
                if let Some(t) = self.est.lower() {
                    thr = t;
                    continue;
                }
            }
            break c;
        };
        if count == 0 {
            return Ok(Vec::new());
        }
        let idx = stream.clone_dtoh(&self.cand_idx.slice(..count))?;
        let val = stream.clone_dtoh(&self.cand_val.slice(..count))?;
        self.host_bytes += 8 * count;
        // The candidates are in index order: the CPU codecs' cut over their positions.
        let mut keep: Vec<u32> = (0..count as u32).collect();
        cut_to_k(&val, k, &mut keep, &mut self.scratch);
        Ok(keep
            .into_iter()
            .map(|p| (idx[p as usize], val[p as usize]))
            .collect())
    }
}
