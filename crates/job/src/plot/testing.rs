//! Hand-built runs, scratch directories and a PNG check for the chart tests.

use std::path::{Path, PathBuf};

use gradwire_run::report::records::RunRecord;

/// A run of `acc.len()` epochs reaching the accuracies `acc`, each epoch sending `bytes`.
pub(crate) fn sample_run(codec: &str, acc: &[f64], bytes: u64) -> RunRecord {
    let epochs: Vec<_> = acc
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            serde_json::json!({
                "epoch": i + 1,
                "train_loss": 2.0 / (i + 1) as f64,
                "test_accuracy": a,
                "wall_s": 10.0,
                "compute_s": 7.0,
                "comm_s": 3.0,
                "bytes_sent": bytes,
                "compression_ratio": 4_000_000.0 / bytes as f64,
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "codec": codec,
        "model": "mlp",
        "dataset": "fashion-mnist",
        "workers": 4,
        "steps_per_epoch": 100,
        "epochs": epochs,
    }))
    .expect("a hand-built run record")
}

/// A fresh, empty directory under the system temp dir, named for the test.
pub(crate) fn scratch_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gradwire-job-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creating a scratch directory");
    d
}

/// The first eight bytes of every PNG file.
const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Asserts that `path` is a PNG with some content.
pub(crate) fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).expect("reading a drawn chart");
    assert!(bytes.len() > 1000, "{} is too small", path.display());
    assert!(bytes.starts_with(PNG_SIGNATURE), "{}", path.display());
}
