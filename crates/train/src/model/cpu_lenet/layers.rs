//! The layers' pieces around the GEMMs: im2col and col2im, fused bias + ReLU + 2x2 max
//! pooling and its backward pass, a Linear layer's backward pass, bias (+ ReLU), column sums
//! and the ReLU mask (shared with the partitioned model).

use super::matmul::{mat, matmul};
use super::K;

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

/// A convolution block's forward pass over `n` samples: im2col of `x` (`c_in` channels of
/// `hw`, `strides` between samples and between channels, zero padding `pad`, output
/// `out_hw`) into `cols`, the 5x5 convolution with `weight` (`[c_out, c_in*K*K]`) into `z`,
/// then `bias` (`c_out` values), ReLU and 2x2 max pooling into `pooled` with the winners'
/// positions in `arg` (see [`bias_relu_pool`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_pool(
    x: &[f32],
    n: usize,
    c_in: usize,
    hw: (usize, usize),
    strides: (usize, usize),
    pad: usize,
    out_hw: (usize, usize),
    (weight, bias): (&[f32], &[f32]),
    cols: &mut [f32],
    z: &mut [f32],
    (pooled, arg): (&mut [f32], &mut [u8]),
) {
    let pl = n * out_hw.0 * out_hw.1;
    im2col(x, n, c_in, hw, strides, pad, out_hw, cols);
    let k = c_in * K * K;
    matmul(
        bias.len(),
        pl,
        k,
        z,
        pl,
        false,
        mat(weight, k, 1),
        mat(cols, pl, 1),
    );
    bias_relu_pool(z, bias, n, out_hw, pooled, arg);
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
/// The backward pass of a 5x5 convolution over `n` samples (input `hw` of `c_in`
/// channels, output `out_hw`) from the gradient `gz` of its output before pooling
/// (`[c_out, n*OH*OW]`) and its im2col `cols`: the weight gradient `gz cols^T` and the bias
/// gradient (the row sums of `gz`), written into `grads` (weight gradient, bias gradient)
/// or added to them when `accumulate`; when `gx` is given (the buffer of `weight^T gz`, then
/// the input gradient), the gradient of an unpadded channel-major input through
/// [`col2im`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn conv_backward(
    n: usize,
    c_in: usize,
    (hw, out_hw): ((usize, usize), (usize, usize)),
    gz: &[f32],
    cols: &[f32],
    weight: &[f32],
    (gw, gb): (&mut [f32], &mut [f32]),
    accumulate: bool,
    gx: Option<(&mut [f32], &mut [f32])>,
) {
    let pl = n * out_hw.0 * out_hw.1;
    let k = c_in * K * K;
    let c_out = gb.len();
    matmul(
        c_out,
        k,
        pl,
        gw,
        k,
        accumulate,
        mat(gz, pl, 1),
        mat(cols, 1, pl),
    );
    for (c, gb) in gb.iter_mut().enumerate() {
        let sum = gz[c * pl..(c + 1) * pl].iter().sum::<f32>();
        if accumulate {
            *gb += sum;
        } else {
            *gb = sum;
        }
    }
    if let Some((gcols, gx)) = gx {
        matmul(
            k,
            pl,
            c_out,
            gcols,
            pl,
            false,
            mat(weight, 1, k),
            mat(gz, pl, 1),
        );
        gx.fill(0.0);
        col2im(gcols, n, c_in, hw, out_hw, gx);
    }
}

/// The forward pass of one Linear layer (weight `[fan_in, fan_out]`, row-major) over a batch
/// of `n`: `y = x weight + bias` (`x` is `n x fan_in`; the bias is added to every row of `y`),
/// then ReLU when `relu`.
pub(crate) fn linear_forward(
    n: usize,
    (fan_in, fan_out): (usize, usize),
    x: &[f32],
    (weight, bias): (&[f32], &[f32]),
    y: &mut [f32],
    relu: bool,
) {
    matmul(
        n,
        fan_out,
        fan_in,
        y,
        fan_out,
        false,
        mat(x, fan_in, 1),
        mat(weight, fan_out, 1),
    );
    if relu {
        bias_relu(y, bias);
    } else {
        add_bias(y, bias);
    }
}

/// The backward pass of one Linear layer (weight `[fan_in, fan_out]`, row-major) over a batch
/// of `n`: from its input `x` (`n x fan_in`) and the output gradient `gy` (`n x fan_out`),
/// the weight gradient `x^T gy`, the bias gradient (column sums of `gy`), written into
/// `grads` (weight gradient, bias gradient) or added to them when `accumulate`, and the
/// input gradient `gy w^T` (`n x fan_in`) written into `gx` when asked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_backward(
    n: usize,
    (fan_in, fan_out): (usize, usize),
    x: &[f32],
    gy: &[f32],
    weight: &[f32],
    (gw, gb): (&mut [f32], &mut [f32]),
    accumulate: bool,
    gx: Option<&mut [f32]>,
) {
    matmul(
        fan_in,
        fan_out,
        n,
        gw,
        fan_out,
        accumulate,
        mat(x, 1, fan_in),
        mat(gy, fan_out, 1),
    );
    if !accumulate {
        gb.fill(0.0);
    }
    add_col_sums(gy, gb);
    if let Some(gx) = gx {
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
}

pub(crate) fn bias_relu(v: &mut [f32], bias: &[f32]) {
    for row in v.chunks_exact_mut(bias.len()) {
        for (x, &b) in row.iter_mut().zip(bias) {
            *x = (*x + b).max(0.0);
        }
    }
}

/// `v[r, :] += bias` for every row.
pub(crate) fn add_bias(v: &mut [f32], bias: &[f32]) {
    for row in v.chunks_exact_mut(bias.len()) {
        for (x, &b) in row.iter_mut().zip(bias) {
            *x += b;
        }
    }
}

/// Adds the column sums of the row-major `m` (`out.len()` columns) into `out`.
pub(crate) fn add_col_sums(m: &[f32], out: &mut [f32]) {
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
