//! Data-parallel training on the GPU with DGC: rank threads sharing the device, each with its
//! own MLP replica ([`gradwire_gpu::mlp::Mlp`]) and device DGC
//! ([`gradwire_gpu::codec::dgc::DeviceDgc`]); the selected pairs are summed by the sparse
//! all-reduce over TCP on loopback and applied on the device. The gradient itself never comes
//! to the host: the bytes each selection copies down are counted and reported.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::CudaSlice;
use gradwire_codec::{BuildContext, CodecConfig, Progress, SparseGrad};
use gradwire_collective::compressed::{SparseAllReduce, SparseSum as Sum};
use gradwire_gpu::codec::dgc::DeviceDgc;
use gradwire_gpu::codec::DeviceCodec;
use gradwire_gpu::device::Device;
use gradwire_gpu::mlp::{Batch, DeviceData, Mlp, MlpShape};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Value};

use crate::ranks::on_ranks;
use crate::R;

/// An IDX file (gzip): its dimensions and bytes.
fn idx(path: &Path) -> R<(Vec<usize>, Vec<u8>)> {
    // Fashion-MNIST's largest file is 47 MB unpacked: refuse anything far beyond it rather
    // than inflate a gzip bomb.
    const MAX: u64 = 1 << 28;
    let bad = |what: &str| format!("{}: {what}", path.display());
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path)?)
        .take(MAX + 1)
        .read_to_end(&mut raw)?;
    if raw.len() as u64 > MAX {
        return Err(bad("larger than 256 MiB unpacked").into());
    }
    if raw.len() < 4 || raw[0] != 0 || raw[1] != 0 || raw[2] != 8 {
        return Err(bad("not an unsigned-byte IDX file").into());
    }
    let head = 4 + 4 * raw[3] as usize;
    if raw.len() < head {
        return Err(bad("truncated header").into());
    }
    let dims: Vec<usize> = raw[4..head]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let body = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if body != Some(raw.len() - head) || dims.is_empty() {
        return Err(bad("length does not match its dimensions").into());
    }
    Ok((dims, raw[head..].to_vec()))
}

/// Images scaled to [0, 1] and standardized with Fashion-MNIST's mean and deviation.
fn images(dir: &Path, name: &str) -> R<(Vec<f32>, Vec<u32>, usize)> {
    let (d, px) = idx(&dir.join(format!("{name}-images-idx3-ubyte.gz")))?;
    let (_, lb) = idx(&dir.join(format!("{name}-labels-idx1-ubyte.gz")))?;
    // The kernels index images and labels by row: the counts, the image size and the labels
    // must agree before anything reaches the device.
    if d.len() != 3 || d[1] * d[2] != 784 || d[0] != lb.len() || lb.iter().any(|&l| l > 9) {
        return Err(format!("{name}: not Fashion-MNIST's 28x28 images with labels 0..9").into());
    }
    let x = px
        .iter()
        .map(|&p| (p as f32 / 255.0 - 0.2860) / 0.3530)
        .collect();
    Ok((x, lb.iter().map(|&l| l as u32).collect(), d[0]))
}

/// Trains with DGC 0.1% (one warm-up epoch) and, as the dense reference, with `ratio=1`
/// (every element sent: momentum SGD, the same code path).
pub fn train(dev: &Device, data: &Path, quick: bool) -> R<Value> {
    let mut runs = Vec::new();
    for spec in [
        "dgc:ratio=0.001,warmup_epochs=1",
        "dgc:ratio=1,warmup_epochs=0",
    ] {
        runs.push(train_one(dev, data, quick, spec)?);
    }
    Ok(json!({ "runs": runs }))
}

fn train_one(dev: &Device, data: &Path, quick: bool, spec: &'static str) -> R<Value> {
    let world = 2usize;
    let (epochs, batch, lr) = (if quick { 1 } else { 3 }, 64usize, 0.05f32);
    let shape = MlpShape {
        inputs: 784,
        hidden: 1024,
        classes: 10,
    };
    let (xtr, ytr, ntr) = images(data, "train")?;
    let (xte, yte, nte) = images(data, "t10k")?;
    let ntr = if quick { ntr.min(8192) } else { ntr };
    let transports = gradwire_transport::tcp::loopback_world(world)?;
    let dev = dev.clone();
    let data = Arc::new((xtr, ytr, xte, yte));
    let results = on_ranks(transports, move |rank, mut t| {
        let (xtr, ytr, xte, yte) = &*data;
        let stream = dev.new_stream()?;
        let train = DeviceData::upload(&stream, xtr, ytr)?;
        let test = DeviceData::upload(&stream, xte, yte)?;
        let mut model = Mlp::new(&dev, &stream, shape, batch, 1)?;
        let n = shape.params();
        let cfg: CodecConfig = spec.parse()?;
        let CodecConfig::Dgc(dgc_cfg) = cfg else {
            unreachable!()
        };
        let ctx = BuildContext::new(1, rank, world, vec![]).with_tensors(shape.tensors());
        let mut dgc = DeviceDgc::new(&dev, &stream, &dgc_cfg, &ctx, n)?;
        let mut sar = SparseAllReduce::new();
        let mut mine = SparseGrad::default();
        let mut bt = Batch::new(&stream, batch, shape.inputs)?;
        let mut sidx: CudaSlice<u32> = stream.alloc_zeros(n)?;
        let mut sval: CudaSlice<f32> = stream.alloc_zeros(n)?;
        let shard: Vec<u32> = (rank..ntr).step_by(world).map(|i| i as u32).collect();
        let steps = shard.len() / batch;
        let mut rows = Vec::new();
        let mut step = 0u64;
        for epoch in 0..epochs {
            let t0 = Instant::now();
            let mut order = shard.clone();
            order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(
                (epoch * world + rank) as u64,
            ));
            model.reset_stats()?;
            let (mut max_down, mut pairs) = (0usize, 0usize);
            for s in 0..steps {
                bt.gather(&dev, &stream, &train, &order[s * batch..(s + 1) * batch])?;
                model.backward(&bt.x.as_view(), &bt.labels.as_view())?;
                dgc.set_progress(Progress {
                    step,
                    epoch: epoch as f32 + s as f32 / steps as f32,
                });
                dgc.select(&model.grads.as_view(), &mut mine)?;
                max_down = max_down.max(dgc.last_host_bytes());
                pairs += mine.indices.len();
                let scale = lr / world as f32;
                match sar.all_reduce_pairs_sum(&mut t, &mine, n)? {
                    Sum::Sparse(sum) => {
                        let k = sum.indices.len();
                        if k > 0 {
                            stream.memcpy_htod(&sum.indices, &mut sidx.slice_mut(..k))?;
                            stream.memcpy_htod(&sum.values, &mut sval.slice_mut(..k))?;
                            model.step_sparse(&sidx.slice(..k), &sval.slice(..k), scale)?;
                        }
                    }
                    Sum::Dense(sum) => {
                        stream.memcpy_htod(sum, &mut sval)?;
                        model.step_dense(&sval.as_view(), scale)?;
                    }
                }
                step += 1;
            }
            let (loss, _) = model.stats()?;
            let train_loss = loss / (steps * batch) as f64;
            model.reset_stats()?;
            model.evaluate(&test)?;
            let (_, correct) = model.stats()?;
            let row = json!({
                "epoch": epoch + 1, "rank": rank, "train_loss": train_loss,
                "test_accuracy": correct / nte as f64, "seconds": t0.elapsed().as_secs_f64(),
                "steps": steps, "pairs_per_step": pairs as f64 / steps as f64,
                "gradient_bytes": 4 * n, "max_bytes_to_host_per_step": max_down,
            });
            if rank == 0 {
                eprintln!("train {spec} {row}");
            }
            rows.push(row);
        }
        Ok(rows)
    });
    let mut out = json!({
        "model": format!("mlp {}-{}-{}", shape.inputs, shape.hidden, shape.classes),
        "params": shape.params(), "codec": spec, "ranks": world, "batch_per_rank": batch,
        "lr": lr, "optimizer": "plain SGD (DGC owns the momentum, 0.9)", "dataset": "fashion-mnist",
        "transport": "tcp loopback, sparse all-reduce", "train_examples": ntr,
    });
    match results {
        Err(e) => out["error"] = json!(e),
        Ok(results) => out["epochs"] = json!(results[0]),
    }
    Ok(out)
}
