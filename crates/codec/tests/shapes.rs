//! Shapes reach the codecs: on LeNet's real layer shapes (burn layouts: conv
//! `[c_out, c_in, kh, kw]`, Linear `[in, out]`), 1-bit SGD and adaptive quantization work per
//! column (one index of the leading axis) and match naive per-column references written here;
//! DGC sends 1-D tensors dense and compresses the rest; QSGD's buckets never straddle tensors;
//! TernGrad keeps the output layer in float unless told otherwise.

use gradwire_codec::{
    BuildContext, Codec, CodecConfig, SparseGrad, TensorInfo, TensorRole, HEADER_LEN,
};

fn lenet() -> Vec<TensorInfo> {
    use TensorRole::*;
    vec![
        TensorInfo::new([6, 1, 5, 5], ConvWeight),
        TensorInfo::new([6], Bias),
        TensorInfo::new([16, 6, 5, 5], ConvWeight),
        TensorInfo::new([16], Bias),
        TensorInfo::new([256, 120], LinearWeight),
        TensorInfo::new([120], Bias),
        TensorInfo::new([120, 84], LinearWeight),
        TensorInfo::new([84], Bias),
        TensorInfo::new([84, 10], Output),
        TensorInfo::new([10], Output),
    ]
}

fn ctx() -> BuildContext {
    BuildContext::new(3, 1, 4, Vec::new()).with_tensors(lenet())
}

/// A gradient with a spread of magnitudes per tensor, both signs, some zeros.
fn grad(n: usize, salt: u64) -> Vec<f32> {
    let mut s = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if i % 13 == 5 {
                0.0
            } else {
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.45) * (1.0 + (i % 5) as f32)
            }
        })
        .collect()
}

/// The naive columns: for each tensor, runs of `shape[1..].product()` elements (the whole
/// tensor when 1-D), written without the crate's helpers.
fn naive_columns(ts: &[TensorInfo]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    for t in ts {
        let n: usize = t.shape.iter().product();
        let c = if t.shape.len() >= 2 {
            t.shape[1..].iter().product()
        } else {
            n
        };
        let mut a = at;
        while a < at + n {
            out.push(a..a + c);
            a += c;
        }
        at += n;
    }
    out
}

fn decode(c: &dyn Codec, payload: &[u8], n: usize) -> Vec<f32> {
    let mut acc = vec![0.0; n];
    c.decode_add(payload, &mut acc).unwrap();
    acc
}

#[test]
fn onebit_per_column_equals_naive_reference() {
    let ts = lenet();
    let n: usize = ts.iter().map(TensorInfo::numel).sum();
    let cols = naive_columns(&ts);
    // 25 (conv1 filters), 150 (conv2 filters), 120 (fc1 rows: out), 84, 10; biases whole.
    assert_eq!(cols.len(), 6 + 1 + 16 + 1 + 256 + 1 + 120 + 1 + 84 + 1);
    let cfg: CodecConfig = "onebit:ef=false".parse().unwrap();
    let mut c = cfg.build(&ctx());
    let g = grad(n, 1);
    let mut out = Vec::new();
    c.encode(&g, &mut out);
    let words: usize = cols.iter().map(|r| 8 + 4 * r.len().div_ceil(32)).sum();
    assert_eq!(out.len(), HEADER_LEN + words);
    let got = decode(&*c, &out, n);
    for col in cols {
        let x = &g[col.clone()];
        let (mut ps, mut pc, mut ns, mut nc) = (0f64, 0usize, 0f64, 0usize);
        for &v in x {
            if v >= 0.0 {
                ps += v as f64;
                pc += 1;
            } else {
                ns += v as f64;
                nc += 1;
            }
        }
        let pos = if pc > 0 { ps / pc as f64 } else { 0.0 };
        let neg = if nc > 0 { ns / nc as f64 } else { 0.0 };
        for (i, &v) in x.iter().enumerate() {
            let want = if v >= 0.0 { pos } else { neg };
            let y = got[col.start + i] as f64;
            assert!(
                (y - want).abs() <= 1e-5 * want.abs().max(1.0),
                "column {col:?}: {y} vs {want}"
            );
        }
    }
}

#[test]
fn adaptive_per_column_with_lbann_pi() {
    let cfg: CodecConfig = "adaptive".parse().unwrap();
    match &cfg {
        CodecConfig::Adaptive(a) => assert_eq!(a.pi, 1.0 / 64.0),
        _ => unreachable!(),
    }
    let ts = lenet();
    let n: usize = ts.iter().map(TensorInfo::numel).sum();
    let cols = naive_columns(&ts);
    let mut c = cfg.build(&ctx());
    let g = grad(n, 2);
    let mut out = Vec::new();
    c.encode(&g, &mut out);
    // One 16-byte record per naive column.
    let ncols = u32::from_le_bytes(out[HEADER_LEN..HEADER_LEN + 4].try_into().unwrap());
    assert_eq!(ncols as usize, cols.len());
    let sent = decode(&*c, &out, n);
    for col in cols {
        let x = &g[col.clone()];
        let y = &sent[col.clone()];
        // Per column: at most one positive and one negative reconstruction value, each the
        // mean of the entries it replaces, and nothing unsent beyond what was sent.
        for sign in [1.0f32, -1.0] {
            let idx: Vec<usize> = (0..x.len()).filter(|&i| y[i] * sign > 0.0).collect();
            if idx.is_empty() {
                continue;
            }
            let mean = idx.iter().map(|&i| x[i] as f64).sum::<f64>() / idx.len() as f64;
            for &i in &idx {
                assert!((y[i] as f64 - mean).abs() <= 1e-5, "{col:?}");
            }
            let min_sent = idx.iter().map(|&i| x[i] * sign).fold(f32::MAX, f32::min);
            let max_unsent = (0..x.len())
                .filter(|&i| y[i] == 0.0 && x[i] * sign > 0.0)
                .map(|i| x[i] * sign)
                .fold(0.0, f32::max);
            assert!(min_sent >= max_unsent, "{col:?}: {min_sent} < {max_unsent}");
            // About pi of each sign (the cap is max_excess = 2 times pi).
            assert!(idx.len() <= (2.0 * x.len() as f64 / 64.0).ceil() as usize + 1);
        }
    }
}

#[test]
fn dgc_sends_one_dimensional_tensors_dense() {
    let ts = lenet();
    let n: usize = ts.iter().map(TensorInfo::numel).sum();
    let cfg: CodecConfig = "dgc:ratio=0.01,momentum=0,warmup_epochs=0".parse().unwrap();
    let mut c = cfg.build(&ctx());
    let mut s = SparseGrad::default();
    c.sparse_encode()
        .expect("dgc sparsifies")
        .encode_sparse(&grad(n, 3), &mut s);
    let mut at = 0;
    for t in &ts {
        let numel = t.numel();
        let sent = s
            .indices
            .iter()
            .filter(|&&i| (at..at + numel).contains(&(i as usize)))
            .count();
        if t.shape.len() == 1 {
            assert_eq!(sent, numel, "1-D {t:?} dense");
        } else {
            let k = (0.01 * numel as f64).ceil() as usize;
            assert_eq!(sent, k, "{t:?} sparse");
        }
        at += numel;
    }
    // Without shapes, the fallback: tensors under 1024 elements dense.
    let flat = BuildContext::new(3, 1, 4, ts.iter().map(TensorInfo::numel).collect());
    let mut c = cfg.build(&flat);
    c.sparse_encode()
        .expect("dgc sparsifies")
        .encode_sparse(&grad(n, 3), &mut s);
    let dense_small: usize = ts.iter().map(TensorInfo::numel).filter(|&m| m < 1024).sum();
    assert!(s.indices.len() >= dense_small);
}

/// The reference code's split (synxlin/deep-gradient-compression `train.py`: only
/// parameters with `dim() > 1` are registered with the compressor; `DGCCompressor` sends
/// `ceil(numel * ratio)` of each whatever its size: one element for tensors of at most
/// `1 / ratio` elements), on `gradwire train --model lenet` (burn's shapes) at the paper's
/// 0.1%: the counts per tensor are worked out by hand from that rule.
#[test]
fn dgc_split_follows_the_reference_rule_at_0_1_percent() {
    use TensorRole::*;
    let ts = vec![
        TensorInfo::new([6, 1, 5, 5], ConvWeight), // 150: ceil(0.15) = 1
        TensorInfo::new([6], Bias),                // 1-D: all 6
        TensorInfo::new([16, 6, 5, 5], ConvWeight), // 2400: ceil(2.4) = 3
        TensorInfo::new([16], Bias),
        TensorInfo::new([400, 120], LinearWeight), // 48000: 48
        TensorInfo::new([120], Bias),
        TensorInfo::new([120, 84], LinearWeight), // 10080: ceil(10.08) = 11
        TensorInfo::new([84], Bias),
        TensorInfo::new([84, 10], Output), // 840: ceil(0.84) = 1
        TensorInfo::new([10], Output),
    ];
    let want = [1, 6, 3, 16, 48, 120, 11, 84, 1, 10];
    let n: usize = ts.iter().map(TensorInfo::numel).sum();
    assert_eq!(n, 61_706);
    // The default spec after its warm-up epochs, and with the warm-up off.
    for (spec, epoch) in [("dgc", 4.0), ("dgc:warmup_epochs=0", 0.0)] {
        let cfg: CodecConfig = spec.parse().unwrap();
        let mut c = cfg.build(&BuildContext::new(3, 1, 4, Vec::new()).with_tensors(ts.clone()));
        c.set_progress(gradwire_codec::Progress {
            epoch,
            ..Default::default()
        });
        let mut s = SparseGrad::default();
        for step in 0..3 {
            c.sparse_encode()
                .expect("dgc sparsifies")
                .encode_sparse(&grad(n, 11 + step), &mut s);
            let mut at = 0;
            let got: Vec<usize> = ts
                .iter()
                .map(|t| {
                    let r = at..at + t.numel();
                    at = r.end;
                    s.indices
                        .iter()
                        .filter(|&&i| r.contains(&(i as usize)))
                        .count()
                })
                .collect();
            assert_eq!(got, want, "{spec} step {step}");
        }
    }
}

#[test]
fn qsgd_buckets_never_straddle_tensors() {
    // A tensor of large values then one of tiny values, each shorter than a bucket.
    let layout = vec![100, 100, 700];
    let mut g = vec![1000.0f32; 100];
    g.extend((0..100).map(|i| 0.001 * ((i % 7) as f32 - 3.0)));
    g.extend((0..700).map(|i| (i as f32).sin()));
    for spec in [
        "qsgd:bits=4,bucket=512",
        "qsgd:levels=3,bucket=512,coding=elias",
    ] {
        let cfg: CodecConfig = spec.parse().unwrap();
        let mut c = cfg.build(&BuildContext::new(1, 0, 2, layout.clone()));
        let mut out = Vec::new();
        let mut mean = vec![0f64; g.len()];
        for _ in 0..200 {
            c.encode(&g, &mut out);
            let d = decode(&*c, &out, g.len());
            // The tiny tensor is scaled by its own max (0.003), never by the large one's.
            for (i, v) in d[100..200].iter().enumerate() {
                assert!(v.abs() <= 0.003 + 1e-9, "{spec}: {i} {v}");
            }
            for (m, v) in mean.iter_mut().zip(&d) {
                *m += *v as f64 / 200.0;
            }
        }
        // Still unbiased on the tiny tensor (its values are not all rounded to 0).
        let err: f64 = (100..200)
            .map(|i| (mean[i] - g[i] as f64).abs())
            .sum::<f64>()
            / 100.0;
        assert!(err < 3e-4, "{spec}: mean error {err}");
        // Four buckets ([0,100) [100,200) [200,712) [712,900)), not two: more scales.
        let mut whole = cfg.build(&BuildContext::new(1, 0, 2, Vec::new()));
        let mut one = Vec::new();
        whole.encode(&g, &mut one);
        if !spec.contains("elias") {
            assert!(out.len() > one.len(), "{spec}");
        }
    }
}

#[test]
fn terngrad_keeps_the_output_layer_in_float() {
    let ts = lenet();
    let n: usize = ts.iter().map(TensorInfo::numel).sum();
    let g = grad(n, 4);
    let out_start = n - 84 * 10 - 10;
    for (spec, float) in [("terngrad", true), ("terngrad:output=ternary", false)] {
        let cfg: CodecConfig = spec.parse().unwrap();
        let mut c = cfg.build(&ctx());
        let mut out = Vec::new();
        c.encode(&g, &mut out);
        let d = decode(&*c, &out, n);
        assert_eq!(d[out_start..] == g[out_start..], float, "{spec}");
        // Everything else is ternary: at most 3 distinct values per tensor.
        let mut at = 0;
        for t in &ts {
            let m = t.numel();
            let mut vals: Vec<u32> = d[at..at + m].iter().map(|v| v.to_bits()).collect();
            vals.sort_unstable();
            vals.dedup();
            if !(float && t.role == TensorRole::Output) {
                assert!(vals.len() <= 3, "{spec} {t:?}: {}", vals.len());
            }
            at += m;
        }
    }
}
