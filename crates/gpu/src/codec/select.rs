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
//! 3. the exact cut to the k largest on the host, ties to the lowest index, as the CPU
//!    codecs' `cut_to_k`.
//!
//! The result is the exact top-k, the CPU codecs', so payloads are byte-identical; the
//! tensor itself never leaves the device ([`Selector::host_bytes`] counts what does).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, PushKernelArg};
use gradwire_codec::external::key;
use rand::Rng;

use crate::device::{blocks, elementwise, Device};
use crate::error::Result;

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
    est: Estimate,
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
            est: Estimate::default(),
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
        rng: &mut impl Rng,
    ) -> Result<Vec<(u32, f32)>> {
        let len = x.len();
        let mut thr = 0u32;
        if let Some(pos) = self.est.positions(len, k, rng) {
            let np = pos.len();
            stream.memcpy_htod(&pos, &mut self.pos.slice_mut(..np))?;
            let np32 = np as u32;
            let mut b = stream.launch_builder(dev.func("gw_gather_keys"));
            b.arg(x).arg(&self.pos).arg(&np32).arg(&mut self.keys);
            // SAFETY: np positions inside the tensor, np keys out.
            unsafe { b.launch(elementwise(np as u64)) }?;
            let keys = stream.clone_dtoh(&self.keys.slice(..np))?;
            self.host_bytes += 4 * np;
            thr = self.est.first(keys);
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
        let mut cand: Vec<(u32, f32)> = if count > 0 {
            let idx = stream.clone_dtoh(&self.cand_idx.slice(..count))?;
            let val = stream.clone_dtoh(&self.cand_val.slice(..count))?;
            self.host_bytes += 8 * count;
            idx.into_iter().zip(val).collect()
        } else {
            Vec::new()
        };
        cut_to_k(&mut cand, k);
        Ok(cand)
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
