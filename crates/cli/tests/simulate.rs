//! `gradwire simulate`, end to end: the documented JSON, and `--host-cores`, which measures
//! a whole step of rank processes sharing this host.

mod common;

use std::time::Duration;

use common::{gradwire, output_within};

/// `gradwire simulate --host-cores`: per worker count and codec, a whole step of that many
/// rank processes is measured on this host without a link (recorded in the JSON's inputs),
/// and the prediction is that step plus the link's communication.
#[test]
fn simulate_on_a_shared_host_measures_a_step_of_rank_processes() {
    let v = simulate_json(
        "simhost",
        &[
            "--model",
            "mlp:hidden=64x2",
            "--workers",
            "3",
            "--link",
            "100mbit",
            "--codec",
            "none;onebit",
            "--batch",
            "8",
            "--host-cores",
            "2",
        ],
    );
    let hosts = v["inputs"]["host_steps"].as_array().unwrap();
    assert_eq!(hosts.len(), 2, "{v}");
    let results = v["results"].as_array().unwrap();
    for (h, codec) in hosts.iter().zip(["none", "onebit"]) {
        assert_eq!(h["codec"], codec, "{h}");
        assert_eq!(h["workers"], 3, "{h}");
        assert_eq!(h["compute"]["workers"], 3, "{h}");
        let mean = h["compute"]["mean_s"].as_f64().unwrap();
        let slowest = h["compute"]["slowest_s"].as_f64().unwrap();
        let step = h["step_s"].as_f64().unwrap();
        assert!(mean > 0.0 && slowest >= mean && step > mean, "{h}");
        // The prediction adds the 100 Mbit/s link's communication to the measured step, less
        // what hides behind the other ranks' sync work (1-bit SGD's few bytes may all hide;
        // dense's 220 kB over 100 Mbit/s outlast what a sync without codec work hides).
        let r = results.iter().find(|r| r["codec"] == codec).unwrap();
        let predicted = r["step_s"].as_f64().unwrap();
        assert!(predicted >= step, "{r} {h}");
        if codec == "none" {
            assert!(predicted > step, "{r} {h}");
        }
    }
    // The speedup compares with dense's own measured step, not with dense's wire added to
    // the codec's measured step.
    let step_of = |codec| {
        let r = results.iter().find(|r| r["codec"] == codec).unwrap();
        r["step_s"].as_f64().unwrap()
    };
    let onebit = results.iter().find(|r| r["codec"] == "onebit").unwrap();
    let speedup = onebit["speedup"].as_f64().unwrap();
    assert!(
        (speedup - step_of("none") / step_of("onebit")).abs() < 1e-9,
        "{onebit}"
    );
    // The ranks' own mode refuses to run outside the environment simulate gives them.
    let err = simulate_fails(&["--host-worker", "--host-cores", "2", "--codec", "none"]);
    assert!(err.contains("internal"), "{err}");
}

/// Runs `gradwire simulate ARGS --json FILE` (in a folder named after `tag`) and returns the
/// JSON it wrote.
fn simulate_json(tag: &str, args: &[&str]) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("gradwire-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("sim.json");
    let mut cmd = gradwire();
    cmd.arg("simulate").args(args).arg("--json").arg(&json);
    let out = output_within(cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("valid JSON");
    let _ = std::fs::remove_dir_all(&dir);
    v
}

/// Runs `gradwire simulate ARGS`, which must fail, and returns what it said on stderr.
fn simulate_fails(args: &[&str]) -> String {
    let mut cmd = gradwire();
    cmd.arg("simulate").args(args);
    let out = output_within(cmd, Duration::from_secs(30));
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `gradwire simulate --json`: the results have exactly the documented fields, one entry per
/// (link, workers, codec), dense has speedup 1, and the inputs and provenance are recorded.
#[test]
fn simulate_writes_the_documented_json() {
    let v = simulate_json(
        "simulate",
        &[
            "--model",
            "mlp:hidden=64x2",
            "--workers",
            "2,8",
            "--link",
            "1gbit",
            "--link",
            "100mbit,1ms",
            "--codec",
            "none;topk:ratio=0.01",
            "--compute-ms",
            "10",
        ],
    );
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2 * 2 * 2);
    for r in results {
        let mut keys: Vec<&str> = r.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "codec",
                "efficiency",
                "link",
                "speedup",
                "step_s",
                "workers"
            ]
        );
        let step = r["step_s"].as_f64().unwrap();
        // At least the 10 ms of compute given.
        assert!(step >= 0.01, "{r}");
        if r["codec"] == "none" {
            assert_eq!(r["speedup"].as_f64().unwrap(), 1.0, "{r}");
        }
        let eff = r["efficiency"].as_f64().unwrap();
        assert!((eff - 0.01 / step).abs() < 1e-9, "{r}");
    }
    assert_eq!(results[0]["link"], "1gbit");
    assert_eq!(results[0]["workers"], 2);
    assert_eq!(v["inputs"]["model"]["name"], "mlp:hidden=64x2");
    assert!(v["provenance"]["git_rev"].is_string());
    // A bad model spec is refused with the reason.
    let err = simulate_fails(&["--model", "mlp:hidden=0"]);
    assert!(err.contains("out of range"), "{err}");
}
