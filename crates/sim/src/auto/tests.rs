//! The policy against hand-computed expectations, with a fixed, hand-written calibration so
//! that nothing depends on the machine the tests run on.

use gradwire_engine::codec::CodecConfig;
use gradwire_engine::TensorSpec;
use gradwire_transport::link::LinkConfig;

use super::calibration::{path_from, utc_date, MAX_FILE_BYTES};
use super::*;
use crate::{CodecProfile, Network};

/// The fixed calibration ([`Calibration::two_core_example`]).
fn fixed() -> Calibration {
    Calibration::two_core_example()
}

fn cands(list: &str) -> Vec<(CodecConfig, CodecProfile)> {
    candidates(list, &fixed()).unwrap()
}

fn run(
    t: &[TensorSpec],
    workers: usize,
    link: Option<&LinkConfig>,
    fusion: usize,
    c: &[(CodecConfig, CodecProfile)],
) -> Choice {
    choose(t, workers, link, fusion, c, &fixed()).unwrap()
}

fn lenet_like() -> Vec<TensorSpec> {
    vec![
        TensorSpec::new("conv1.weight", [6, 1, 5, 5]),
        TensorSpec::new("conv1.bias", [6]),
        TensorSpec::new("fc1.weight", [400, 120]),
        TensorSpec::new("fc1.bias", [120]),
        TensorSpec::new("big.weight", [2048, 2048]),
    ]
}

/// The stripe exchange of `n` elements at `p` ranks, written out independently of the
/// cost model, in milliseconds: `2 (p-1) (alpha + n w beta / p)` on the wire for `w`
/// bytes per element, encode `e n (1 + 1/p)` and decode `2 d n`.
fn stripe_ms(net: &Network, p: f64, n: f64, w: f64, e: f64, d: f64) -> f64 {
    let wire = 2.0 * (p - 1.0) * (net.alpha + n * w * net.beta / p);
    (wire + e * n * (1.0 + 1.0 / p) + 2.0 * d * n) * 1e3
}

/// Over 10 Gbit/s and on loopback, at 4 ranks, every tensor stays dense.
fn fast_links_stay_dense(cands: &[(CodecConfig, CodecProfile)]) {
    let ten: LinkConfig = "10gbit".parse().unwrap();
    for link in [Some(&ten), None] {
        let c = run(&lenet_like(), 4, link, 4 << 20, cands);
        assert!(
            c.tensors.iter().all(|t| t.codec == "none"),
            "{link:?}: {c:?}"
        );
    }
}

fn pick(c: &Choice, name: &str) -> String {
    c.tensors
        .iter()
        .find(|t| t.tensor == name)
        .unwrap()
        .codec
        .clone()
}

#[test]
fn a_slow_link_compresses_big_tensors_and_one_rank_compresses_nothing() {
    let cands = cands(DEFAULT_CANDIDATES);
    let slow: LinkConfig = "100mbit".parse().unwrap();
    let c = run(&lenet_like(), 4, Some(&slow), 4 << 20, &cands);
    // 16 MiB over 100 Mbit/s: 2 s dense, about 7x less with 4-bit QSGD.
    assert_eq!(pick(&c, "big.weight"), "qsgd:bits=4", "{c:?}");
    // Over 1 Gbit/s dense still pays about 0.2 s for it, QSGD under 0.1 s.
    let gbit: LinkConfig = "1gbit".parse().unwrap();
    let mid = run(&lenet_like(), 4, Some(&gbit), 4 << 20, &cands);
    assert_eq!(pick(&mid, "big.weight"), "qsgd:bits=4", "{mid:?}");
    // Over 10 Gbit/s and loopback these codec costs exceed what the bytes saved would take.
    fast_links_stay_dense(&cands);
    let alone = run(&lenet_like(), 1, Some(&slow), 4 << 20, &cands);
    assert!(
        alone.tensors.iter().all(|t| t.codec == "none"),
        "one rank has no wire to save: {alone:?}"
    );
    // Every candidate's prediction is recorded.
    assert!(c
        .tensors
        .iter()
        .all(|t| t.predicted_ms.len() == cands.len()));
}

#[test]
fn the_choice_minimises_an_independent_alpha_beta_sum() {
    // Over 10 Mbit/s a 4M-element tensor is decided by the wire; dense (the canonical
    // all-reduce) costs more than 2 (P-1)/P n 4 beta.
    let cands = cands("none,qsgd:bits=4");
    let link: LinkConfig = "10mbit".parse().unwrap();
    let t = [TensorSpec::new("w", [2048, 2048])];
    // Fusion off: each tensor pays its own per-message costs, as in the formula.
    let c = run(&t, 4, Some(&link), 0, &cands);
    // The network written out: 10 Mbit/s is 8e-7 s per byte, plus the software's 1e-9; the
    // link's latency is 0, so alpha is the calibration's 4.4e-6.
    let net = Network {
        alpha: 4.4e-6,
        beta: 8.0 / 10e6 + 1e-9,
        gamma: 1e-9,
    };
    assert_eq!(network(Some(&link), &fixed()).unwrap(), net);
    let (p, n) = (4.0, 4_194_304.0);
    let qsgd_ms = stripe_ms(&net, p, n, 0.508, 7.2e-9, 3.45e-9);
    let got = &c.tensors[0].predicted_ms;
    assert_eq!(got[1].1, "stripe", "{got:?}");
    assert!(
        (got[1].2 - qsgd_ms).abs() / qsgd_ms < 1e-9,
        "{got:?} vs {qsgd_ms}"
    );
    let dense_lower = 2.0 * (p - 1.0) / p * n * 4.0 * net.beta * 1e3;
    assert!(got[0].2 >= dense_lower, "{got:?} vs {dense_lower}");
    assert_eq!(c.tensors[0].codec, "qsgd:bits=4");
}

#[test]
fn the_calibration_sets_the_prices() {
    // The same tensor and link as above; codec costs 100 times higher make QSGD lose.
    let mut slow = fixed();
    for c in &mut slow.codecs {
        c.encode_s_per_elem *= 100.0;
        c.decode_s_per_elem *= 100.0;
    }
    let link: LinkConfig = "1gbit".parse().unwrap();
    let t = [TensorSpec::new("w", [2048, 2048])];
    let cands = candidates("none,qsgd:bits=4", &slow).unwrap();
    assert_eq!(cands[1].1.encode_s_per_elem, 7.2e-7);
    let c = choose(&t, 4, Some(&link), 0, &cands, &slow).unwrap();
    assert_eq!(c.tensors[0].codec, "none", "{c:?}");
    // Loopback is the calibration's own network.
    let net = network(None, &slow).unwrap();
    assert_eq!((net.alpha, net.beta, net.gamma), (4.4e-6, 1e-9, 1e-9));
}

#[test]
fn one_bit_sgd_is_a_default_candidate_only_without_momentum_after_aggregation() {
    assert_eq!(default_candidates(true), DEFAULT_CANDIDATES);
    assert_eq!(default_candidates(false), DEFAULT_CANDIDATES_NO_MOMENTUM);
    assert!(DEFAULT_CANDIDATES_NO_MOMENTUM.ends_with(",onebit"));
    assert!(!DEFAULT_CANDIDATES.contains("onebit"));
    // Every default list is priced by a calibration of the known codecs.
    assert_eq!(cands(DEFAULT_CANDIDATES_NO_MOMENTUM).len(), 4);
}

#[test]
fn one_bit_sgd_wins_where_the_wire_counts_and_loses_where_it_does_not() {
    let cands = cands(DEFAULT_CANDIDATES_NO_MOMENTUM);
    // Over 1 Gbit/s and 100 Mbit/s the big matrix goes 1-bit: about QSGD's codec cost
    // per element, a quarter of its bytes.
    for link in ["1gbit", "100mbit"] {
        let l: LinkConfig = link.parse().unwrap();
        let c = run(&lenet_like(), 4, Some(&l), 4 << 20, &cands);
        assert_eq!(pick(&c, "big.weight"), "onebit", "{link}: {c:?}");
    }
    fast_links_stay_dense(&cands);
    // Written out for the big matrix on the stripe route, fusion off.
    let l: LinkConfig = "10mbit".parse().unwrap();
    let t = [TensorSpec::new("w", [2048, 2048])];
    let c = run(&t, 4, Some(&l), 0, &cands);
    let net = network(Some(&l), &fixed()).unwrap();
    let want_ms = stripe_ms(&net, 4.0, 4_194_304.0, 0.139, 7.0e-9, 3.65e-9);
    let got = &c.tensors[0].predicted_ms[3];
    assert_eq!((got.0.as_str(), got.1.as_str()), ("onebit", "stripe"));
    assert!(
        (got.2 - want_ms).abs() / want_ms < 1e-9,
        "{got:?} vs {want_ms}"
    );
}

#[test]
fn candidates_are_checked_by_name() {
    let cal = fixed();
    assert!(candidates("none,fp16", &cal).is_ok());
    assert!(matches!(
        candidates("dgc:ratio=0.001", &cal),
        Err(AutoError::Dgc)
    ));
    assert!(matches!(
        candidates("qsgd:bits=2", &cal),
        Err(AutoError::Unknown { .. })
    ));
    assert!(matches!(candidates("", &cal), Err(AutoError::Empty)));
    assert!(matches!(
        candidates("nonsense", &cal),
        Err(AutoError::Spec { .. })
    ));
    // A known codec the calibration lacks.
    let mut partial = fixed();
    partial.codecs.retain(|c| c.spec != "fp16");
    let e = candidates("none,fp16", &partial).unwrap_err();
    assert!(matches!(e, AutoError::Uncalibrated { .. }), "{e}");
    assert!(e.to_string().contains("gradwire calibrate"), "{e}");
    // `none` needs no calibration.
    assert_eq!(
        candidates("none", &partial).unwrap()[0].1.encode_s_per_elem,
        0.0
    );
}

#[test]
fn spec_lists_keep_parameters_with_their_codec() {
    assert_eq!(
        split_specs("qsgd:bits=2,bucket=128, none,,topk:ratio=0.01"),
        ["qsgd:bits=2,bucket=128", "none", "topk:ratio=0.01"]
    );
}

#[test]
fn the_rules_name_each_tensor_exactly() {
    let cands = cands(DEFAULT_CANDIDATES);
    let link: LinkConfig = "100mbit".parse().unwrap();
    let c = run(&lenet_like(), 4, Some(&link), 4 << 20, &cands);
    let rules = c.rules().unwrap();
    assert_eq!(rules.len(), 5);
    let want: CodecConfig = pick(&c, "big.weight").parse().unwrap();
    assert_eq!(rules[4].to_string(), format!("name=big.weight=>{want}"));
    let want: Vec<String> = c
        .tensors
        .iter()
        .map(|t| format!("{}: {}", t.tensor, t.codec))
        .collect();
    assert_eq!(c.summary(), want.join(", "));
    assert!(
        c.summary().ends_with("big.weight: qsgd:bits=4"),
        "{}",
        c.summary()
    );
}

/// A scratch file path of this test process.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gradwire-sim-cal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn a_calibration_round_trips_through_its_file() {
    let path = scratch("sub/round.json");
    let mut c = fixed();
    c.git_revision = Some("abc123".into());
    c.save(&path).unwrap();
    assert_eq!(Calibration::load(&path).unwrap(), c);
    let missing = Calibration::load(&scratch("absent.json")).unwrap_err();
    assert!(missing.is_missing(), "{missing}");
}

#[test]
fn a_calibration_file_is_untrusted() {
    let write = |name: &str, text: &str| {
        let p = scratch(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let json = serde_json::to_string(&fixed()).unwrap();
    // Not JSON, or not a calibration: a parse error naming the file.
    let p = write("garbage.json", "{\"format\": 1, ");
    let e = Calibration::load(&p).unwrap_err();
    assert!(matches!(e, CalibrationError::Parse { .. }), "{e}");
    assert!(e.to_string().contains("garbage.json"), "{e}");
    // Too large: refused before parsing.
    let big = " ".repeat(MAX_FILE_BYTES as usize + 1) + &json;
    let e = Calibration::load(&write("big.json", &big)).unwrap_err();
    assert!(matches!(e, CalibrationError::TooLarge { .. }), "{e}");
    // Absurd or negative costs, an unknown format, a duplicate codec.
    for (name, from, to) in [
        ("neg.json", "\"gamma_s\":1e-9", "\"gamma_s\":-1e-9"),
        ("huge.json", "\"gamma_s\":1e-9", "\"gamma_s\":1e300"),
        (
            "enc.json",
            "\"encode_s_per_elem\":6.4e-9",
            "\"encode_s_per_elem\":5.0",
        ),
        ("format.json", "\"format\":1", "\"format\":2"),
        ("dup.json", "\"spec\":\"qsgd:bits=4\"", "\"spec\":\"fp16\""),
    ] {
        assert!(json.contains(from), "{from} in {json}");
        let e = Calibration::load(&write(name, &json.replacen(from, to, 1))).unwrap_err();
        assert!(matches!(e, CalibrationError::Invalid { .. }), "{name}: {e}");
    }
    // Saving refuses what loading would.
    let mut bad = fixed();
    bad.loopback_alpha_s = f64::NAN;
    assert!(bad.save(&scratch("nan.json")).is_err());
    bad = fixed();
    bad.host = "h".repeat(1000);
    assert!(matches!(
        bad.validate(),
        Err(Invalid::TooLong { what: "host" })
    ));
}

#[test]
fn the_cache_path_follows_the_environment() {
    use std::ffi::OsString;
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| OsString::from(p.1))
    };
    const ALL: [(&str, &str); 3] = [
        ("GRADWIRE_CALIBRATION", "/x/c.json"),
        ("XDG_CACHE_HOME", "/xdg"),
        ("HOME", "/home/u"),
    ];
    assert_eq!(
        path_from(env(&ALL)).unwrap(),
        std::path::Path::new("/x/c.json")
    );
    assert_eq!(
        path_from(env(&ALL[1..])).unwrap(),
        std::path::Path::new("/xdg/gradwire/calibration.json")
    );
    assert_eq!(
        path_from(env(&[("XDG_CACHE_HOME", ""), ("HOME", "/home/u")])).unwrap(),
        std::path::Path::new("/home/u/.cache/gradwire/calibration.json")
    );
    assert!(matches!(path_from(env(&[])), Err(CalibrationError::NoPath)));
}

#[test]
fn dates_are_utc_civil() {
    assert_eq!(utc_date(0), "1970-01-01T00:00:00Z");
    // 2000-02-29 12:34:56 UTC: 951,827,696 s (a leap day of a century leap year).
    assert_eq!(utc_date(951_827_696), "2000-02-29T12:34:56Z");
    // 2026-12-06 00:00:00 UTC: 20,793 days.
    assert_eq!(utc_date(20_793 * 86_400), "2026-12-06T00:00:00Z");
}
