//! Unit tests of the adaptive quantizer: selection, residual, ternary and Golomb-Rice
//! variants, the cap, and the decoder's refusals.

use super::wire::golomb_words;
use super::*;
use crate::sparse::k_for;
use crate::testing::{assert_refuses_cuts, assert_resumes, config, patched, refused};
use crate::{Codec, DecodeError, HEADER_LEN};

fn codec(spec: &str, layout: Vec<usize>) -> Adaptive {
    let ctx = BuildContext::new(5, 1, 2, layout);
    Adaptive::new(config(spec, AdaptiveConfig::parse), &ctx)
}

fn grad(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let h = (i ^ seed.wrapping_mul(0x9e37_79b9)).wrapping_mul(2654435761);
            let u = ((h >> 8) % 20001) as f32 / 10000.0 - 1.0;
            u * u * u + 0.1 * u
        })
        .collect()
}

#[test]
fn quantizes_to_column_means_and_conserves_the_signal() {
    let layout = vec![3000, 50_000, 1000];
    let n: usize = layout.iter().sum();
    let mut c = codec("adaptive:pi=0.01,column=tensor", layout.clone());
    let mut before = vec![0.0f32; n];
    let mut out = Vec::new();
    for s in 0..3 {
        let g = grad(n, s);
        let x: Vec<f32> = g.iter().zip(&before).map(|(a, b)| a + b).collect();
        c.encode(&g, &mut out);
        let mut sent = vec![0.0; n];
        c.decode_add(&out, &mut sent).unwrap();
        let mut start = 0;
        let mut words = 0;
        for &len in &layout {
            let col = start..start + len;
            let pos: Vec<usize> = col.clone().filter(|&i| sent[i] > 0.0).collect();
            let neg: Vec<usize> = col.clone().filter(|&i| sent[i] < 0.0).collect();
            // Roughly pi of each sign, never more than the cap.
            let npos = col.clone().filter(|&i| x[i] > 0.0).count();
            assert!(pos.len() + neg.len() <= k_for(0.02, len));
            assert!(pos.len() >= npos / 400, "{} of {npos}", pos.len());
            // Reconstruction values are the means of what they replace.
            let mean =
                |ix: &[usize]| ix.iter().map(|&i| x[i] as f64).sum::<f64>() / ix.len() as f64;
            if !pos.is_empty() {
                assert!((sent[pos[0]] as f64 - mean(&pos)).abs() < 1e-5);
                assert!(pos.iter().all(|&i| sent[i] == sent[pos[0]]));
            }
            if !neg.is_empty() {
                assert!((sent[neg[0]] as f64 - mean(&neg)).abs() < 1e-5);
            }
            words += pos.len() + neg.len();
            start += len;
        }
        assert_eq!(out.len(), 16 + 16 * 3 + 4 * words, "size formula");
        for i in 0..n {
            assert!((sent[i] + c.residual()[i] - x[i]).abs() < 1e-5);
        }
        before = c.residual().to_vec();
    }
    let mut d = codec("adaptive:pi=0.01,column=tensor", layout);
    assert_resumes(&mut c, &mut d, [grad(n, 9)]);
}

/// `ternary=true` against a naive reference: the same selection as without it (same
/// sample stream), the sent entries decode to the same `+-mu`, every unsent entry to the
/// mean of its column's unsent inputs, the residual holds the rest exactly, and the
/// message grows by 4 bytes per column.
#[test]
fn ternary_sends_the_unsent_mean_as_a_third_value() {
    let n = 1000;
    let g = grad(n, 3);
    let mut plain = codec("adaptive:pi=0.05,column=100", vec![300, 700]);
    let mut tern = codec("adaptive:pi=0.05,column=100,ternary=true", vec![300, 700]);
    let (mut pb, mut tb) = (Vec::new(), Vec::new());
    plain.encode(&g, &mut pb);
    tern.encode(&g, &mut tb);
    assert_eq!(tb.len(), pb.len() + 4 * 10);
    let (mut pd, mut td) = (vec![0f32; n], vec![0f32; n]);
    plain.decode_add(&pb, &mut pd).unwrap();
    tern.decode_add(&tb, &mut td).unwrap();
    let mut unsent_total = 0;
    for c in 0..10 {
        let col = c * 100..(c + 1) * 100;
        let unsent: Vec<usize> = col.clone().filter(|&i| pd[i] == 0.0).collect();
        assert!(!unsent.is_empty() && unsent.len() < 100);
        unsent_total += unsent.len();
        let mean = unsent.iter().map(|&i| f64::from(g[i])).sum::<f64>() / unsent.len() as f64;
        for i in col {
            if pd[i] != 0.0 {
                assert_eq!(td[i], pd[i], "sent entry {i}");
            } else {
                assert!(
                    (f64::from(td[i]) - mean).abs() < 1e-6,
                    "{i}: {} vs {mean}",
                    td[i]
                );
            }
        }
    }
    assert!(unsent_total > 500);
    for i in 0..n {
        assert!(
            (g[i] - (td[i] + tern.residual()[i])).abs() < 1e-6,
            "error feedback loses signal at {i}"
        );
    }
    // A column count other than the decoder's, or a non-finite mu0: refused.
    let mut bad = tb.clone();
    bad[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&9u32.to_le_bytes());
    assert!(tern.decode_add(&bad, &mut td).is_err());
    let mut bad = tb.clone();
    let at = HEADER_LEN + 4 + 16;
    bad[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(tern.decode_add(&bad, &mut td).is_err());
    // A plain payload is not a ternary one.
    assert!(tern.decode_add(&pb, &mut td).is_err());
}

/// `index=golomb` against a hand-coded stream (M = 16: gap 3 = `0 0011`, sign 0; gap 21 =
/// `10 0101`, sign 1; zero padding) and against the word coding: same decode, fewer
/// bytes; every truncation refused.
#[test]
fn golomb_rice_gaps_match_a_hand_coded_stream_and_the_words() {
    assert_eq!(
        golomb_words(&[0x1A, 0x58], 2, 40).unwrap(),
        vec![3 << 1, (25 << 1) | 1]
    );
    assert!(
        golomb_words(&[0x1A, 0x58, 0], 2, 40).is_err(),
        "trailing byte"
    );
    assert!(golomb_words(&[0x1A], 2, 40).is_err(), "truncated");
    assert!(
        golomb_words(&[0x1A, 0x58], 2, 25).is_err(),
        "index beyond n"
    );
    assert!(golomb_words(&[0xff; 8], 1, 40).is_err(), "gap beyond n");
    for spec in [
        "adaptive:pi=0.05,column=100",
        "adaptive:pi=0.05,column=100,ternary=true",
    ] {
        let g = grad(1000, 5);
        let mut words = codec(spec, vec![300, 700]);
        let mut rice = codec(&format!("{spec},index=golomb"), vec![300, 700]);
        let (mut wb, mut rb) = (Vec::new(), Vec::new());
        words.encode(&g, &mut wb);
        rice.encode(&g, &mut rb);
        assert!(rb.len() < wb.len(), "{spec}: {} vs {}", rb.len(), wb.len());
        let (mut wd, mut rd) = (vec![0f32; 1000], vec![0f32; 1000]);
        words.decode_add(&wb, &mut wd).unwrap();
        rice.decode_add(&rb, &mut rd).unwrap();
        assert_eq!(wd, rd, "{spec}");
        assert_eq!(words.residual(), rice.residual());
        for cut in 0..rb.len() {
            assert!(
                rice.decode_add(&rb[..cut], &mut rd).is_err(),
                "{spec} cut {cut}"
            );
        }
    }
}

#[test]
fn column_param_and_cap() {
    let n = 10_000;
    // A skewed gradient: sampling at pi=0.05 would pick far more than the cap in a column
    // full of equal values; the cap holds.
    let g = vec![1.0f32; n];
    let mut c = codec("adaptive:pi=0.05,column=1000,max_excess=1", vec![]);
    let mut s = SparseGrad::default();
    c.select(&g, &mut s);
    assert_eq!(c.cols.len(), 10);
    assert_eq!(s.indices.len(), 10 * 50);
    assert!(s.values.iter().all(|&v| v == 1.0));
}

/// A column shorter than `1 / (max_excess * pi)` (LeNet's output rows of 10, conv1's
/// filters of 25, its biases): the quantile sends the largest entry of each sign, and the
/// cap must not cut that to one entry (it used to: `ceil(2 * 10 / 64) = 1`, so such a
/// column sent only its largest `|x|`, one sign, per step).
#[test]
fn short_columns_send_one_entry_of_each_sign() {
    let g = [0.1f32, -0.4, 0.3, 0.05, -0.2, 0.0, 0.25, -0.1, 0.2, -0.05];
    let mut c = codec("adaptive", vec![10]);
    let mut s = SparseGrad::default();
    c.select(&g, &mut s);
    assert_eq!(s.indices, vec![1, 2]);
    assert_eq!(s.values, vec![-0.4, 0.3]);
    let mut want = g.to_vec();
    want[1] = 0.0;
    want[2] = 0.0;
    assert_eq!(c.residual(), &want[..]);
    // One sign only: one entry.
    let mut c = codec("adaptive", vec![4]);
    c.select(&[0.5, 0.25, 0.0, 1.0], &mut s);
    assert_eq!((s.indices.clone(), s.values.clone()), (vec![3], vec![1.0]));
}

#[test]
fn decoder_rejects_malformed() {
    let n = 2000;
    let mut c = codec("adaptive:pi=0.02", vec![1000, 1000]);
    let mut out = Vec::new();
    c.encode(&grad(n, 1), &mut out);
    assert_refuses_cuts(&c, &out, n);
    refused(&c, &patched(&out, HEADER_LEN, &u32::MAX.to_le_bytes()), n);
    let nan = patched(&out, HEADER_LEN + 12, &f32::NAN.to_le_bytes());
    assert!(matches!(
        refused(&c, &nan, n),
        DecodeError::InvalidField { field: "mu", .. }
    ));
    refused(
        &c,
        &patched(&out, HEADER_LEN + 4, &u64::MAX.to_le_bytes()),
        n,
    );
    let at = out.len() - 4;
    let beyond = patched(&out, at, &(5000u32 << 1).to_le_bytes());
    assert!(matches!(
        refused(&c, &beyond, n),
        DecodeError::IndexOutOfRange { .. }
    ));
    let repeated = patched(&out, at, &0u32.to_le_bytes());
    assert!(matches!(
        refused(&c, &repeated, n),
        DecodeError::InvalidField { field: "index", .. }
    ));
    let spec = format!("adaptive:{}", c.cfg.spec_params());
    assert_eq!(config(&spec, AdaptiveConfig::parse), c.cfg);
}
