//! Hand-computed step times per strategy, and properties of the model.

use proptest::prelude::{prop_assert, prop_oneof, proptest, Just};

use super::*;

fn close(a: f64, b: f64) {
    assert!((a - b).abs() <= 1e-9 * b.abs().max(1e-6), "{a} vs {b}");
}

/// alpha 50 us, 1 Gbit/s, gamma 0.5 ns per byte.
fn gbit() -> Network {
    Network::new(50e-6, 8e-9, 0.5e-9).unwrap()
}

/// Two tensors of 1M and 1k elements, 0.1 s of compute.
fn model() -> ModelProfile {
    ModelProfile {
        name: "toy".into(),
        tensors: vec![1_000_000, 1_000],
        compute_s: 0.1,
    }
}

fn scenario(workers: usize) -> Scenario {
    Scenario {
        workers,
        network: gbit(),
        overlap: 0.0,
        fusion_bytes: 4 << 20,
        host: None,
    }
}

fn codec(strategy: Strategy, w: f64) -> CodecProfile {
    CodecProfile {
        spec: "x".into(),
        strategy,
        encode_s_per_elem: 2e-9,
        decode_s_per_elem: 1e-9,
        wire_bytes_per_elem: w,
    }
}

#[test]
fn dense_by_hand() {
    // 1,001,000 elements = 4,004,000 bytes: one fusion group (under 4 MiB).
    // p = 4 (Rabenseifner): (2 + 2) alpha = 200 us; 2 * 3/4 * 4,004,000 B * 8 ns =
    // 48.048 ms; 3/4 * 4,004,000 B * 0.5 ns = 1.5015 ms.
    let s = step(&model(), &CodecProfile::dense(), &scenario(4)).unwrap();
    close(s.comm_s, 200e-6 + 48.048e-3 + 1.5015e-3);
    close(s.codec_s, 0.0);
    close(s.step_s, 0.1 + s.comm_s);
    // One worker: no communication at all.
    let one = step(&model(), &CodecProfile::dense(), &scenario(1)).unwrap();
    close(one.step_s, 0.1);
}

#[test]
fn dense_fuses_into_groups() {
    // A 1 MiB fusion buffer: 1M elements alone (4 MB > 1 MiB) then the 1k tensor alone.
    let mut sc = scenario(2);
    sc.fusion_bytes = 1 << 20;
    let s = step(&model(), &CodecProfile::dense(), &sc).unwrap();
    // p = 2: each group 2 messages; 2 * 1/2 * bytes * beta; 1/2 * bytes * gamma.
    let group = |b: f64| 2.0 * 50e-6 + b * 8e-9 + 0.5 * b * 0.5e-9;
    close(s.comm_s, group(4e6) + group(4e3));
}

#[test]
fn gather_by_hand() {
    // 0.25 bytes per element (2-bit): 250,250 bytes per rank, one group.
    // p = 8: 7 alpha = 350 us; 7 * 250,250 B * 8 ns = 14.014 ms.
    // Codec: encode 2 ns * 1,001,000 = 2.002 ms; decode 8 payloads * 1.001 ms = 8.008 ms.
    let s = step(&model(), &codec(Strategy::Gather, 0.25), &scenario(8)).unwrap();
    close(s.comm_s, 350e-6 + 14.014e-3);
    close(s.codec_s, 2.002e-3 + 8.008e-3);
}

#[test]
fn sparse_by_hand() {
    // density 0.001: w = 0.008 bytes per element, k = 1,001 pairs in the one group.
    // p = 4: step 0 carries 1,001 pairs (8,008 B), step 1 2,002 pairs (16,016 B);
    // each at alpha + bytes (beta + gamma) = 50 us + bytes * 8.5 ns.
    let s = step(&model(), &codec(Strategy::Sparse, 0.008), &scenario(4)).unwrap();
    close(s.comm_s, 2.0 * 50e-6 + (8_008.0 + 16_016.0) * 8.5e-9);
    close(s.codec_s, 3e-9 * 1_001_000.0);
    // Dense enough to switch: density 0.2 on 4 ranks: step 0 sparse (200,200 pairs,
    // 1,601,600 B); step 1 would hold 400,400 > n/3 entries: dense 4,004,000 B.
    let s = step(&model(), &codec(Strategy::Sparse, 1.6), &scenario(4)).unwrap();
    close(s.comm_s, 2.0 * 50e-6 + (1_601_600.0 + 4_004_000.0) * 8.5e-9);
}

#[test]
fn stripe_by_hand() {
    // 1 bit per element (0.125 B), per tensor: 2 [(p-1) alpha + (p-1)/p w n beta].
    // p = 2: tensor 1M: 2 (50 us + 0.5 * 125,000 B * 8 ns) = 2 (50 us + 0.5 ms);
    // tensor 1k: 2 (50 us + 0.5 * 125 B * 8 ns) = 2 (50 us + 0.5 us).
    let s = step(&model(), &codec(Strategy::Stripe, 0.125), &scenario(2)).unwrap();
    close(s.comm_s, 2.0 * (50e-6 + 0.5e-3) + 2.0 * (50e-6 + 0.5e-6));
    // encode n (1 + 1/2) * 2 ns, decode 2 n * 1 ns.
    close(s.codec_s, 1_001_000.0 * (3e-9 + 2e-9));
}

#[test]
fn powersgd_by_hand() {
    // 0.01 B per element: tensor 1M -> two all-reduces of 5,000 B, at the ring's volume
    // (Rabenseifner on p = 2, as `factor_algorithm` picks): a halving step (50 us + 2,500 B
    // * (8 + 0.5) ns, sent and reduced) and a doubling step (50 us + 2,500 B * 8 ns) each.
    // Tensor 1k: 5 B each, 2.5 B per step.
    let s = step(&model(), &codec(Strategy::PowerSgd, 0.01), &scenario(2)).unwrap();
    let rab = |n: f64| 2.0 * 50e-6 + n / 2.0 * (8.5e-9 + 8e-9);
    close(s.comm_s, 2.0 * rab(5_000.0) + 2.0 * rab(5.0));
}

#[test]
fn speedup_and_efficiency() {
    let p = predict(&model(), &codec(Strategy::Gather, 0.25), &scenario(8)).unwrap();
    close(p.speedup, p.dense.step_s / p.step.step_s);
    close(p.efficiency, 0.1 / p.step.step_s);
    // Dense against itself: speedup 1.
    let d = predict(&model(), &CodecProfile::dense(), &scenario(8)).unwrap();
    close(d.speedup, 1.0);
}

#[test]
fn overlap_hides_at_most_the_compute() {
    let mut sc = scenario(8);
    sc.overlap = 1.0;
    let s = step(&model(), &CodecProfile::dense(), &sc).unwrap();
    // Dense comm (~62 ms) is below 0.1 s of compute: all of it hidden.
    close(s.hidden_s, s.comm_s);
    close(s.step_s, 0.1);
    let slow = Scenario {
        network: Network::new(50e-6, 80e-9, 0.5e-9).unwrap(),
        ..sc
    };
    let s = step(&model(), &CodecProfile::dense(), &slow).unwrap();
    close(s.hidden_s, 0.1);
    close(s.step_s, s.comm_s);
}

#[test]
fn a_step_measured_on_the_host_takes_the_place_of_compute_and_codec() {
    // 8 ranks on 8 cores stepped in 0.25 s without a link, 0.15 s of it compute: the
    // prediction is that step plus the link's communication, as if the codec took 0.1 s.
    let c = codec(Strategy::Sparse, 0.08);
    let alone = step(&model(), &c, &scenario(8)).unwrap();
    assert!(alone.comm_s > 0.0);
    let host = |cores, compute_s, step_s| Scenario {
        host: Some(MeasuredStep {
            cores,
            compute_s,
            step_s,
        }),
        ..scenario(8)
    };
    let s = step(&model(), &c, &host(8, 0.15, 0.25)).unwrap();
    close(s.compute_s, 0.15);
    close(s.codec_s, 0.1);
    close(s.comm_s, alone.comm_s);
    close(s.hidden_s, 0.0);
    close(s.step_s, 0.25 + alone.comm_s);
    // Dense too: its measured step holds the in-host reduction; the link adds the wire.
    let d = step(&model(), &CodecProfile::dense(), &host(8, 0.15, 0.25)).unwrap();
    let d_alone = step(&model(), &CodecProfile::dense(), &scenario(8)).unwrap();
    close(d.step_s, 0.25 + d_alone.comm_s);
    // The overlap still applies, against the measured compute.
    let overlapped = Scenario {
        overlap: 1.0,
        ..host(8, 0.15, 0.25)
    };
    let o = step(&model(), &CodecProfile::dense(), &overlapped).unwrap();
    close(o.hidden_s, d_alone.comm_s.min(0.15));
    close(o.step_s, 0.25 + d_alone.comm_s - d_alone.comm_s.min(0.15));
    // A step shorter than its compute (timer noise) gives no negative codec time.
    close(
        step(&model(), &c, &host(8, 0.2, 0.19)).unwrap().codec_s,
        0.0,
    );
    assert!(matches!(
        step(&model(), &c, &host(8, f64::NAN, 0.2)),
        Err(Error::BadCost {
            what: "host compute_s",
            ..
        })
    ));
    assert_eq!(step(&model(), &c, &host(0, 0.1, 0.2)), Err(Error::NoCores));
}

#[test]
fn on_a_shared_host_the_other_ranks_sync_work_hides_behind_the_wire() {
    // 8 ranks on 2 cores: of the 0.1 s of measured sync, 3/4 is the other ranks' work, 75 ms.
    let c = codec(Strategy::Sparse, 0.08);
    let comm = step(&model(), &c, &scenario(8)).unwrap().comm_s;
    // Dense over 10 Mbit/s: the wire (about 6 s) outlasts it; 75 ms of it hides.
    let slow = |cores| Scenario {
        network: Network::new(50e-6, 800e-9, 0.5e-9).unwrap(),
        host: Some(MeasuredStep {
            cores,
            compute_s: 0.15,
            step_s: 0.25,
        }),
        ..scenario(8)
    };
    let d = step(&model(), &CodecProfile::dense(), &slow(2)).unwrap();
    assert!(d.comm_s > 0.075, "{}", d.comm_s);
    close(d.hidden_s, 0.075);
    close(d.step_s, 0.25 + d.comm_s - 0.075);
    // 4 cores: half of the sync is the others'.
    close(
        step(&model(), &CodecProfile::dense(), &slow(4))
            .unwrap()
            .hidden_s,
        0.05,
    );
    // A core per rank (or more): nothing of the others' runs while a rank waits.
    for cores in [8, 64] {
        close(
            step(&model(), &CodecProfile::dense(), &slow(cores))
                .unwrap()
                .hidden_s,
            0.0,
        );
    }
    // Never more than the communication: the sparse codec's few ms over 1 Gbit/s all hide.
    let fast = Scenario {
        host: Some(MeasuredStep {
            cores: 2,
            compute_s: 0.15,
            step_s: 0.25,
        }),
        ..scenario(8)
    };
    let s = step(&model(), &c, &fast).unwrap();
    assert!(comm < 0.075, "{comm}");
    close(s.hidden_s, comm);
    close(s.step_s, 0.25);
}

#[test]
fn a_prediction_never_rounds_below_the_measured_step_it_adds_the_wire_to() {
    // The figures of a 3-rank 1-bit SGD step measured on 2 cores, whose wire all hides: the
    // prediction is the measured step to the last bit, not one unit in the last place below.
    let c = codec(Strategy::Sparse, 0.0);
    for (compute_s, step_s) in [
        (0.0006989713749999999, 0.005644167558333334),
        (0.15, 0.25),
        (1e-9, 0.1 + 0.2),
    ] {
        let at = Scenario {
            host: Some(MeasuredStep {
                cores: 2,
                compute_s,
                step_s,
            }),
            ..scenario(3)
        };
        let s = step(&model(), &c, &at).unwrap();
        assert!(s.step_s >= step_s, "{} < {step_s}", s.step_s);
    }
}

#[test]
fn bad_inputs_are_errors() {
    assert_eq!(
        step(&model(), &CodecProfile::dense(), &scenario(0)),
        Err(Error::NoWorkers)
    );
    let mut m = model();
    m.compute_s = f64::NAN;
    assert!(matches!(
        step(&m, &CodecProfile::dense(), &scenario(2)),
        Err(Error::BadCost {
            what: "compute_s",
            ..
        })
    ));
    assert!(step(&model(), &codec(Strategy::Auto, 1.0), &scenario(2)).is_err());
    assert!(Network::new(-1.0, 0.0, 0.0).is_err());
}

#[test]
fn link_spec_gives_alpha_and_beta() {
    let spec: gradwire_transport::link::LinkConfig = "10gbit,5us,overhead=64".parse().unwrap();
    let net = Network::from_link(&spec.default, 1e-6, 0.0).unwrap();
    close(net.beta, 0.8e-9);
    close(net.alpha, 5e-6 + 64.0 * 0.8e-9 + 1e-6);
    close(net.bits_per_sec(), 1e10);
}

fn strategies() -> impl proptest::strategy::Strategy<Value = Strategy> {
    prop_oneof![
        Just(Strategy::Dense),
        Just(Strategy::Gather),
        Just(Strategy::Sparse),
        Just(Strategy::Stripe),
        Just(Strategy::PowerSgd),
    ]
}

proptest! {
    /// More bandwidth (smaller beta) never makes a step slower; nor does less latency.
    #[test]
    fn monotone_in_bandwidth_and_latency(
        strategy in strategies(),
        w in 0.001f64..4.0,
        p in 1usize..300,
        beta in 1e-11f64..1e-7,
        alpha in 0.0f64..1e-3,
        factor in 1.0f64..100.0,
    ) {
        let c = codec(strategy, w);
        let at = |alpha: f64, beta: f64| {
            let sc = Scenario { network: Network::new(alpha, beta, 0.5e-9).unwrap(), ..scenario(p) };
            step(&model(), &c, &sc).unwrap().step_s
        };
        prop_assert!(at(alpha, beta / factor) <= at(alpha, beta) * (1.0 + 1e-12));
        prop_assert!(at(alpha / factor, beta) <= at(alpha, beta) * (1.0 + 1e-12));
    }

    /// Fewer wire bytes never make a step slower; compute adds exactly (no overlap); the
    /// efficiency is in (0, 1]. PowerSGD is left out of the first claim: its two
    /// all-reduces choose their algorithm by size as `collective::select` does (thresholds
    /// measured on loopback, not derived from this model), so halving the bytes can cross
    /// to an algorithm the model prices higher (found by proptest at p = 3, where recursive
    /// doubling pays for the non-power-of-two ranks).
    #[test]
    fn monotone_in_bytes_and_compute(
        strategy in strategies(),
        w in 0.001f64..4.0,
        p in 1usize..300,
        extra in 0.0f64..1.0,
    ) {
        let sc = scenario(p);
        let s = |w: f64| step(&model(), &codec(strategy, w), &sc).unwrap().step_s;
        if strategy != Strategy::PowerSgd {
            prop_assert!(s(w / 2.0) <= s(w) * (1.0 + 1e-12));
        }
        let mut m = model();
        m.compute_s += extra;
        let more = step(&m, &codec(strategy, w), &sc).unwrap().step_s;
        prop_assert!((more - s(w) - extra).abs() < 1e-9);
        let pred = predict(&model(), &codec(strategy, w), &sc).unwrap();
        prop_assert!(pred.efficiency > 0.0 && pred.efficiency <= 1.0 + 1e-12);
    }

    /// Dense bandwidth time grows with the world (the bytes, `2(P-1)/P n`, approach `2n`).
    /// Not the latency term: the canonical all-gather takes `log2 P` messages on a power of
    /// two and `P-1` just below one (8 ranks send fewer messages than 7).
    #[test]
    fn dense_bandwidth_time_grows_with_workers(p in 1usize..512) {
        let sc = |p| Scenario { network: Network::new(0.0, 8e-9, 0.5e-9).unwrap(), ..scenario(p) };
        let a = step(&model(), &CodecProfile::dense(), &sc(p)).unwrap().comm_s;
        let b = step(&model(), &CodecProfile::dense(), &sc(p + 1)).unwrap().comm_s;
        prop_assert!(b >= a);
    }
}
