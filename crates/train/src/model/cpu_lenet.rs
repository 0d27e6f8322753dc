//! LeNet-5 written out by hand for the CPU: the same network, parameters, flat layout and
//! initialization as the burn [`LeNet`](super::lenet::LeNet) (its reference, kept for the
//! tests and `ModelKind::build_burn`), with the forward and backward passes as im2col + GEMM
//! (the `gemm` crate burn's flex backend also uses) on buffers reused from step to step.
//!
//! Why: at LeNet's shapes (batch 64, 5x5 kernels, 1-16 channels) burn's autodiff graph, its
//! generic convolution backward and per-op allocations cost several times the arithmetic;
//! measured with `examples/lenet_step.rs` the hand-written step is several times faster at
//! one thread. The mathematics is unchanged: convolutions, ReLU, 2x2 max pooling, linear
//! layers and mean cross-entropy are the same functions, summed in a different order (the
//! tests hold the gradients to burn's within float rounding).
//!
//! Layout: activations are kept channel-major (`[C, N, H, W]`), so each convolution is one
//! GEMM over the whole batch: `z[c_out, n*h*w] = W[c_out, c_in*25] · cols[c_in*25, n*h*w]`.
//! ReLU and max pooling are fused (`max(0, max4(z) + b)`, as ReLU is monotone); the pooled
//! position is kept for the backward pass.

use std::time::Instant;

use gemm::Parallelism;

use super::init::{init_flat, ParamInit};
use super::{Eval, Model, ModelKind, ParamTensor};
use crate::data::{Batch, ImageBatch};
use crate::error::{Error, Result};

/// Kernel side of both convolutions.
pub(crate) const K: usize = 5;
/// `K * K`.
pub(crate) const KK: usize = K * K;
/// Output channels of conv1 and conv2.
const C1: usize = 6;
const C2: usize = 16;
/// Widths of fc1 and fc2.
const F1: usize = 120;
const F2: usize = 84;
/// Samples per internal chunk of an evaluation batch (bounds the im2col buffers).
const EVAL_CHUNK: usize = 128;

/// Sizes derived from the input shape.
#[derive(Debug, Clone, Copy)]
struct Geom {
    c0: usize,
    h0: usize,
    w0: usize,
    /// conv2's output (conv1 keeps `h0 x w0`, the first pool halves it).
    h2: usize,
    w2: usize,
    /// The first pool's output.
    hp1: usize,
    wp1: usize,
    /// The second pool's output.
    hp2: usize,
    wp2: usize,
    classes: usize,
}

impl Geom {
    fn fc_in(&self) -> usize {
        C2 * self.hp2 * self.wp2
    }

    /// Element counts of the ten parameter tensors, in burn's visitor order.
    fn layout(&self) -> [usize; 10] {
        [
            C1 * self.c0 * KK,
            C1,
            C2 * C1 * KK,
            C2,
            self.fc_in() * F1,
            F1,
            F1 * F2,
            F2,
            F2 * self.classes,
            self.classes,
        ]
    }
}

/// Where each parameter tensor starts in the flat buffer.
#[derive(Debug, Clone, Copy)]
struct Offsets {
    w1: usize,
    b1: usize,
    w2: usize,
    b2: usize,
    wf1: usize,
    bf1: usize,
    wf2: usize,
    bf2: usize,
    wf3: usize,
    bf3: usize,
    end: usize,
}

impl Offsets {
    fn new(layout: &[usize; 10]) -> Offsets {
        let mut o = [0usize; 11];
        for (i, &len) in layout.iter().enumerate() {
            o[i + 1] = o[i] + len;
        }
        Offsets {
            w1: o[0],
            b1: o[1],
            w2: o[2],
            b2: o[3],
            wf1: o[4],
            bf1: o[5],
            wf2: o[6],
            bf2: o[7],
            wf3: o[8],
            bf3: o[9],
            end: o[10],
        }
    }
}

/// Activations (and their gradients) of one batch of `n` samples, reused across steps.
#[derive(Debug, Default)]
struct Work {
    n: usize,
    cols1: Vec<f32>,
    z1: Vec<f32>,
    p1: Vec<f32>,
    arg1: Vec<u8>,
    cols2: Vec<f32>,
    z2: Vec<f32>,
    p2: Vec<f32>,
    arg2: Vec<u8>,
    x3: Vec<f32>,
    a3: Vec<f32>,
    a4: Vec<f32>,
    z5: Vec<f32>,
    // Gradients.
    g5: Vec<f32>,
    ga4: Vec<f32>,
    ga3: Vec<f32>,
    gx3: Vec<f32>,
    gp2: Vec<f32>,
    gz2: Vec<f32>,
    gcols2: Vec<f32>,
    gp1: Vec<f32>,
    gz1: Vec<f32>,
}

/// Resizes `v` to `len` (contents unspecified until written).
fn size(v: &mut Vec<f32>, len: usize) {
    v.resize(len, 0.0);
}

impl Work {
    /// Sizes the forward buffers for `n` samples.
    fn forward_sized(&mut self, g: &Geom, n: usize) {
        let p1 = n * g.h0 * g.w0;
        let p2 = n * g.h2 * g.w2;
        size(&mut self.cols1, g.c0 * KK * p1);
        size(&mut self.z1, C1 * p1);
        size(&mut self.p1, C1 * n * g.hp1 * g.wp1);
        self.arg1.resize(C1 * n * g.hp1 * g.wp1, 0);
        size(&mut self.cols2, C1 * KK * p2);
        size(&mut self.z2, C2 * p2);
        size(&mut self.p2, C2 * n * g.hp2 * g.wp2);
        self.arg2.resize(C2 * n * g.hp2 * g.wp2, 0);
        size(&mut self.x3, n * g.fc_in());
        size(&mut self.a3, n * F1);
        size(&mut self.a4, n * F2);
        size(&mut self.z5, n * g.classes);
        self.n = n;
    }

    /// Sizes the backward buffers for `n` samples.
    fn backward_sized(&mut self, g: &Geom, n: usize) {
        size(&mut self.g5, n * g.classes);
        size(&mut self.ga4, n * F2);
        size(&mut self.ga3, n * F1);
        size(&mut self.gx3, n * g.fc_in());
        size(&mut self.gp2, C2 * n * g.hp2 * g.wp2);
        size(&mut self.gz2, C2 * n * g.h2 * g.w2);
        size(&mut self.gcols2, C1 * KK * n * g.h2 * g.w2);
        size(&mut self.gp1, C1 * n * g.hp1 * g.wp1);
        size(&mut self.gz1, C1 * n * g.h0 * g.w0);
    }
}

/// A row-major or strided matrix view: element `(i, j)` at `i * rs + j * cs`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

pub(crate) fn mat(data: &[f32], rs: usize, cs: usize) -> Mat<'_> {
    Mat { data, rs, cs }
}

/// Highest index a `rows x cols` view with strides `rs`, `cs` touches, plus one.
fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// `dst[m x n] (+)= a[m x k] · b[k x n]` (added to `dst` when `accumulate`), with `dst`
/// row-major of row stride `dst_rs`.
///
/// # Panics
/// When a view does not fit its slice (a bug in this module, not a data error).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    accumulate: bool,
    a: Mat<'_>,
    b: Mat<'_>,
) {
    assert!(extent(m, n, dst_rs, 1) <= dst.len(), "matmul dst view");
    assert!(extent(m, k, a.rs, a.cs) <= a.data.len(), "matmul lhs view");
    assert!(extent(k, n, b.rs, b.cs) <= b.data.len(), "matmul rhs view");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                dst[r * dst_rs..r * dst_rs + n].fill(0.0);
            }
        }
        return;
    }
    let threads = rayon::current_num_threads();
    let par = if threads > 1 && m * n * k >= 1 << 18 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    // SAFETY: the three views were checked against their slices' lengths above, `dst` is
    // borrowed mutably and does not alias `a` or `b` (shared borrows), and every stride
    // fits an `isize` because the views fit in allocated slices.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// im2col of a zero-padded input: `x` is `[N, C, H, W]` (`img_stride` between samples,
/// `chan_stride` between channels), `cols` becomes `[C*K*K, N*OH*OW]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn im2col(
    x: &[f32],
    n: usize,
    c: usize,
    (h, w): (usize, usize),
    (img_stride, chan_stride): (usize, usize),
    pad: usize,
    (oh, ow): (usize, usize),
    cols: &mut [f32],
) {
    let plane = oh * ow;
    let row_len = n * plane;
    for ci in 0..c {
        for kh in 0..K {
            for kw in 0..K {
                let row = &mut cols[((ci * K + kh) * K + kw) * row_len..][..row_len];
                // Output columns whose input column is inside the image.
                let lo = pad.saturating_sub(kw).min(ow);
                let hi = (w + pad).saturating_sub(kw).min(ow).max(lo);
                for s in 0..n {
                    let img = &x[s * img_stride + ci * chan_stride..][..h * w];
                    let out = &mut row[s * plane..][..plane];
                    for y in 0..oh {
                        let o = &mut out[y * ow..][..ow];
                        let iy = (y + kh).wrapping_sub(pad);
                        if iy >= h {
                            o.fill(0.0);
                            continue;
                        }
                        o[..lo].fill(0.0);
                        o[hi..].fill(0.0);
                        if hi > lo {
                            // Output column `lo` reads input column `lo + kw - pad` (>= 0).
                            let ix0 = iy * w + lo + kw - pad;
                            o[lo..hi].copy_from_slice(&img[ix0..ix0 + (hi - lo)]);
                        }
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col`] without padding: adds `cols` `[C*K*K, N*OH*OW]` into `x`
/// `[C, N, H, W]` (channel-major), which the caller zeroes first.
pub(crate) fn col2im(
    cols: &[f32],
    n: usize,
    c: usize,
    (h, w): (usize, usize),
    (oh, ow): (usize, usize),
    x: &mut [f32],
) {
    let plane = oh * ow;
    let row_len = n * plane;
    for ci in 0..c {
        for kh in 0..K {
            for kw in 0..K {
                let row = &cols[((ci * K + kh) * K + kw) * row_len..][..row_len];
                for s in 0..n {
                    let img = &mut x[(ci * n + s) * h * w..][..h * w];
                    let src = &row[s * plane..][..plane];
                    for y in 0..oh {
                        let d = &mut img[(y + kh) * w + kw..][..ow];
                        for (d, &v) in d.iter_mut().zip(&src[y * ow..][..ow]) {
                            *d += v;
                        }
                    }
                }
            }
        }
    }
}

/// Fused bias + ReLU + 2x2/2 max pooling of `z` `[C, N, H, W]` (bias not yet added) into
/// `p` `[C, N, H/2, W/2]`, with the winning position (0..4, row-major in the window).
pub(crate) fn bias_relu_pool(
    z: &[f32],
    bias: &[f32],
    n: usize,
    (h, w): (usize, usize),
    p: &mut [f32],
    arg: &mut [u8],
) {
    let (ph, pw) = (h / 2, w / 2);
    for (c, &b) in bias.iter().enumerate() {
        for s in 0..n {
            let zi = &z[(c * n + s) * h * w..][..h * w];
            let base = (c * n + s) * ph * pw;
            let po = &mut p[base..base + ph * pw];
            let ao = &mut arg[base..base + ph * pw];
            for i in 0..ph {
                let r0 = &zi[2 * i * w..][..w];
                let r1 = &zi[(2 * i + 1) * w..][..w];
                for j in 0..pw {
                    let cand = [r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1]];
                    let mut best = 0;
                    for (q, &v) in cand.iter().enumerate().skip(1) {
                        if v > cand[best] {
                            best = q;
                        }
                    }
                    po[i * pw + j] = (cand[best] + b).max(0.0);
                    ao[i * pw + j] = best as u8;
                }
            }
        }
    }
}

/// The backward pass of [`bias_relu_pool`]: `gz` `[C, N, H, W]` gets each pooled gradient
/// at its window's winning position where the pooled output was positive, zero elsewhere.
pub(crate) fn relu_pool_backward(
    gp: &[f32],
    p: &[f32],
    arg: &[u8],
    c: usize,
    n: usize,
    (h, w): (usize, usize),
    gz: &mut [f32],
) {
    let (ph, pw) = (h / 2, w / 2);
    gz.fill(0.0);
    for cs in 0..c * n {
        let base = cs * ph * pw;
        let g = &mut gz[cs * h * w..][..h * w];
        for i in 0..ph {
            for j in 0..pw {
                let q = base + i * pw + j;
                if p[q] > 0.0 {
                    let a = usize::from(arg[q]);
                    g[(2 * i + a / 2) * w + 2 * j + a % 2] = gp[q];
                }
            }
        }
    }
}

/// `v[r, :] += bias` then ReLU, for `rows` rows of `bias.len()`.
/// The backward pass of one Linear layer (weight `[fan_in, fan_out]`, row-major) over a batch
/// of `n`: from its input `x` (`n x fan_in`) and the output gradient `gy` (`n x fan_out`),
/// the weight gradient `x^T gy`, the bias gradient (column sums of `gy`) and the input
/// gradient `gy w^T` (`n x fan_in`). `grads`: (weight gradient, bias gradient).
pub(crate) fn linear_backward(
    n: usize,
    (fan_in, fan_out): (usize, usize),
    x: &[f32],
    gy: &[f32],
    weight: &[f32],
    (gw, gb): (&mut [f32], &mut [f32]),
    gx: &mut [f32],
) {
    matmul(
        fan_in,
        fan_out,
        n,
        gw,
        fan_out,
        false,
        mat(x, 1, fan_in),
        mat(gy, fan_out, 1),
    );
    col_sums(gy, gb);
    matmul(
        n,
        fan_in,
        fan_out,
        gx,
        fan_in,
        false,
        mat(gy, fan_out, 1),
        mat(weight, 1, fan_out),
    );
}

pub(crate) fn bias_relu(v: &mut [f32], bias: &[f32]) {
    for row in v.chunks_exact_mut(bias.len()) {
        for (x, &b) in row.iter_mut().zip(bias) {
            *x = (*x + b).max(0.0);
        }
    }
}

/// Column sums of a row-major matrix with `out.len()` columns, into `out`.
pub(crate) fn col_sums(m: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    for row in m.chunks_exact(out.len()) {
        for (o, &x) in out.iter_mut().zip(row) {
            *o += x;
        }
    }
}

/// Zeroes the gradient `g` where the ReLU output `a` is not positive.
pub(crate) fn relu_mask(g: &mut [f32], a: &[f32]) {
    for (g, &a) in g.iter_mut().zip(a) {
        if a <= 0.0 {
            *g = 0.0;
        }
    }
}

/// The hand-written LeNet-5 behind the [`Model`] trait.
pub(crate) struct CpuLeNet {
    geom: Geom,
    off: Offsets,
    params: Vec<f32>,
    tensors: Vec<ParamTensor>,
    work: Work,
    pass_times: Option<[Instant; 3]>,
}

impl CpuLeNet {
    /// A LeNet for `[channels, h, w]` images and `classes` outputs, initialized from `seed`
    /// exactly as the burn LeNet (`tensors` and `plan` are that model's, in flat order).
    pub(crate) fn new(
        shape: [usize; 3],
        classes: usize,
        tensors: Vec<ParamTensor>,
        plan: &[ParamInit],
        seed: u64,
    ) -> Result<Self> {
        let [c0, h0, w0] = shape;
        let (hp1, wp1) = (h0 / 2, w0 / 2);
        let (h2, w2) = (hp1.saturating_sub(K - 1), wp1.saturating_sub(K - 1));
        let geom = Geom {
            c0,
            h0,
            w0,
            h2,
            w2,
            hp1,
            wp1,
            hp2: h2 / 2,
            wp2: w2 / 2,
            classes,
        };
        if geom.hp2 == 0 || geom.wp2 == 0 || c0 == 0 || classes == 0 {
            return Err(Error::Config(format!(
                "LeNet needs images of at least 12x12 and a class, got {c0}x{h0}x{w0}, {classes} classes"
            )));
        }
        let layout = geom.layout();
        let theirs: Vec<usize> = tensors.iter().map(ParamTensor::len).collect();
        if theirs != layout {
            return Err(Error::Config(format!(
                "hand-written LeNet layout {layout:?} differs from the model's {theirs:?}"
            )));
        }
        let params = init_flat(&layout, plan, seed);
        Ok(CpuLeNet {
            geom,
            off: Offsets::new(&layout),
            params,
            tensors,
            work: Work::default(),
            pass_times: None,
        })
    }

    /// Checks a batch against the model's input shape and classes.
    fn check<'a>(&self, batch: &'a Batch) -> Result<&'a ImageBatch> {
        let Batch::Images(b) = batch else {
            return Err(Error::BatchMismatch {
                model: ModelKind::LeNet.name(),
                batch: batch.kind(),
            });
        };
        let g = &self.geom;
        if b.shape != [g.c0, g.h0, g.w0] {
            return Err(Error::Config(format!(
                "LeNet built for {}x{}x{} images got a batch of {:?}",
                g.c0, g.h0, g.w0, b.shape
            )));
        }
        let want = b.labels.len() * g.c0 * g.h0 * g.w0;
        if b.pixels.len() != want {
            return Err(Error::LengthMismatch {
                what: "LeNet input pixels",
                expected: want,
                got: b.pixels.len(),
            });
        }
        if let Some(&l) = b.labels.iter().find(|&&l| usize::from(l) >= g.classes) {
            return Err(Error::Config(format!(
                "label {l} out of range for {} classes",
                g.classes
            )));
        }
        Ok(b)
    }

    /// Forward pass of `n` samples of `pixels` (`[N, C, H, W]`) into `work` (logits in
    /// `work.z5`).
    fn forward(
        geom: &Geom,
        off: &Offsets,
        params: &[f32],
        pixels: &[f32],
        n: usize,
        work: &mut Work,
    ) {
        let g = *geom;
        work.forward_sized(&g, n);
        let p = params;
        let (pl0, pl1) = (g.h0 * g.w0, n * g.h0 * g.w0);
        // conv1 (pad 2, same size) + bias + ReLU + pool.
        im2col(
            pixels,
            n,
            g.c0,
            (g.h0, g.w0),
            (g.c0 * pl0, pl0),
            2,
            (g.h0, g.w0),
            &mut work.cols1,
        );
        let k1 = g.c0 * KK;
        matmul(
            C1,
            pl1,
            k1,
            &mut work.z1,
            pl1,
            false,
            mat(&p[off.w1..off.b1], k1, 1),
            mat(&work.cols1, pl1, 1),
        );
        bias_relu_pool(
            &work.z1,
            &p[off.b1..off.w2],
            n,
            (g.h0, g.w0),
            &mut work.p1,
            &mut work.arg1,
        );
        // conv2 (no pad) + bias + ReLU + pool; p1 is channel-major [C1, N, hp1, wp1].
        let pp1 = g.hp1 * g.wp1;
        let pl2 = n * g.h2 * g.w2;
        im2col(
            &work.p1,
            n,
            C1,
            (g.hp1, g.wp1),
            (pp1, n * pp1),
            0,
            (g.h2, g.w2),
            &mut work.cols2,
        );
        let k2 = C1 * KK;
        matmul(
            C2,
            pl2,
            k2,
            &mut work.z2,
            pl2,
            false,
            mat(&p[off.w2..off.b2], k2, 1),
            mat(&work.cols2, pl2, 1),
        );
        bias_relu_pool(
            &work.z2,
            &p[off.b2..off.wf1],
            n,
            (g.h2, g.w2),
            &mut work.p2,
            &mut work.arg2,
        );
        // Flatten as burn does ([N, C, H, W] -> [N, C*H*W]) from channel-major p2.
        let (s2, fin) = (g.hp2 * g.wp2, g.fc_in());
        for c in 0..C2 {
            for s in 0..n {
                work.x3[s * fin + c * s2..][..s2]
                    .copy_from_slice(&work.p2[(c * n + s) * s2..][..s2]);
            }
        }
        // fc1, fc2 (+ ReLU), fc3; Linear weights are [in, out].
        matmul(
            n,
            F1,
            fin,
            &mut work.a3,
            F1,
            false,
            mat(&work.x3, fin, 1),
            mat(&p[off.wf1..off.bf1], F1, 1),
        );
        bias_relu(&mut work.a3, &p[off.bf1..off.wf2]);
        matmul(
            n,
            F2,
            F1,
            &mut work.a4,
            F2,
            false,
            mat(&work.a3, F1, 1),
            mat(&p[off.wf2..off.bf2], F2, 1),
        );
        bias_relu(&mut work.a4, &p[off.bf2..off.wf3]);
        let nc = g.classes;
        matmul(
            n,
            nc,
            F2,
            &mut work.z5,
            nc,
            false,
            mat(&work.a4, F2, 1),
            mat(&p[off.wf3..off.bf3], nc, 1),
        );
        let bias = &p[off.bf3..off.end];
        for row in work.z5.chunks_exact_mut(nc) {
            for (x, &b) in row.iter_mut().zip(bias) {
                *x += b;
            }
        }
    }
}

/// Log-softmax of one row of logits into `out`.
pub(crate) fn log_softmax_row(z: &[f32], out: &mut [f32]) {
    let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let s: f32 = z.iter().map(|&x| (x - m).exp()).sum();
    let lse = m + s.ln();
    for (o, &x) in out.iter_mut().zip(z) {
        *o = x - lse;
    }
}

impl Model for CpuLeNet {
    fn kind(&self) -> ModelKind {
        ModelKind::LeNet
    }

    fn num_params(&self) -> usize {
        self.params.len()
    }

    fn layout(&self) -> Vec<usize> {
        self.geom.layout().to_vec()
    }

    fn tensors(&self) -> Vec<ParamTensor> {
        self.tensors.clone()
    }

    fn last_pass_times(&self) -> Option<[Instant; 3]> {
        self.pass_times
    }

    fn params(&self, out: &mut Vec<f32>) {
        out.clear();
        out.extend_from_slice(&self.params);
    }

    fn set_params(&mut self, flat: &[f32]) {
        assert_eq!(
            flat.len(),
            self.params.len(),
            "flat parameter buffer length"
        );
        self.params.copy_from_slice(flat);
    }

    fn forward_backward(&mut self, batch: &Batch, grads: &mut Vec<f32>) -> Result<f32> {
        let t0 = Instant::now();
        let b = self.check(batch)?;
        let n = b.labels.len();
        if n == 0 {
            return Err(Error::Config("empty training batch".into()));
        }
        let (g, off) = (self.geom, self.off);
        let p = &self.params;
        let w = &mut self.work;
        Self::forward(&g, &off, p, &b.pixels, n, w);
        w.backward_sized(&g, n);
        // Mean cross-entropy and its gradient (softmax - one-hot) / n.
        let nc = g.classes;
        let mut loss = 0.0f64;
        for (s, &label) in b.labels.iter().enumerate() {
            let z = &w.z5[s * nc..][..nc];
            let gr = &mut w.g5[s * nc..][..nc];
            log_softmax_row(z, gr);
            loss -= f64::from(gr[usize::from(label)]);
            for x in gr.iter_mut() {
                *x = x.exp() / n as f32;
            }
            gr[usize::from(label)] -= 1.0 / n as f32;
        }
        let loss = (loss / n as f64) as f32;
        let t1 = Instant::now();

        grads.clear();
        grads.resize(off.end, 0.0);
        let (fin, s2) = (g.fc_in(), g.hp2 * g.wp2);
        // fc3, fc2 (+ ReLU), fc1 (+ ReLU), each through `linear_backward`.
        let (gw, rest) = grads[off.wf3..].split_at_mut(off.bf3 - off.wf3);
        let lin = &p[off.wf3..off.bf3];
        linear_backward(n, (F2, nc), &w.a4, &w.g5, lin, (gw, rest), &mut w.ga4);
        relu_mask(&mut w.ga4, &w.a4);
        let (gw, rest) = grads[off.wf2..off.wf3].split_at_mut(off.bf2 - off.wf2);
        let lin = &p[off.wf2..off.bf2];
        linear_backward(n, (F1, F2), &w.a3, &w.ga4, lin, (gw, rest), &mut w.ga3);
        relu_mask(&mut w.ga3, &w.a3);
        let (gw, rest) = grads[off.wf1..off.wf2].split_at_mut(off.bf1 - off.wf1);
        let lin = &p[off.wf1..off.bf1];
        linear_backward(n, (fin, F1), &w.x3, &w.ga3, lin, (gw, rest), &mut w.gx3);
        // Unflatten into the channel-major pooled gradient.
        for c in 0..C2 {
            for s in 0..n {
                w.gp2[(c * n + s) * s2..][..s2].copy_from_slice(&w.gx3[s * fin + c * s2..][..s2]);
            }
        }
        relu_pool_backward(&w.gp2, &w.p2, &w.arg2, C2, n, (g.h2, g.w2), &mut w.gz2);
        // conv2: weight gradient gz2 · cols2^T, bias = row sums, input gradient via col2im.
        let pl2 = n * g.h2 * g.w2;
        let k2 = C1 * KK;
        matmul(
            C2,
            k2,
            pl2,
            &mut grads[off.w2..off.b2],
            k2,
            false,
            mat(&w.gz2, pl2, 1),
            mat(&w.cols2, 1, pl2),
        );
        for (c, gb) in grads[off.b2..off.wf1].iter_mut().enumerate() {
            *gb = w.gz2[c * pl2..(c + 1) * pl2].iter().sum();
        }
        matmul(
            k2,
            pl2,
            C2,
            &mut w.gcols2,
            pl2,
            false,
            mat(&p[off.w2..off.b2], 1, k2),
            mat(&w.gz2, pl2, 1),
        );
        w.gp1.fill(0.0);
        col2im(&w.gcols2, n, C1, (g.hp1, g.wp1), (g.h2, g.w2), &mut w.gp1);
        relu_pool_backward(&w.gp1, &w.p1, &w.arg1, C1, n, (g.h0, g.w0), &mut w.gz1);
        // conv1: weight and bias gradients (the input needs none).
        let pl1 = n * g.h0 * g.w0;
        let k1 = g.c0 * KK;
        matmul(
            C1,
            k1,
            pl1,
            &mut grads[off.w1..off.b1],
            k1,
            false,
            mat(&w.gz1, pl1, 1),
            mat(&w.cols1, 1, pl1),
        );
        for (c, gb) in grads[off.b1..off.w2].iter_mut().enumerate() {
            *gb = w.gz1[c * pl1..(c + 1) * pl1].iter().sum();
        }
        self.pass_times = Some([t0, t1, Instant::now()]);
        Ok(loss)
    }

    fn evaluate(&self, batch: &Batch) -> Result<Eval> {
        let b = self.check(batch)?;
        let g = self.geom;
        let per = g.c0 * g.h0 * g.w0;
        let mut work = Work::default();
        let mut eval = Eval::default();
        let mut logp = vec![0.0f32; g.classes];
        for (px, labels) in b
            .pixels
            .chunks(EVAL_CHUNK * per)
            .zip(b.labels.chunks(EVAL_CHUNK))
        {
            let n = labels.len();
            Self::forward(&g, &self.off, &self.params, px, n, &mut work);
            for (s, &label) in labels.iter().enumerate() {
                log_softmax_row(&work.z5[s * g.classes..][..g.classes], &mut logp);
                // First maximum wins, as burn's argmax.
                let mut best = 0;
                for (j, &v) in logp.iter().enumerate() {
                    if v > logp[best] {
                        best = j;
                    }
                }
                eval.correct += u64::from(best == usize::from(label));
                eval.loss_sum -= f64::from(logp[usize::from(label)]);
                eval.n += 1;
            }
        }
        Ok(eval)
    }
}
