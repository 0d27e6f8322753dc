//! `gradwire simulate --model-parallel`: DistBelief's model parallelism projected by the cost
//! model (`gradwire_sim::model_parallel`), checked through the binary's JSON.

use std::process::{Command, Output};

fn simulate(tag: &str, args: &[&str]) -> (Output, Option<serde_json::Value>) {
    let dir = std::env::temp_dir().join(format!("gradwire-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("sim.json");
    let out = Command::new(env!("CARGO_BIN_EXE_gradwire"))
        .arg("simulate")
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let v = std::fs::read_to_string(&json)
        .ok()
        .map(|s| serde_json::from_str(&s).expect("valid JSON"));
    let _ = std::fs::remove_dir_all(&dir);
    (out, v)
}

/// A small data-parallel part (fixed compute) so the run takes about a second.
const QUICK: [&str; 10] = [
    "--model",
    "mlp:hidden=64x2",
    "--workers",
    "2",
    "--codec",
    "none",
    "--compute-ms",
    "10",
    "--link",
    "1gbit",
];

/// The rows have exactly the documented fields, one per (params, split, link, K); K = 1 is
/// speedup 1; on 1 Gbit/s the tensor split's speedup rises ever more slowly (the all-reduced
/// activations do not shrink with K) and the pipeline's saturates below its micro-batches
/// (the bubble), and for the small model falls past its best K once each message costs a
/// millisecond (its messages grow with K); the data-parallel output keeps its shape.
#[test]
fn simulate_model_parallel_rows() {
    let ks = [1, 2, 4, 8, 16, 32];
    let (out, v) = simulate(
        "simmp",
        &[
            &QUICK[..],
            &[
                "--link",
                "100gbit",
                "--link",
                "1gbit,1ms",
                "--model-parallel",
                "1,2,4,8,16,32",
                "--mp-split",
                "tensor,pipeline",
                "--params",
                "100M,1.7B",
                "--layers",
                "32",
                "--micro-batches",
                "8",
                "--mp-gflops",
                "50",
            ],
        ]
        .concat(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("# model parallel"), "{stdout}");
    let v = v.unwrap();
    // The data-parallel results as before: 3 links x 1 worker count x 1 codec.
    assert_eq!(v["results"].as_array().unwrap().len(), 3, "{v}");
    let inputs = &v["model_parallel_inputs"];
    assert_eq!(inputs["gflops"], 50.0, "{inputs}");
    assert_eq!(inputs["gflops_measured"], false, "{inputs}");
    assert_eq!(inputs["batch"], 64, "{inputs}");
    assert_eq!(inputs["micro_batches"], 8, "{inputs}");
    let rows = v["model_parallel"].as_array().unwrap();
    assert_eq!(rows.len(), 2 * 2 * 3 * ks.len());
    for r in rows {
        let mut keys: Vec<&str> = r.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "boundary_bytes",
                "comm_s",
                "compute_s",
                "k",
                "layers",
                "link",
                "params",
                "speedup",
                "split",
                "step_s",
                "width"
            ]
        );
        let f = |key: &str| r[key].as_f64().unwrap();
        assert!(
            (f("step_s") - f("compute_s") - f("comm_s")).abs() < 1e-12,
            "{r}"
        );
        assert_eq!(r["layers"], 32);
        if r["k"] == 1 {
            assert_eq!(f("speedup"), 1.0, "{r}");
            assert_eq!((f("comm_s"), f("boundary_bytes")), (0.0, 0.0), "{r}");
        }
    }
    // 100M in 32 layers: width round(sqrt(3.125e6)) = 1768; 1.7B: round(sqrt(5.3125e7)) = 7289.
    assert_eq!(rows[0]["width"], 1768);
    assert_eq!(rows[0]["params"], 32 * 1768 * 1768);
    assert_eq!(rows[rows.len() - 1]["width"], 7289);
    // One partition: 6 x 32 x 1768² x 64 flops at 50 GFLOP/s.
    let single = 6.0 * 32.0 * 1768f64.powi(2) * 64.0 / 50e9;
    assert!((rows[0]["step_s"].as_f64().unwrap() - single).abs() < 1e-9 * single);
    let curve = |params: u64, split: &str, link: &str| -> Vec<f64> {
        let c: Vec<f64> = rows
            .iter()
            .filter(|r| {
                r["params"].as_u64().unwrap() / 100_000_000 == params / 100_000_000
                    && r["split"] == split
                    && r["link"] == link
            })
            .map(|r| r["speedup"].as_f64().unwrap())
            .collect();
        assert_eq!(c.len(), ks.len(), "{params} {split} {link}");
        c
    };
    for params in [100_000_000, 1_700_000_000] {
        // Tensor on 1 Gbit/s: rising, each doubling of K gaining less, far below K.
        let t = curve(params, "tensor", "1gbit");
        let gains: Vec<f64> = t.windows(2).map(|w| w[1] / w[0]).collect();
        assert!(gains.windows(2).all(|g| g[1] < g[0]), "{t:?}");
        assert!(t[5] < 0.5 * 32.0, "{t:?}");
        // A faster link never predicts a slower step.
        let fast = curve(params, "tensor", "100gbit");
        assert!(fast.iter().zip(&t).all(|(f, s)| f >= s), "{fast:?} {t:?}");
        // Pipeline on 1 Gbit/s: rising, each doubling gaining less, below the 8
        // micro-batches (at K = 32, 31 of 39 slots are bubble).
        let p = curve(params, "pipeline", "1gbit");
        let gains: Vec<f64> = p.windows(2).map(|w| w[1] / w[0]).collect();
        assert!(gains.windows(2).all(|g| g[1] < g[0]), "{p:?}");
        assert!(gains[4] > 1.0 && p[5] < 8.0, "{p:?}");
    }
    // With 1 ms per message, the 2 x 39 sends of K = 32 cost the 100M model more than the
    // compute it saves over K = 16 (the 1.7B model's compute still outweighs them).
    let slow = curve(100_000_000, "pipeline", "1gbit,1ms");
    let best = slow.iter().cloned().fold(0.0, f64::max);
    assert!(best > slow[1] && slow[5] < best, "{slow:?}");
    // The larger model gains more from the same partitions (more compute per boundary byte).
    assert!(curve(1_700_000_000, "tensor", "1gbit")[5] > curve(100_000_000, "tensor", "1gbit")[5]);
}

/// Without --model-parallel the JSON has no model-parallel keys; bad options are refused
/// before anything is measured, with the reason.
#[test]
fn simulate_model_parallel_off_and_refusals() {
    let (out, v) = simulate("simmpoff", &QUICK);
    assert!(out.status.success());
    let v = v.unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["inputs", "provenance", "results"]);
    for (args, says) in [
        (
            &[
                "--model-parallel",
                "16",
                "--mp-split",
                "pipeline",
                "--layers",
                "8",
            ][..],
            "only 8 pieces",
        ),
        (&["--model-parallel", "0"], "at least one worker"),
        (
            &["--model-parallel", "2", "--mp-split", "ring"],
            "unknown split",
        ),
        (
            &["--model-parallel", "2", "--params", "1.7X"],
            "unknown suffix",
        ),
        (
            &[
                "--model-parallel",
                "2",
                "--mp-split",
                "pipeline",
                "--micro-batches",
                "65",
            ],
            "micro-batches",
        ),
        (
            &["--model-parallel", "2", "--mp-gflops", "0"],
            "--mp-gflops",
        ),
    ] {
        let (out, _) = simulate("simmpbad", &[&QUICK[..], args].concat());
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
