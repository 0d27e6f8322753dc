//! Per-epoch training records: what `gradwire train` writes (`metrics.jsonl`, one JSON line
//! per epoch, and `run.json`, the whole [`RunRecord`]) and `gradwire report` reads. Other
//! tools read these files too, so the key names and the `serde` attributes are stable.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Reading or writing a record file; each error names the file (and the line).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file could not be opened, read or written.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done (`opening`, `reading`, `writing to`), as the message says it.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file could not be opened for appending.
    #[error("opening {} for appending", path.display())]
    Append {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A line of a JSON-lines file could not be read.
    #[error("reading {} line {line}", path.display())]
    ReadLine {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A line of a JSON-lines file is not a valid epoch record.
    #[error("{} line {line}: not a valid epoch record", path.display())]
    InvalidEpoch {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A `run.json` is not a valid run record.
    #[error("{}: not a valid run record", path.display())]
    InvalidRun {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A record could not be serialized.
    #[error("serializing an epoch record")]
    Serialize(#[source] serde_json::Error),
}

/// What [`append_jsonl`], [`read_jsonl`] and [`read_run`] return.
pub type Result<T> = std::result::Result<T, RecordError>;

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RecordError {
    let path = path.to_path_buf();
    move |source| RecordError::Io { what, path, source }
}

/// One epoch of one run; the key names are read by other tools, so keep them stable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct EpochRecord {
    /// Epoch number, starting at 1.
    pub epoch: usize,
    /// Mean training loss over the epoch.
    pub train_loss: f64,
    /// Test accuracy as a fraction in [0, 1] (classifiers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f64>,
    /// Validation perplexity (language models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_perplexity: Option<f64>,
    /// Wall-clock seconds of the epoch.
    pub wall_s: f64,
    /// Seconds of the epoch's evaluation, part of `wall_s` (0 in older records).
    #[serde(default)]
    pub eval_s: f64,
    /// Seconds spent in forward/backward/optimizer.
    pub compute_s: f64,
    /// Seconds spent waiting on gradient communication.
    pub comm_s: f64,
    /// Bytes sent by one worker during this epoch.
    pub bytes_sent: u64,
    /// Dense gradient bytes divided by bytes actually sent.
    pub compression_ratio: f64,
}

/// Which quality metric a run reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Test accuracy (higher is better), stored as a fraction.
    Accuracy,
    /// Validation perplexity (lower is better).
    Perplexity,
}

impl Metric {
    /// Human name with unit, for table headers and axis labels.
    pub fn label(self) -> &'static str {
        match self {
            Metric::Accuracy => "test accuracy (%)",
            Metric::Perplexity => "val perplexity",
        }
    }

    /// The metric of an epoch in display units (accuracy in percent), if recorded.
    pub fn of(self, e: &EpochRecord) -> Option<f64> {
        match self {
            Metric::Accuracy => e.test_accuracy.map(|a| a * 100.0),
            Metric::Perplexity => e.val_perplexity,
        }
    }
}

/// The metric a set of runs is compared on: accuracy if any run recorded it, else perplexity.
pub fn common_metric(runs: &[RunRecord]) -> Metric {
    if runs.iter().all(|r| r.metric() == Metric::Perplexity) && !runs.is_empty() {
        Metric::Perplexity
    } else {
        Metric::Accuracy
    }
}

/// Which code and command made a record.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Provenance {
    /// gradwire's version.
    pub version: String,
    /// The git revision the binary was built from (`-dirty` with uncommitted changes).
    pub git_rev: String,
    /// The command line, as given.
    pub command: String,
}

impl Provenance {
    /// This process: its version, revision and command line.
    pub fn current() -> Provenance {
        Provenance {
            version: env!("CARGO_PKG_VERSION").to_string(),
            git_rev: crate::GIT_REV.to_string(),
            command: std::env::args()
                .map(|a| {
                    if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'') {
                        format!("'{}'", a.replace('\'', "'\\''"))
                    } else {
                        a
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// A whole run: its setup and every epoch, in order.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RunRecord {
    /// Codec spec as given on the command line (`dense`, `topk:0.01`, ...).
    pub codec: String,
    /// Model name.
    pub model: String,
    /// Data set name.
    pub dataset: String,
    /// Number of workers (world size).
    pub workers: usize,
    /// Optimizer steps per epoch.
    pub steps_per_epoch: usize,
    /// Per-epoch records, in epoch order.
    pub epochs: Vec<EpochRecord>,
    /// Momentum factor folded into the gradient before the codec (momentum correction),
    /// when the run used it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum_correction: Option<f64>,
    /// The seed of the run (absent in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The version, revision and command that made the run (absent in older records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// The engine's summary: bytes by kind, stragglers, negotiation rounds, policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<serde_json::Value>,
    /// The emulated link the run trained over (`--link`), absent without emulation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
    /// What `--codec auto` chose per tensor, with every candidate's predicted time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codec_choice: Option<serde_json::Value>,
    /// The partition plan of a model-parallel run (`--model-parallel`): which partition
    /// holds which tensors, and the bytes crossing the boundaries per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_parallel: Option<serde_json::Value>,
    /// The membership events of an elastic run (`--elastic`): each generation of the world,
    /// why it formed, and what it cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership: Option<serde_json::Value>,
}

impl RunRecord {
    /// Perplexity if the run recorded it (a language model, which may also record its
    /// next-token accuracy), else accuracy.
    pub fn metric(&self) -> Metric {
        if self.epochs.iter().any(|e| e.val_perplexity.is_some()) {
            Metric::Perplexity
        } else {
            Metric::Accuracy
        }
    }

    /// The last recorded value of `metric`, in display units.
    pub fn final_metric(&self, metric: Metric) -> Option<f64> {
        self.epochs.iter().rev().find_map(|e| metric.of(e))
    }

    /// Bytes sent per worker up to and including each epoch.
    pub fn cumulative_bytes(&self) -> Vec<u64> {
        self.epochs
            .iter()
            .scan(0u64, |sum, e| {
                *sum += e.bytes_sent;
                Some(*sum)
            })
            .collect()
    }

    /// Total bytes sent per worker over the run.
    pub fn total_bytes(&self) -> u64 {
        self.epochs.iter().map(|e| e.bytes_sent).sum()
    }

    /// Mean bytes sent per optimizer step per worker (0 for an empty run).
    pub fn bytes_per_step(&self) -> f64 {
        let steps = self.steps_per_epoch * self.epochs.len();
        if steps == 0 {
            0.0
        } else {
            self.total_bytes() as f64 / steps as f64
        }
    }

    /// Mean compression ratio over the epochs (1 for an empty run).
    pub fn compression_ratio(&self) -> f64 {
        if self.epochs.is_empty() {
            1.0
        } else {
            self.epochs.iter().map(|e| e.compression_ratio).sum::<f64>() / self.epochs.len() as f64
        }
    }

    /// Total wall-clock seconds over all epochs.
    pub fn total_wall_s(&self) -> f64 {
        self.epochs.iter().map(|e| e.wall_s).sum()
    }

    /// Training seconds (wall-clock without evaluation) until the end of the first epoch
    /// whose `metric` reaches `target` (at least `target` for accuracy, at most for
    /// perplexity); `None` if no epoch does.
    pub fn time_to(&self, metric: Metric, target: f64) -> Option<f64> {
        let mut t = 0.0;
        for e in &self.epochs {
            t += (e.wall_s - e.eval_s).max(0.0);
            let reached = match (metric, metric.of(e)) {
                (Metric::Accuracy, Some(v)) => v >= target,
                (Metric::Perplexity, Some(v)) => v <= target,
                (_, None) => false,
            };
            if reached {
                return Some(t);
            }
        }
        None
    }

    /// Total communication seconds over all epochs.
    pub fn total_comm_s(&self) -> f64 {
        self.epochs.iter().map(|e| e.comm_s).sum()
    }
}

/// Appends one record as a JSON line to `path`, creating the file if needed.
pub fn append_jsonl(path: &Path, record: &EpochRecord) -> Result<()> {
    let mut line = serde_json::to_string(record).map_err(RecordError::Serialize)?;
    line.push('\n');
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| RecordError::Append {
            path: path.to_path_buf(),
            source,
        })?;
    f.write_all(line.as_bytes()).map_err(io("writing to", path))
}

/// Reads every record of a JSON-lines file, skipping blank lines; errors name file and line.
pub fn read_jsonl(path: &Path) -> Result<Vec<EpochRecord>> {
    let f = File::open(path).map_err(io("opening", path))?;
    let mut out = Vec::new();
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|source| RecordError::ReadLine {
            path: path.to_path_buf(),
            line: n,
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let rec = serde_json::from_str(&line).map_err(|source| RecordError::InvalidEpoch {
            path: path.to_path_buf(),
            line: n,
            source,
        })?;
        out.push(rec);
    }
    Ok(out)
}

/// Reads a whole run (`run.json`).
pub fn read_run(path: &Path) -> Result<RunRecord> {
    let text = std::fs::read_to_string(path).map_err(io("reading", path))?;
    serde_json::from_str(&text).map_err(|source| RecordError::InvalidRun {
        path: path.to_path_buf(),
        source,
    })
}

/// Hand-built records for tests, here and in the CLI's (feature `test-util`).
#[cfg(any(test, feature = "test-util"))]
pub mod testing {
    use super::{EpochRecord, RunRecord};

    /// A small hand-built run shared by the plot and report tests.
    pub fn sample_run(codec: &str, acc: &[f64], bytes: u64) -> RunRecord {
        let epochs = acc
            .iter()
            .enumerate()
            .map(|(i, &a)| EpochRecord {
                epoch: i + 1,
                train_loss: 2.0 / (i + 1) as f64,
                test_accuracy: Some(a),
                val_perplexity: None,
                wall_s: 10.0,
                eval_s: 0.0,
                compute_s: 7.0,
                comm_s: 3.0,
                bytes_sent: bytes,
                compression_ratio: 4_000_000.0 / bytes as f64,
            })
            .collect();
        RunRecord {
            codec: codec.into(),
            model: "mlp".into(),
            dataset: "fashion-mnist".into(),
            workers: 4,
            steps_per_epoch: 100,
            epochs,
            momentum_correction: None,
            seed: None,
            provenance: None,
            engine: None,
            link: None,
            codec_choice: None,
            model_parallel: None,
            membership: None,
        }
    }

    /// A fresh, empty scratch directory under the system temp dir.
    pub fn scratch_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gradwire-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{sample_run, scratch_dir};
    use super::*;

    #[test]
    fn jsonl_round_trip() {
        let dir = scratch_dir("jsonl");
        let path = dir.join("run.jsonl");
        let run = sample_run("topk:0.01", &[0.5, 0.7], 1000);
        let mut e = run.epochs.clone();
        e[1].test_accuracy = None;
        e[1].val_perplexity = Some(12.5);
        for r in &e {
            append_jsonl(&path, r).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.lines().nth(1).unwrap().contains("test_accuracy"));
        assert_eq!(read_jsonl(&path).unwrap(), e);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn malformed_line_names_file_and_line() {
        let dir = scratch_dir("jsonl-bad");
        let path = dir.join("bad.jsonl");
        let good = serde_json::to_string(&sample_run("dense", &[0.5], 1).epochs[0]).unwrap();
        std::fs::write(
            &path,
            format!("{good}\n\n{{\"epoch\": 2, \"train_loss\": \n"),
        )
        .unwrap();
        let err = format!("{:#}", read_jsonl(&path).unwrap_err());
        assert!(err.contains("bad.jsonl line 3"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn helpers() {
        let run = sample_run("dense", &[0.5, 0.9], 400);
        assert_eq!(run.cumulative_bytes(), vec![400, 800]);
        assert_eq!(run.bytes_per_step(), 4.0);
        assert_eq!(run.total_wall_s(), 20.0);
        assert_eq!(run.total_comm_s(), 6.0);
        assert_eq!(run.metric(), Metric::Accuracy);
        assert_eq!(run.final_metric(Metric::Accuracy), Some(90.0));
        // A language model records both; its report is about perplexity.
        let mut lm = run.clone();
        lm.epochs[1].val_perplexity = Some(7.5);
        assert_eq!(lm.metric(), Metric::Perplexity);
        assert_eq!(lm.final_metric(Metric::Perplexity), Some(7.5));
    }
}
