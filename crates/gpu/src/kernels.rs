//! The device kernels' CUDA C source and the NVRTC options they are compiled with.
//!
//! One module holds every kernel; [`crate::device::Device`] compiles it once per context at
//! run time (NVRTC: no `nvcc` at build time). The kernels reproduce the CPU codecs of
//! `gradwire-codec` operation for operation, so a GPU rank and a CPU rank write the same
//! bytes:
//! - floating-point sums run in the CPU's order (1-bit SGD's and QSGD's 16 lane sums then
//!   the remainder; TernGrad's 4096-element blocks of 16 f32 lanes summed into f64), one
//!   thread per CPU lane;
//! - no fused multiply-add (`--fmad=false`): Rust never contracts `a * b + c`, and a
//!   contraction changes the last bit; IEEE division and square root (`--prec-div=true`,
//!   `--prec-sqrt=true`), no flush of subnormals;
//! - the uniforms of the stochastic quantizers are the CPU's counter hash (`gw_hash32`) of
//!   the element's global index under the step's key, which the host draws from the same
//!   `StepRng`;
//! - order-free steps (maxima, selection by threshold) run in parallel.
//!
//! Packed codes use the lane-parallel word layout documented in [`crate::plan`]
//! (`gw_word` is `plan::word_elems`).

/// Every kernel entry point of [`SOURCE`], loaded by name.
pub const KERNELS: &[&str] = &[
    "gw_fp16",
    "gw_add",
    "gw_onebit_scales",
    "gw_onebit_pack",
    "gw_qsgd_scales",
    "gw_qsgd_pack",
    "gw_tern_partials",
    "gw_tern_blocks",
    "gw_tern_stats",
    "gw_tern_scale",
    "gw_tern_pack",
    "gw_f32_words",
    "gw_dgc_momentum",
    "gw_dgc_dense",
    "gw_gather_keys",
    "gw_tile_counts",
    "gw_scan_counts",
    "gw_compact_ordered",
    "gw_zero_at",
    "gw_scatter_set",
    "gw_fill_pattern",
    // The MLP's (mlp.rs), which use expf/logf and need no bit-exactness:
    "gw_bias_act",
    "gw_softmax_xent",
    "gw_colsum",
    "gw_relu_back",
    "gw_scatter_sgd",
    "gw_dense_sgd",
    "gw_gather_rows",
];

/// The kernels that must reproduce the CPU codecs bit for bit: every kernel before the MLP's.
pub fn exact_kernels() -> &'static [&'static str] {
    let end = KERNELS
        .iter()
        .position(|k| *k == "gw_bias_act")
        .unwrap_or(KERNELS.len());
    &KERNELS[..end]
}

/// NVRTC options: exact IEEE arithmetic as the CPU codecs do it (see the module doc), plus
/// the device's architecture when known (`compute_90` on Hopper).
pub fn options(arch: Option<&str>) -> Vec<String> {
    let mut o = vec![
        "--fmad=false".to_string(),
        "--prec-div=true".to_string(),
        "--prec-sqrt=true".to_string(),
        "--ftz=false".to_string(),
        "--std=c++17".to_string(),
    ];
    if let Some(a) = arch {
        o.push(format!("--gpu-architecture={a}"));
    }
    o
}

/// The virtual architecture NVRTC targets for compute capability `major.minor`.
pub fn arch_for(major: i32, minor: i32) -> String {
    format!("compute_{major}{minor}")
}

/// The CUDA C source of every kernel.
pub const SOURCE: &str = r#"
typedef unsigned int u32;
typedef unsigned long long u64;

#define GW_LANES 16u
#define GW_FOR(i, n) for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

/* The CPU codecs' counter hash (lowbias32 finalizer) and its uniform on a 2^-24 grid. */
__device__ __forceinline__ u32 gw_hash32(u32 key, u32 i) {
    u32 x = (i * 0x9E3779B9u) ^ key;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}
__device__ __forceinline__ float gw_uniform(u32 key, u32 i) {
    return (float)(gw_hash32(key, i) >> 8) * (1.0f / 16777216.0f);
}
/* Magnitude key: the bits with the sign cleared (monotone in |x|, NaN on top). */
__device__ __forceinline__ u32 gw_key(float x) { return __float_as_uint(x) & 0x7fffffffu; }

/* Word w of a run of len lane-packed codes of width bits: its elements are
   first + j * stride for j < count (plan::word_elems). */
__device__ __forceinline__ void gw_word(u32 len, u32 width, u32 w, u32* first, u32* stride, u32* count) {
    u32 k = 32u / width;
    u32 block = GW_LANES * k;
    u32 full = len / block;
    if (w < full * GW_LANES) {
        *first = (w / GW_LANES) * block + (w % GW_LANES);
        *stride = GW_LANES;
        *count = k;
    } else {
        u32 r = len - full * block;
        u32 lanes = (r + k - 1u) / k;
        u32 l = w - full * GW_LANES;
        *first = full * block + l;
        *stride = lanes;
        u32 c = (l < r) ? (r - l + lanes - 1u) / lanes : 0u;
        *count = c < k ? c : k;
    }
}

/* fp16: round to nearest even, as the half crate's conversion. */
extern "C" __global__ void gw_fp16(const float* __restrict__ g, unsigned short* __restrict__ out, u64 n) {
    GW_FOR(i, n) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(g[i]));
        out[i] = h;
    }
}

/* r = r + g (error feedback's x = g + r, in place in the residual). */
extern "C" __global__ void gw_add(float* __restrict__ r, const float* __restrict__ g, u64 n) {
    GW_FOR(i, n) { r[i] = r[i] + g[i]; }
}

/* 1-bit SGD: the two means of each column (run), summed in the CPU's 16 lanes then the
   remainder. 128 threads = 8 columns x 16 lanes. runs: 4 u32 each (start, len, scale_word,
   code_word). Writes pos, neg to the body and to scales. */
extern "C" __global__ void gw_onebit_scales(const float* __restrict__ x, const u32* __restrict__ runs, u32 nruns,
                                            u32* __restrict__ body, float* __restrict__ scales) {
    __shared__ float sp[128];
    __shared__ float sn[128];
    __shared__ u32 sc[128];
    u32 t = threadIdx.x;
    u32 run = blockIdx.x * 8u + t / 16u;
    u32 l = t % 16u;
    float p = 0.0f, q = 0.0f;
    u32 c = 0u, start = 0u, len = 0u;
    if (run < nruns) {
        start = runs[4u * run];
        len = runs[4u * run + 1u];
        u32 nch = len / 16u;
        for (u32 j = 0; j < nch; ++j) {
            float v = x[start + j * 16u + l];
            bool pos = v >= 0.0f;
            p = p + (pos ? v : 0.0f);
            q = q + (pos ? 0.0f : v);
            c += pos ? 1u : 0u;
        }
    }
    sp[t] = p;
    sn[t] = q;
    sc[t] = c;
    __syncthreads();
    if (run < nruns && l == 0u) {
        float P = 0.0f, N = 0.0f;
        u32 C = 0u;
        for (u32 i = 0; i < 16u; ++i) {
            P = P + sp[t + i];
            N = N + sn[t + i];
            C += sc[t + i];
        }
        for (u32 i = (len / 16u) * 16u; i < len; ++i) {
            float v = x[start + i];
            if (v >= 0.0f) { P = P + v; C += 1u; } else { N = N + v; }
        }
        u32 nc = len - C;
        float pos = C > 0u ? P / (float)C : 0.0f;
        float neg = nc > 0u ? N / (float)nc : 0.0f;
        u32 sw = runs[4u * run + 2u];
        body[sw] = __float_as_uint(pos);
        body[sw + 1u] = __float_as_uint(neg);
        scales[2u * run] = pos;
        scales[2u * run + 1u] = neg;
    }
}

/* 1-bit SGD's sign bits, one word per thread, and the residual x - decode(x) in place.
   pieces: 6 u32 each (start, len, word_begin, word_end, code_word, run); one block each. */
extern "C" __global__ void gw_onebit_pack(float* __restrict__ x, const u32* __restrict__ pieces,
                                          const float* __restrict__ scales, u32* __restrict__ body, int feedback) {
    const u32* pc = pieces + 6u * blockIdx.x;
    u32 start = pc[0], len = pc[1], wb = pc[2], we = pc[3], cw = pc[4], run = pc[5];
    float pos = scales[2u * run], neg = scales[2u * run + 1u];
    for (u32 w = wb + threadIdx.x; w < we; w += blockDim.x) {
        u32 first, stride, count;
        gw_word(len, 1u, w, &first, &stride, &count);
        u32 word = 0u;
        for (u32 j = 0; j < count; ++j) {
            u32 i = start + first + j * stride;
            float v = x[i];
            u32 b = v >= 0.0f ? 1u : 0u;
            word |= b << j;
            if (feedback) x[i] = v - (b ? pos : neg);
        }
        body[cw + w] = word;
    }
}

/* QSGD: each bucket's scale, max |x| (order-free) or the l2 norm in the CPU's order (16
   lanes, their sum, plus the remainder's sum). One block of 128 threads per bucket.
   Writes m to the body and s/m (0 for m = 0) to inv. */
extern "C" __global__ void gw_qsgd_scales(const float* __restrict__ x, const u32* __restrict__ runs, u32 nruns, int l2,
                                          float sf, u32* __restrict__ body, float* __restrict__ inv) {
    __shared__ float sh[128];
    u32 run = blockIdx.x;
    if (run >= nruns) return;
    u32 t = threadIdx.x;
    u32 start = runs[4u * run], len = runs[4u * run + 1u];
    float m;
    if (!l2) {
        float a = 0.0f;
        for (u32 i = t; i < len; i += blockDim.x) a = fmaxf(a, fabsf(x[start + i]));
        sh[t] = a;
        __syncthreads();
        for (u32 s = blockDim.x / 2u; s > 0u; s >>= 1) {
            if (t < s) sh[t] = fmaxf(sh[t], sh[t + s]);
            __syncthreads();
        }
        m = sh[0];
    } else {
        float a = 0.0f;
        if (t < 16u) {
            u32 nch = len / 16u;
            for (u32 j = 0; j < nch; ++j) {
                float v = x[start + j * 16u + t];
                a = a + v * v;
            }
        }
        sh[t] = a;
        __syncthreads();
        float s = -0.0f, rem = -0.0f;
        for (u32 i = 0; i < 16u; ++i) s = s + sh[i];
        for (u32 i = (len / 16u) * 16u; i < len; ++i) {
            float v = x[start + i];
            rem = rem + v * v;
        }
        m = sqrtf(s + rem);
    }
    if (t == 0u) {
        body[runs[4u * run + 2u]] = __float_as_uint(m);
        inv[run] = m > 0.0f ? sf / m : 0.0f;
    }
}

/* QSGD's codes s + sign(v) * level, level stochastically rounded with the CPU's uniforms. */
extern "C" __global__ void gw_qsgd_pack(const float* __restrict__ x, const u32* __restrict__ pieces,
                                        const float* __restrict__ inv, u32* __restrict__ body,
                                        u32 width, int s, float sf, u32 key) {
    const u32* pc = pieces + 6u * blockIdx.x;
    u32 start = pc[0], len = pc[1], wb = pc[2], we = pc[3], cw = pc[4], run = pc[5];
    float iv = inv[run];
    u32 mask = width >= 32u ? 0xffffffffu : ((1u << width) - 1u);
    for (u32 w = wb + threadIdx.x; w < we; w += blockDim.x) {
        u32 first, stride, count;
        gw_word(len, width, w, &first, &stride, &count);
        u32 word = 0u;
        for (u32 j = 0; j < count; ++j) {
            u32 i = start + first + j * stride;
            float v = x[i];
            float r = fminf(fabsf(v) * iv, sf);
            float fl = floorf(r);
            float p = r - fl;
            int lv = (int)fl + (gw_uniform(key, i) < p ? 1 : 0);
            lv = lv < s ? lv : s;
            u32 code = v < 0.0f ? (u32)(s - lv) : (u32)(s + lv);
            word |= (code & mask) << (j * width);
        }
        body[cw + w] = word;
    }
}

/* TernGrad statistics, stage 1: per 4096-element block and CPU lane, the f32 sum, sum of
   squares and max |x|; the block's remainder goes to lane 0 after its chunks, as on the CPU.
   blocks: 2 u32 each (start, len). One thread per (block, lane). */
extern "C" __global__ void gw_tern_partials(const float* __restrict__ x, const u32* __restrict__ blocks, u32 nblocks,
                                            float* __restrict__ ps, float* __restrict__ pq, float* __restrict__ pm) {
    u64 gid = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    u32 b = (u32)(gid / 16u), l = (u32)(gid % 16u);
    if (b >= nblocks) return;
    u32 start = blocks[2u * b], len = blocks[2u * b + 1u];
    u32 nch = len / 16u;
    float s = 0.0f, q = 0.0f, m = 0.0f;
    for (u32 j = 0; j < nch; ++j) {
        float v = x[start + j * 16u + l];
        s = s + v;
        q = q + v * v;
        m = fmaxf(m, fabsf(v));
    }
    if (l == 0u) {
        for (u32 i = nch * 16u; i < len; ++i) {
            float v = x[start + i];
            s = s + v;
            q = q + v * v;
            m = fmaxf(m, fabsf(v));
        }
    }
    ps[gid] = s;
    pq[gid] = q;
    pm[gid] = m;
}

/* Stage 2: each block's 16 lanes summed in f64 in lane order (from -0.0, as Rust's Sum). */
extern "C" __global__ void gw_tern_blocks(const float* __restrict__ ps, const float* __restrict__ pq,
                                          const float* __restrict__ pm, u32 nblocks, double* __restrict__ bs,
                                          double* __restrict__ bq, float* __restrict__ bm) {
    GW_FOR(b, (u64)nblocks) {
        double s = -0.0, q = -0.0;
        float m = 0.0f;
        for (u32 l = 0; l < 16u; ++l) {
            s = s + (double)ps[b * 16u + l];
            q = q + (double)pq[b * 16u + l];
            m = fmaxf(m, pm[b * 16u + l]);
        }
        bs[b] = s;
        bq[b] = q;
        bm[b] = m;
    }
}

/* Stage 3: per tensor, the blocks summed in order; the clip bound c * sigma and the local
   scale max |clipped|. tens: 3 u32 each (first_block, nblocks, len). */
extern "C" __global__ void gw_tern_stats(const double* __restrict__ bs, const double* __restrict__ bq,
                                         const float* __restrict__ bm, const u32* __restrict__ tens, u32 ntens,
                                         float clip, float* __restrict__ bound, float* __restrict__ local) {
    GW_FOR(t, (u64)ntens) {
        u32 first = tens[3u * t], nb = tens[3u * t + 1u], len = tens[3u * t + 2u];
        double sum = 0.0, sq = 0.0;
        float mx = 0.0f;
        for (u32 b = first; b < first + nb; ++b) {
            sum = sum + bs[b];
            sq = sq + bq[b];
            mx = fmaxf(mx, bm[b]);
        }
        if (clip <= 0.0f || len == 0u) {
            bound[t] = __int_as_float(0x7f800000);
            local[t] = mx;
        } else {
            double n = (double)len;
            double mean = sum / n;
            double var = fmax(sq / n - mean * mean, 0.0);
            float bd = (float)((double)clip * sqrt(var));
            bound[t] = bd;
            local[t] = fminf(mx, bd);
        }
    }
}

/* The scale each tensor sends: max(shared, local) (shared = 0 when none was agreed); written
   to the body. tscale: 1 u32 per tensor, its body scale word. */
extern "C" __global__ void gw_tern_scale(const float* __restrict__ local, const float* __restrict__ shared,
                                         const u32* __restrict__ sword, u32 ntens, float* __restrict__ scale,
                                         u32* __restrict__ body, int has_shared) {
    GW_FOR(t, (u64)ntens) {
        float s = has_shared ? fmaxf(shared[t], local[t]) : local[t];
        scale[t] = s;
        body[sword[t]] = __float_as_uint(s);
    }
}

/* TernGrad's 2-bit codes: 1 = +s, 2 = -s with probability min(|v|, bound) / s. */
extern "C" __global__ void gw_tern_pack(const float* __restrict__ x, const u32* __restrict__ pieces,
                                        const float* __restrict__ bound, const float* __restrict__ scale,
                                        u32* __restrict__ body, u32 key) {
    const u32* pc = pieces + 6u * blockIdx.x;
    u32 start = pc[0], len = pc[1], wb = pc[2], we = pc[3], cw = pc[4], run = pc[5];
    float bd = bound[run];
    float s = scale[run];
    float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (u32 w = wb + threadIdx.x; w < we; w += blockDim.x) {
        u32 first, stride, count;
        gw_word(len, 2u, w, &first, &stride, &count);
        u32 word = 0u;
        for (u32 j = 0; j < count; ++j) {
            u32 i = start + first + j * stride;
            float v = x[i];
            float p = fminf(fabsf(v), bd) * inv;
            u32 b = gw_uniform(key, i) < p ? 1u : 0u;
            u32 code = b << (v < 0.0f ? 1u : 0u);
            word |= code << (2u * j);
        }
        body[cw + w] = word;
    }
}

/* Raw f32 words of x[start..start+len) at body word at (a tensor sent in float). */
extern "C" __global__ void gw_f32_words(const float* __restrict__ x, u32 start, u32 len, u32* __restrict__ body, u32 at) {
    GW_FOR(i, (u64)len) { body[at + i] = __float_as_uint(x[start + i]); }
}

/* DGC momentum correction over a compressed tensor: u = m u + g, v = v + u
   (Nesterov: u = m (u + g), v = v + (u + g)). */
extern "C" __global__ void gw_dgc_momentum(const float* __restrict__ g, float* __restrict__ u, float* __restrict__ v,
                                           u64 n, float m, int nesterov) {
    GW_FOR(i, n) {
        float gi = g[i];
        if (nesterov) {
            float un = m * (u[i] + gi);
            u[i] = un;
            v[i] = v[i] + (un + gi);
        } else {
            float un = m * u[i] + gi;
            u[i] = un;
            v[i] = v[i] + un;
        }
    }
}

/* DGC over a tensor sent dense: plain momentum, the value sent is u (Nesterov: u + g). */
extern "C" __global__ void gw_dgc_dense(const float* __restrict__ g, float* __restrict__ u, float* __restrict__ val,
                                        u64 n, float m, int nesterov) {
    GW_FOR(i, n) {
        float gi = g[i];
        if (nesterov) {
            float un = m * (u[i] + gi);
            u[i] = un;
            val[i] = un + gi;
        } else {
            float un = m * u[i] + gi;
            u[i] = un;
            val[i] = un;
        }
    }
}

/* The keys of the sampled positions (the threshold's sample). */
extern "C" __global__ void gw_gather_keys(const float* __restrict__ v, const u32* __restrict__ pos, u32 npos,
                                          u32* __restrict__ keys) {
    GW_FOR(j, (u64)npos) { keys[j] = gw_key(v[pos[j]]); }
}

/* Ordered compaction, pass 1: hits above thr per tile of GW_TILE elements (one block of 256
   threads per tile). */
#define GW_TILE 4096u
extern "C" __global__ void gw_tile_counts(const float* __restrict__ v, u64 n, u32 thr, u32* __restrict__ counts) {
    __shared__ u32 sh[8];
    u64 base = (u64)blockIdx.x * GW_TILE;
    u32 c = 0u;
    for (u32 k = threadIdx.x; k < GW_TILE; k += blockDim.x) {
        u64 i = base + k;
        if (i < n && gw_key(v[i]) > thr) c += 1u;
    }
    for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xffffffffu, c, o);
    if ((threadIdx.x & 31u) == 0u) sh[threadIdx.x / 32u] = c;
    __syncthreads();
    if (threadIdx.x == 0u) {
        u32 t = 0u;
        for (u32 w = 0; w < blockDim.x / 32u; ++w) t += sh[w];
        counts[blockIdx.x] = t;
    }
}

/* Pass 2: exclusive prefix sums of the tile counts (one block of 1024 threads), the total in
   total[0]. */
extern "C" __global__ void gw_scan_counts(const u32* __restrict__ counts, u32 ntiles, u32* __restrict__ offsets,
                                          u32* __restrict__ total) {
    __shared__ u32 sh[1024];
    u32 t = threadIdx.x;
    u32 per = (ntiles + blockDim.x - 1u) / blockDim.x;
    u32 a = t * per, e = a + per < ntiles ? a + per : ntiles;
    u32 local = 0u;
    for (u32 i = a; i < e; ++i) local += counts[i];
    sh[t] = local;
    __syncthreads();
    for (u32 o = 1; o < blockDim.x; o <<= 1) {
        u32 x = t >= o ? sh[t - o] : 0u;
        __syncthreads();
        sh[t] += x;
        __syncthreads();
    }
    u32 run = sh[t] - local;
    for (u32 i = a; i < e; ++i) { offsets[i] = run; run += counts[i]; }
    if (t == blockDim.x - 1u) total[0] = sh[t];
}

/* Pass 3: each tile writes its hits, in index order, from its offset (the first cap overall). */
extern "C" __global__ void gw_compact_ordered(const float* __restrict__ v, u64 n, u32 thr,
                                              const u32* __restrict__ offsets, u32 cap,
                                              u32* __restrict__ idx, float* __restrict__ val) {
    __shared__ u32 warp_tot[8];
    u64 base = (u64)blockIdx.x * GW_TILE;
    u32 run = offsets[blockIdx.x];
    u32 lane = threadIdx.x & 31u, warp = threadIdx.x / 32u;
    for (u32 k = 0; k < GW_TILE; k += blockDim.x) {
        u64 i = base + k + threadIdx.x;
        float x = i < n ? v[i] : 0.0f;
        bool hit = i < n && gw_key(x) > thr;
        unsigned ballot = __ballot_sync(0xffffffffu, hit);
        if (lane == 0u) warp_tot[warp] = __popc(ballot);
        __syncthreads();
        u32 before = 0u, all = 0u;
        for (u32 w = 0; w < blockDim.x / 32u; ++w) {
            if (w < warp) before += warp_tot[w];
            all += warp_tot[w];
        }
        if (hit) {
            u32 slot = run + before + __popc(ballot & ((1u << lane) - 1u));
            if (slot < cap) {
                idx[slot] = (u32)i;
                val[slot] = x;
            }
        }
        run += all;
        __syncthreads();
    }
}

/* Momentum factor masking: u = v = 0 at the sent indices. */
extern "C" __global__ void gw_zero_at(float* __restrict__ u, float* __restrict__ v, const u32* __restrict__ idx, u32 k) {
    GW_FOR(j, (u64)k) {
        u32 i = idx[j];
        u[i] = 0.0f;
        v[i] = 0.0f;
    }
}

/* Top-k's residual at the sent indices: r[idx] = vals (what the rounding of the sent value
   left; 0 for fp32 values). */
extern "C" __global__ void gw_scatter_set(float* __restrict__ r, const u32* __restrict__ idx, const float* __restrict__ vals, u32 k) {
    GW_FOR(j, (u64)k) { r[idx[j]] = vals[j]; }
}

/* Test data: x[i] = ((i * 7 + rank * 13) mod 101) - 50, small integers whose sums are exact. */
extern "C" __global__ void gw_fill_pattern(float* __restrict__ x, u64 n, u32 rank) {
    GW_FOR(i, n) { x[i] = (float)((u32)((i * 7u + (u64)rank * 13u) % 101u)) - 50.0f; }
}

/* ---- the GPU MLP of mlp.rs (row-major [rows, cols] activations) ---- */

/* z = z + b per column, then ReLU when relu != 0. */
extern "C" __global__ void gw_bias_act(float* __restrict__ z, const float* __restrict__ b, u32 rows, u32 cols, int relu) {
    GW_FOR(i, (u64)rows * cols) {
        float v = z[i] + b[i % cols];
        z[i] = (relu && v < 0.0f) ? 0.0f : v;
    }
}

/* Softmax cross-entropy per row: dz = (softmax(z) - onehot(label)) / rows; the summed loss and
   the count of correct argmaxes are added to stats[0] and stats[1]. */
extern "C" __global__ void gw_softmax_xent(const float* __restrict__ z, const u32* __restrict__ labels, u32 rows, u32 cols,
                                           float* __restrict__ dz, float* __restrict__ stats) {
    GW_FOR(r, (u64)rows) {
        const float* zr = z + r * cols;
        float m = zr[0];
        u32 arg = 0u;
        for (u32 c = 1; c < cols; ++c) if (zr[c] > m) { m = zr[c]; arg = c; }
        float s = 0.0f;
        for (u32 c = 0; c < cols; ++c) s += expf(zr[c] - m);
        u32 y = labels[r];
        atomicAdd(&stats[0], logf(s) - (zr[y] - m));
        if (arg == y) atomicAdd(&stats[1], 1.0f);
        if (dz) {
            for (u32 c = 0; c < cols; ++c) {
                float p = expf(zr[c] - m) / s;
                dz[r * cols + c] = (p - (c == y ? 1.0f : 0.0f)) / (float)rows;
            }
        }
    }
}

/* out[c] = sum over rows of d[r, c] (bias gradients). */
extern "C" __global__ void gw_colsum(const float* __restrict__ d, u32 rows, u32 cols, float* __restrict__ out) {
    GW_FOR(c, (u64)cols) {
        float s = 0.0f;
        for (u32 r = 0; r < rows; ++r) s += d[(u64)r * cols + c];
        out[c] = s;
    }
}

/* da = 0 where the ReLU output a was 0. */
extern "C" __global__ void gw_relu_back(float* __restrict__ da, const float* __restrict__ a, u64 n) {
    GW_FOR(i, n) { if (a[i] <= 0.0f) da[i] = 0.0f; }
}

/* The SGD step from a sparse sum: p[idx] -= scale * val. */
extern "C" __global__ void gw_scatter_sgd(float* __restrict__ p, const u32* __restrict__ idx, const float* __restrict__ val,
                                          u32 k, float scale) {
    GW_FOR(j, (u64)k) { p[idx[j]] -= scale * val[j]; }
}

/* The SGD step from a dense sum: p -= scale * g. */
extern "C" __global__ void gw_dense_sgd(float* __restrict__ p, const float* __restrict__ g, u64 n, float scale) {
    GW_FOR(i, n) { p[i] -= scale * g[i]; }
}

/* dst[r, :] = src[idx[r], :] (a batch of images), labels likewise. */
extern "C" __global__ void gw_gather_rows(const float* __restrict__ src, const u32* __restrict__ src_labels,
                                          const u32* __restrict__ idx, u32 rows, u32 cols,
                                          float* __restrict__ dst, u32* __restrict__ labels) {
    GW_FOR(i, (u64)rows * cols) {
        u32 r = (u32)(i / cols), c = (u32)(i % cols);
        dst[i] = src[(u64)idx[r] * cols + c];
        if (c == 0u) labels[r] = src_labels[idx[r]];
    }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_kernel_is_defined_once_with_c_linkage() {
        for k in KERNELS {
            let decl = format!("extern \"C\" __global__ void {k}(");
            assert_eq!(SOURCE.matches(&decl).count(), 1, "{k}");
        }
        assert_eq!(
            SOURCE.matches("extern \"C\" __global__").count(),
            KERNELS.len()
        );
    }

    #[test]
    fn options_forbid_contraction_and_inexact_division() {
        let o = options(Some("compute_90"));
        for want in [
            "--fmad=false",
            "--prec-div=true",
            "--prec-sqrt=true",
            "--ftz=false",
        ] {
            assert!(o.iter().any(|x| x == want), "{want}");
        }
        assert!(o.iter().any(|x| x == "--gpu-architecture=compute_90"));
        assert_eq!(arch_for(9, 0), "compute_90");
    }
}
