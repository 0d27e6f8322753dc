//! `dgc` (Deep Gradient Compression, Lin 2018) on the device.
//!
//! The DGC paper selects on the GPU by sampling: it estimates the threshold from 0.1% to 1%
//! of the velocity, keeps what lies above it, and re-selects exactly k among those
//! ("hierarchical selection"). Here, per compressed tensor:
//! 1. `gw_dgc_momentum`: momentum correction `u = m u + g; v = v + u` on the device;
//! 2. the sample: the CPU codec's positions (runs of 16 at jittered strides, drawn from the
//!    same `(seed, rank, step)` stream), their keys gathered on the device and brought to
//!    the host (0.1-1% of the tensor), the threshold an order statistic with the CPU codec's
//!    margin;
//! 3. the candidates above it, compacted on the device in index order (`gw_tile_counts`,
//!    `gw_scan_counts`, `gw_compact_ordered`: counts per 4096-element tile, their prefix
//!    sums, each tile's hits written from its offset), brought to the host (a little more
//!    than k pairs); if fewer than k came out the threshold is lowered as the CPU codec
//!    lowers it;
//! 4. the exact cut to the k largest on the host, ties to the lowest index, as the CPU codec;
//! 5. `gw_zero_at`: momentum factor masking at the k sent indices, on the device.
//!
//! Tensors sent dense (1-D ones, or below `min_dense`) run plain momentum on the device and
//! come to the host whole, as they travel. The result is the exact top-k, the CPU codec's,
//! so the payload bytes are the same; the gradient itself never leaves the device.
//! Refused: `clip>0` (local clipping needs the CPU codec's exact norm order).

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};
use gradwire_codec::external::{k_for, key, write_sparse};
use gradwire_codec::{
    segments, BuildContext, CodecId, DgcConfig, Progress, SparseGrad, StepRng, ValueFormat,
};
use rand::Rng;

use super::{check_len, DeviceCodec};
use crate::device::{blocks, elementwise, Device};
use crate::error::{Error, Result};

/// Below this many elements selection skips sampling (the CPU codec's constant).
const SMALL_N: usize = 1 << 14;
/// Consecutive elements per sample run.
const SAMPLE_RUN: usize = 16;
/// Most samples per tensor.
const MAX_SAMPLES: usize = 1 << 18;
/// Elements per tile of the ordered compaction (`GW_TILE` in the kernels).
const TILE: usize = 4096;

/// The sampled threshold: the CPU codec's `ThresholdEstimate`, over keys gathered on the
/// device.
#[derive(Debug, Default)]
struct Estimate {
    keys: Vec<u32>,
    m: usize,
    upper: usize,
    thr: u32,
}

impl Estimate {
    /// The sample positions for a tensor of `n` with `k` to keep, or `None` (threshold 0).
    fn positions(&mut self, n: usize, k: usize, rng: &mut impl Rng) -> Option<Vec<u32>> {
        self.keys.clear();
        self.thr = 0;
        self.upper = 0;
        if n <= SMALL_N || k > n / 2 {
            return None;
        }
        let p = k as f64 / n as f64;
        let want = ((32.0 / p) as usize)
            .clamp(n / 1000, n / 100)
            .clamp(1024, MAX_SAMPLES);
        let want = want.min(n / 4);
        let runs = want.div_ceil(SAMPLE_RUN);
        let stride = n / runs;
        if stride < SAMPLE_RUN {
            return None;
        }
        let mut pos = Vec::with_capacity(runs * SAMPLE_RUN);
        for j in 0..runs {
            let start = j * stride + rng.gen_range(0..=stride - SAMPLE_RUN);
            pos.extend((start..start + SAMPLE_RUN).map(|i| i as u32));
        }
        let c = pos.len() as f64 * p;
        self.m = (c + 3.0 * c.sqrt() + 2.0).ceil() as usize;
        Some(pos)
    }

    /// The first threshold from the sampled keys.
    fn first(&mut self, keys: Vec<u32>) -> u32 {
        self.upper = keys.len();
        self.keys = keys;
        self.cut()
    }

    fn cut(&mut self) -> u32 {
        let s = self.keys.len();
        if self.m >= s || self.upper == 0 {
            self.thr = 0;
            self.upper = 0;
            return 0;
        }
        let pos = (s - self.m).min(self.upper - 1);
        self.keys[..self.upper].select_nth_unstable(pos);
        self.upper = pos;
        self.thr = self.keys[pos];
        self.thr
    }

    /// A lower threshold (4x the sample hits, finally 0), or `None` when already at 0.
    fn lower(&mut self) -> Option<u32> {
        if self.thr == 0 {
            return None;
        }
        let prev = self.thr;
        self.m = self.m.saturating_mul(4);
        while self.cut() == prev && prev != 0 {
            self.m = self.m.saturating_mul(4);
        }
        Some(self.thr)
    }
}

/// Cuts `cand` (local index, value), in increasing index order, to the `k` largest keys,
/// keeping that order; ties at the k-th key go to the lowest indices (the CPU codec's
/// `cut_to_k`).
fn cut_to_k(cand: &mut Vec<(u32, f32)>, k: usize) {
    if cand.len() <= k {
        return;
    }
    if k == 0 {
        cand.clear();
        return;
    }
    let mut keys: Vec<u32> = cand.iter().map(|c| key(c.1)).collect();
    let pos = keys.len() - k;
    keys.select_nth_unstable(pos);
    let tk = keys[pos];
    let above = keys[pos + 1..].iter().filter(|&&v| v > tk).count();
    let mut ties = k - above;
    cand.retain(|c| {
        let kk = key(c.1);
        if kk > tk {
            true
        } else if kk == tk && ties > 0 {
            ties -= 1;
            true
        } else {
            false
        }
    });
}

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
    pos: CudaSlice<u32>,
    keys: CudaSlice<u32>,
    count: CudaSlice<u32>,
    tile_counts: CudaSlice<u32>,
    tile_offsets: CudaSlice<u32>,
    cand_idx: CudaSlice<u32>,
    cand_val: CudaSlice<f32>,
    cap: usize,
    est: Estimate,
    sel: SparseGrad,
    host_bytes: usize,
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
        let cap = 4096;
        let tiles = tensors
            .iter()
            .map(|t| t.0.len().div_ceil(TILE))
            .max()
            .unwrap_or(0)
            .max(1);
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
            pos: stream.alloc_zeros::<u32>(MAX_SAMPLES + SAMPLE_RUN)?,
            keys: stream.alloc_zeros::<u32>(MAX_SAMPLES + SAMPLE_RUN)?,
            count: stream.alloc_zeros::<u32>(1)?,
            tile_counts: stream.alloc_zeros::<u32>(tiles)?,
            tile_offsets: stream.alloc_zeros::<u32>(tiles)?,
            cand_idx: stream.alloc_zeros::<u32>(cap)?,
            cand_val: stream.alloc_zeros::<f32>(cap)?,
            cap,
            tensors,
            est: Estimate::default(),
            sel: SparseGrad::default(),
            host_bytes: 0,
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
        self.host_bytes
    }

    /// The candidates of tensor `seg` whose key exceeds `thr` (count, and the first `cap`).
    fn compact(&mut self, seg: &Range<usize>, thr: u32) -> Result<usize> {
        let len = seg.len() as u64;
        let tiles = seg.len().div_ceil(TILE) as u32;
        let v = self.v.slice(seg.clone());
        let mut b = self.stream.launch_builder(self.dev.func("gw_tile_counts"));
        b.arg(&v).arg(&len).arg(&thr).arg(&mut self.tile_counts);
        // SAFETY: one block per tile of len floats; tiles counts out.
        unsafe { b.launch(blocks(tiles as usize, 256)) }?;
        let mut b = self.stream.launch_builder(self.dev.func("gw_scan_counts"));
        b.arg(&self.tile_counts)
            .arg(&tiles)
            .arg(&mut self.tile_offsets)
            .arg(&mut self.count);
        // SAFETY: tiles counts in, tiles offsets and one total out.
        unsafe { b.launch(blocks(1, 1024)) }?;
        let cap = self.cap as u32;
        let mut b = self
            .stream
            .launch_builder(self.dev.func("gw_compact_ordered"));
        b.arg(&v)
            .arg(&len)
            .arg(&thr)
            .arg(&self.tile_offsets)
            .arg(&cap)
            .arg(&mut self.cand_idx)
            .arg(&mut self.cand_val);
        // SAFETY: one block per tile; at most cap slots written.
        unsafe { b.launch(blocks(tiles as usize, 256)) }?;
        let c = self.stream.clone_dtoh(&self.count)?;
        self.host_bytes += 4;
        Ok(c[0] as usize)
    }

    /// Selects this step's (index, value) pairs, advancing `u` and `v` as the CPU codec does.
    pub fn select(&mut self, grad: &CudaView<'_, f32>, out: &mut SparseGrad) -> Result<()> {
        check_len(self.n, grad)?;
        out.clear();
        self.host_bytes = 0;
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
                self.host_bytes += 4 * len;
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
            let mut thr = 0u32;
            if let Some(pos) = self.est.positions(len, k, &mut rng) {
                let np = pos.len();
                self.stream
                    .memcpy_htod(&pos, &mut self.pos.slice_mut(..np))?;
                let v = self.v.slice(seg.clone());
                let np32 = np as u32;
                let mut b = self.stream.launch_builder(self.dev.func("gw_gather_keys"));
                b.arg(&v).arg(&self.pos).arg(&np32).arg(&mut self.keys);
                // SAFETY: np positions inside the tensor, np keys out.
                unsafe { b.launch(elementwise(np as u64)) }?;
                let keys = self.stream.clone_dtoh(&self.keys.slice(..np))?;
                self.host_bytes += 4 * np;
                thr = self.est.first(keys);
            }
            let count = loop {
                let c = self.compact(&seg, thr)?;
                if c > self.cap {
                    self.cap = c.next_power_of_two();
                    self.cand_idx = self.stream.alloc_zeros::<u32>(self.cap)?;
                    self.cand_val = self.stream.alloc_zeros::<f32>(self.cap)?;
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
            let mut cand: Vec<(u32, f32)> = if count > 0 {
                let idx = self.stream.clone_dtoh(&self.cand_idx.slice(..count))?;
                let val = self.stream.clone_dtoh(&self.cand_val.slice(..count))?;
                self.host_bytes += 8 * count;
                idx.into_iter().zip(val).collect()
            } else {
                Vec::new()
            };
            cut_to_k(&mut cand, k);
            if !cand.is_empty() {
                let local: Vec<u32> = cand.iter().map(|c| c.0).collect();
                let nk = local.len();
                self.stream
                    .memcpy_htod(&local, &mut self.cand_idx.slice_mut(..nk))?;
                let mut u = self.u.slice_mut(seg.clone());
                let mut v = self.v.slice_mut(seg.clone());
                let nk32 = nk as u32;
                let mut b = self.stream.launch_builder(self.dev.func("gw_zero_at"));
                b.arg(&mut u).arg(&mut v).arg(&self.cand_idx).arg(&nk32);
                // SAFETY: nk indices inside the tensor.
                unsafe { b.launch(elementwise(nk as u64)) }?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_keeps_the_k_largest_with_ties_to_the_lowest_index() {
        let mut c = vec![(1, 0.5), (2, -3.0), (3, 2.0), (5, 2.0), (7, -2.0), (9, 1.0)];
        cut_to_k(&mut c, 3);
        assert_eq!(c, vec![(2, -3.0), (3, 2.0), (5, 2.0)]);
        let mut c = vec![(1, 1.0), (4, 1.0)];
        cut_to_k(&mut c, 5);
        assert_eq!(c, vec![(1, 1.0), (4, 1.0)]);
        let mut c = vec![(0, 2.0), (3, -1.0), (4, 1.0), (6, 1.0), (8, -1.0)];
        cut_to_k(&mut c, 3);
        assert_eq!(c, vec![(0, 2.0), (3, -1.0), (4, 1.0)]);
    }

    #[test]
    fn the_sample_follows_the_papers_range_and_lowers_to_zero() {
        use rand::SeedableRng;
        let mut e = Estimate::default();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        assert!(
            e.positions(1000, 1, &mut rng).is_none(),
            "small tensors are not sampled"
        );
        let n = 1 << 22;
        let pos = e.positions(n, n / 1000, &mut rng).unwrap();
        assert!(
            pos.len() >= n / 1000 && pos.len() <= n / 100 + 16,
            "{}",
            pos.len()
        );
        assert!(pos.iter().all(|&p| (p as usize) < n));
        let keys: Vec<u32> = (0..pos.len() as u32).collect();
        let t = e.first(keys);
        assert!(t > 0);
        let mut last = t;
        while let Some(t) = e.lower() {
            assert!(t < last);
            last = t;
        }
        assert_eq!(last, 0);
    }
}
