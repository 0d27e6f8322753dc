//! A multi-layer perceptron trained on the GPU: `inputs → hidden (ReLU) → classes`, softmax
//! cross-entropy, its forward and backward passes on cuBLAS (`sgemm`) and the kernels of
//! [`crate::kernels`], and the SGD step applied on the device from a sparse or dense sum.
//!
//! Parameters and gradients are each ONE flat device buffer, `[W1 (inputs x hidden), b1,
//! W2 (hidden x classes), b2]` (burn's `[in, out]` row-major Linear layout, so the tensor
//! shapes the codecs read are the CPU models'), so a device codec reads the gradient where
//! backward wrote it.

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, PushKernelArg};
use gradwire_codec::{TensorInfo, TensorRole};

use crate::device::{elementwise, Device};
use crate::error::{Error, Result};

/// The MLP's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlpShape {
    /// Input features.
    pub inputs: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Classes.
    pub classes: usize,
}

impl MlpShape {
    /// The tensors of the flat parameter buffer, in order, with shapes and roles.
    pub fn tensors(&self) -> Vec<TensorInfo> {
        vec![
            TensorInfo::new([self.inputs, self.hidden], TensorRole::LinearWeight),
            TensorInfo::new([self.hidden], TensorRole::Bias),
            TensorInfo::new([self.hidden, self.classes], TensorRole::Output),
            TensorInfo::new([self.classes], TensorRole::Output),
        ]
    }

    /// Number of parameters.
    pub fn params(&self) -> usize {
        self.tensors().iter().map(|t| t.numel()).sum()
    }

    fn offsets(&self) -> [usize; 5] {
        let w1 = self.inputs * self.hidden;
        let w2 = self.hidden * self.classes;
        [
            0,
            w1,
            w1 + self.hidden,
            w1 + self.hidden + w2,
            w1 + self.hidden + w2 + self.classes,
        ]
    }
}

/// Uniform in `[-1, 1)` from a 64-bit LCG: the same initial parameters on every rank.
fn init(shape: &MlpShape, seed: u64) -> Vec<f32> {
    let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut p = Vec::with_capacity(shape.params());
    // Kaiming-uniform for the ReLU layer, Glorot-uniform for the output; biases zero.
    let a1 = (6.0 / shape.inputs as f32).sqrt();
    p.extend((0..shape.inputs * shape.hidden).map(|_| a1 * next()));
    p.extend(std::iter::repeat_n(0.0, shape.hidden));
    let a2 = (6.0 / (shape.hidden + shape.classes) as f32).sqrt();
    p.extend((0..shape.hidden * shape.classes).map(|_| a2 * next()));
    p.extend(std::iter::repeat_n(0.0, shape.classes));
    p
}

/// One model replica on the GPU with its activation buffers for batches of `batch` rows.
pub struct Mlp {
    dev: Device,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    shape: MlpShape,
    batch: usize,
    /// The flat parameters.
    pub params: CudaSlice<f32>,
    /// The flat gradient of the last [`Mlp::backward`].
    pub grads: CudaSlice<f32>,
    a1: CudaSlice<f32>,
    z2: CudaSlice<f32>,
    dz2: CudaSlice<f32>,
    da1: CudaSlice<f32>,
    stats: CudaSlice<f32>,
}

/// Row-major `C[m, n] = op(A) op(B)` through column-major cuBLAS (`C^T = op(B)^T op(A)^T`).
/// `a_cols` and `b_cols` are the stored row lengths of A and B.
#[allow(clippy::too_many_arguments)]
fn matmul(
    blas: &CudaBlas,
    a: &CudaView<'_, f32>,
    a_t: bool,
    a_cols: usize,
    b: &CudaView<'_, f32>,
    b_t: bool,
    b_cols: usize,
    c: &mut CudaViewMut<'_, f32>,
    (m, k, n): (usize, usize, usize),
) -> Result<()> {
    let op = |t: bool| {
        if t {
            cublasOperation_t::CUBLAS_OP_T
        } else {
            cublasOperation_t::CUBLAS_OP_N
        }
    };
    let cfg = GemmConfig {
        transa: op(b_t),
        transb: op(a_t),
        m: n as i32,
        n: m as i32,
        k: k as i32,
        alpha: 1.0f32,
        lda: b_cols as i32,
        ldb: a_cols as i32,
        beta: 0.0f32,
        ldc: n as i32,
    };
    // SAFETY: the views hold the stated matrices (checked by the callers' sizes).
    unsafe { blas.gemm(cfg, b, a, c) }.map_err(|e| Error::Compile(format!("cuBLAS: {e:?}")))
}

impl Mlp {
    /// A replica with parameters drawn from `seed` (the same on every rank).
    pub fn new(
        dev: &Device,
        stream: &Arc<CudaStream>,
        shape: MlpShape,
        batch: usize,
        seed: u64,
    ) -> Result<Mlp> {
        let blas =
            CudaBlas::new(stream.clone()).map_err(|e| Error::Compile(format!("cuBLAS: {e:?}")))?;
        let n = shape.params();
        Ok(Mlp {
            dev: dev.clone(),
            stream: stream.clone(),
            blas,
            shape,
            batch,
            params: stream.clone_htod(&init(&shape, seed))?,
            grads: stream.alloc_zeros(n)?,
            a1: stream.alloc_zeros(batch * shape.hidden)?,
            z2: stream.alloc_zeros(batch * shape.classes)?,
            dz2: stream.alloc_zeros(batch * shape.classes)?,
            da1: stream.alloc_zeros(batch * shape.hidden)?,
            stats: stream.alloc_zeros(2)?,
        })
    }

    /// The model's sizes.
    pub fn shape(&self) -> MlpShape {
        self.shape
    }

    /// Forward pass of `rows <= batch` rows of `x`: the logits in `z2`, and (loss sum,
    /// correct count) added to the running statistics; with `backward`, `dz2` too.
    fn forward(
        &mut self,
        x: &CudaView<'_, f32>,
        labels: &CudaView<'_, u32>,
        rows: usize,
    ) -> Result<()> {
        let s = self.shape;
        let o = s.offsets();
        {
            let w1 = self.params.slice(o[0]..o[1]);
            let mut a1 = self.a1.slice_mut(..rows * s.hidden);
            matmul(
                &self.blas,
                x,
                false,
                s.inputs,
                &w1,
                false,
                s.hidden,
                &mut a1,
                (rows, s.inputs, s.hidden),
            )?;
        }
        let (r32, h32, c32) = (rows as u32, s.hidden as u32, s.classes as u32);
        let relu: i32 = 1;
        let b1 = self.params.slice(o[1]..o[2]);
        let mut b = self.stream.launch_builder(self.dev.func("gw_bias_act"));
        b.arg(&mut self.a1).arg(&b1).arg(&r32).arg(&h32).arg(&relu);
        // SAFETY: rows x hidden activations, hidden biases.
        unsafe { b.launch(elementwise((rows * s.hidden) as u64)) }?;
        {
            let a1 = self.a1.slice(..rows * s.hidden);
            let w2 = self.params.slice(o[2]..o[3]);
            let mut z2 = self.z2.slice_mut(..rows * s.classes);
            matmul(
                &self.blas,
                &a1,
                false,
                s.hidden,
                &w2,
                false,
                s.classes,
                &mut z2,
                (rows, s.hidden, s.classes),
            )?;
        }
        let linear: i32 = 0;
        let b2 = self.params.slice(o[3]..o[4]);
        let mut b = self.stream.launch_builder(self.dev.func("gw_bias_act"));
        b.arg(&mut self.z2)
            .arg(&b2)
            .arg(&r32)
            .arg(&c32)
            .arg(&linear);
        // SAFETY: rows x classes logits, classes biases.
        unsafe { b.launch(elementwise((rows * s.classes) as u64)) }?;
        let mut b = self.stream.launch_builder(self.dev.func("gw_softmax_xent"));
        b.arg(&self.z2)
            .arg(labels)
            .arg(&r32)
            .arg(&c32)
            .arg(&mut self.dz2)
            .arg(&mut self.stats);
        // SAFETY: rows rows of logits and labels.
        unsafe { b.launch(elementwise(rows as u64)) }?;
        Ok(())
    }

    /// Forward and backward on a batch of `batch` rows: the flat gradient of the mean loss in
    /// [`Mlp::grads`].
    pub fn backward(&mut self, x: &CudaView<'_, f32>, labels: &CudaView<'_, u32>) -> Result<()> {
        let rows = self.batch;
        self.forward(x, labels, rows)?;
        let s = self.shape;
        let o = s.offsets();
        let (r32, h32, c32) = (rows as u32, s.hidden as u32, s.classes as u32);
        {
            let a1 = self.a1.slice(..rows * s.hidden);
            let dz2 = self.dz2.slice(..rows * s.classes);
            let mut dw2 = self.grads.slice_mut(o[2]..o[3]);
            matmul(
                &self.blas,
                &a1,
                true,
                s.hidden,
                &dz2,
                false,
                s.classes,
                &mut dw2,
                (s.hidden, rows, s.classes),
            )?;
            let w2 = self.params.slice(o[2]..o[3]);
            let mut da1 = self.da1.slice_mut(..rows * s.hidden);
            matmul(
                &self.blas,
                &dz2,
                false,
                s.classes,
                &w2,
                true,
                s.classes,
                &mut da1,
                (rows, s.classes, s.hidden),
            )?;
        }
        let mut db2 = self.grads.slice_mut(o[3]..o[4]);
        let mut b = self.stream.launch_builder(self.dev.func("gw_colsum"));
        b.arg(&self.dz2).arg(&r32).arg(&c32).arg(&mut db2);
        // SAFETY: rows x classes in, classes out.
        unsafe { b.launch(elementwise(s.classes as u64)) }?;
        let nh = (rows * s.hidden) as u64;
        let mut b = self.stream.launch_builder(self.dev.func("gw_relu_back"));
        b.arg(&mut self.da1).arg(&self.a1).arg(&nh);
        // SAFETY: rows x hidden each.
        unsafe { b.launch(elementwise(nh)) }?;
        {
            let da1 = self.da1.slice(..rows * s.hidden);
            let mut dw1 = self.grads.slice_mut(o[0]..o[1]);
            matmul(
                &self.blas,
                x,
                true,
                s.inputs,
                &da1,
                false,
                s.hidden,
                &mut dw1,
                (s.inputs, rows, s.hidden),
            )?;
        }
        let mut db1 = self.grads.slice_mut(o[1]..o[2]);
        let mut b = self.stream.launch_builder(self.dev.func("gw_colsum"));
        b.arg(&self.da1).arg(&r32).arg(&h32).arg(&mut db1);
        // SAFETY: rows x hidden in, hidden out.
        unsafe { b.launch(elementwise(s.hidden as u64)) }?;
        Ok(())
    }

    /// Clears the running (loss sum, correct count).
    pub fn reset_stats(&mut self) -> Result<()> {
        Ok(self.stream.memset_zeros(&mut self.stats)?)
    }

    /// The running (loss sum, correct count) since [`Mlp::reset_stats`].
    pub fn stats(&self) -> Result<(f64, f64)> {
        let s = self.stream.clone_dtoh(&self.stats)?;
        Ok((s[0] as f64, s[1] as f64))
    }

    /// Evaluates every row of `data` in batches: adds to the running statistics.
    pub fn evaluate(&mut self, data: &DeviceData) -> Result<()> {
        let (x, labels, rows) = (&data.x, &data.labels, data.labels.len());
        let f = self.shape.inputs;
        let mut at = 0;
        while at < rows {
            let r = (rows - at).min(self.batch);
            let xv = x.slice(at * f..(at + r) * f);
            let lv = labels.slice(at..at + r);
            self.forward(&xv, &lv, r)?;
            at += r;
        }
        Ok(())
    }

    /// `params[idx] -= scale * val` for a sparse sum already on the device.
    pub fn step_sparse(
        &mut self,
        idx: &CudaView<'_, u32>,
        val: &CudaView<'_, f32>,
        scale: f32,
    ) -> Result<()> {
        let k = idx.len() as u32;
        if k == 0 {
            return Ok(());
        }
        let mut b = self.stream.launch_builder(self.dev.func("gw_scatter_sgd"));
        b.arg(&mut self.params)
            .arg(idx)
            .arg(val)
            .arg(&k)
            .arg(&scale);
        // SAFETY: k indices, each < params (checked by the sparse all-reduce).
        unsafe { b.launch(elementwise(k as u64)) }?;
        Ok(())
    }

    /// `params -= scale * g` for a dense sum on the device.
    pub fn step_dense(&mut self, g: &CudaView<'_, f32>, scale: f32) -> Result<()> {
        let n = self.shape.params() as u64;
        let mut b = self.stream.launch_builder(self.dev.func("gw_dense_sgd"));
        b.arg(&mut self.params).arg(g).arg(&n).arg(&scale);
        // SAFETY: n floats each.
        unsafe { b.launch(elementwise(n)) }?;
        Ok(())
    }
}

/// A labelled data set resident on the device: `rows x cols` features, one label per row.
pub struct DeviceData {
    /// The features, row-major.
    pub x: CudaSlice<f32>,
    /// The labels.
    pub labels: CudaSlice<u32>,
    /// Features per row.
    pub cols: usize,
}

impl DeviceData {
    /// Copies `x` (`labels.len()` rows) and `labels` to the device.
    pub fn upload(stream: &Arc<CudaStream>, x: &[f32], labels: &[u32]) -> Result<DeviceData> {
        let cols = x.len() / labels.len().max(1);
        Ok(DeviceData {
            x: stream.clone_htod(x)?,
            labels: stream.clone_htod(labels)?,
            cols,
        })
    }
}

/// A batch gathered on the device from a [`DeviceData`] by row indices.
pub struct Batch {
    /// The rows' features.
    pub x: CudaSlice<f32>,
    /// The rows' labels.
    pub labels: CudaSlice<u32>,
    idx: CudaSlice<u32>,
    cols: usize,
}

impl Batch {
    /// A batch of `rows` rows of `cols` features.
    pub fn new(stream: &Arc<CudaStream>, rows: usize, cols: usize) -> Result<Batch> {
        Ok(Batch {
            x: stream.alloc_zeros(rows * cols)?,
            labels: stream.alloc_zeros(rows)?,
            idx: stream.alloc_zeros(rows)?,
            cols,
        })
    }

    /// Gathers the rows `idx` (as many as the batch holds) of `data`.
    pub fn gather(
        &mut self,
        dev: &Device,
        stream: &Arc<CudaStream>,
        data: &DeviceData,
        idx: &[u32],
    ) -> Result<()> {
        stream.memcpy_htod(idx, &mut self.idx)?;
        let rows = idx.len() as u32;
        let c32 = self.cols as u32;
        let mut b = stream.launch_builder(dev.func("gw_gather_rows"));
        b.arg(&data.x)
            .arg(&data.labels)
            .arg(&self.idx)
            .arg(&rows)
            .arg(&c32)
            .arg(&mut self.x)
            .arg(&mut self.labels);
        // SAFETY: rows indices into data (the caller's); the batch holds rows x cols.
        unsafe { b.launch(elementwise(rows as u64 * self.cols as u64)) }?;
        Ok(())
    }
}
