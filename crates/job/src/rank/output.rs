//! What a run leaves behind: its epoch records, `run.json` and the plots, rank 0's final
//! parameters, and the per-rank file names of the timeline.

use std::path::{Path, PathBuf};

use gradwire_run::report::records::{EpochRecord, RunRecord};
use gradwire_train::EpochStats;

use super::{Progress, RankError};

/// An epoch's statistics as its JSON line records them (epochs counted from 1).
pub fn record(s: &EpochStats) -> EpochRecord {
    EpochRecord {
        epoch: s.epoch as usize + 1,
        train_loss: s.train_loss,
        test_accuracy: s.test_accuracy,
        val_perplexity: s.val_perplexity,
        wall_s: s.wall_s,
        eval_s: s.eval_s,
        compute_s: s.compute_s,
        comm_s: s.comm_s,
        bytes_sent: s.bytes_sent,
        compression_ratio: s.compression_ratio,
    }
}

/// Writes `run.json` and the plots of a finished run into `out`. Plots are best-effort: a
/// missing font or an unwritable image is a `warning:` note, and the run stands.
pub fn write_run(
    run: &RunRecord,
    out: &Path,
    progress: &mut dyn Progress,
) -> Result<(), RankError> {
    let path = out.join("run.json");
    let text = serde_json::to_string_pretty(run).map_err(|source| RankError::Json {
        what: "run.json",
        source,
    })?;
    std::fs::write(&path, text + "\n").map_err(|source| RankError::Write { path, source })?;
    if let Err(e) = crate::plot::plot_run(run, out) {
        tracing::warn!("plots of {} not drawn: {e}", out.display());
        progress.note(&format!(
            "warning: plots not drawn ({e}); run.json is written"
        ));
    }
    Ok(())
}

/// Writes `params` as little-endian f32 to `path`.
pub fn save_params(path: &Path, params: &[f32]) -> Result<(), RankError> {
    let bytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|source| RankError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// `FILE` with `.rankN` before its extension (`trace.json` -> `trace.rank2.json`).
pub fn rank_path(path: &Path, rank: usize) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or("timeline".into(), |s| s.to_string_lossy());
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_files_put_the_rank_before_the_extension() {
        assert_eq!(
            rank_path(Path::new("out/trace.json"), 2),
            PathBuf::from("out/trace.rank2.json")
        );
        assert_eq!(
            rank_path(Path::new("trace"), 0),
            PathBuf::from("trace.rank0")
        );
    }

    #[test]
    fn saved_parameters_are_little_endian_f32() {
        let path = std::env::temp_dir().join(format!("gw-job-params-{}", std::process::id()));
        save_params(&path, &[1.0, -2.5]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut want = 1.0f32.to_le_bytes().to_vec();
        want.extend((-2.5f32).to_le_bytes());
        assert_eq!(bytes, want);
    }
}
