//! The checkpoint folder: where each rank's [`Checkpoint`] file goes, how it is written
//! (atomically), which checkpoints are complete, and which are kept.
//!
//! ```text
//! DIR/step-<S>.rank<R>.ckpt   rank R's state after global step S (Checkpoint::to_bytes)
//! DIR/step-<S>.complete       written by rank 0 once every rank's file of step S is in
//! ```
//!
//! Every file is written to a hidden temporary name in `DIR`, flushed to disk, renamed into
//! place and the folder flushed, so a file either is whole or is not there. A step is
//! *complete* only when its marker exists: a rank that died while writing leaves files of a
//! step without a marker, and that step is never resumed from. The folder is shared by the
//! ranks (one host, or a shared file system).

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::format::Checkpoint;
use crate::error::{Error, Result};

/// Complete checkpoints kept by [`prune`]: the newest and the one before it.
pub const KEEP: usize = 2;

/// The path of rank `rank`'s file of step `step`.
pub fn rank_file(dir: &Path, step: u64, rank: usize) -> PathBuf {
    dir.join(format!("step-{step}.rank{rank}.ckpt"))
}

/// The path of step `step`'s completion marker.
pub fn marker_file(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step}.complete"))
}

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, fsync, rename,
/// fsync of the folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or("file".into(), |n| n.to_string_lossy());
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = File::create(&tmp).map_err(Error::io(&tmp))?;
    f.write_all(bytes).map_err(Error::io(&tmp))?;
    f.sync_all().map_err(Error::io(&tmp))?;
    drop(f);
    fs::rename(&tmp, path).map_err(Error::io(path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io(dir))?;
    Ok(())
}

/// Writes rank `rank`'s checkpoint of step `step` into `dir` (created if absent); its path.
pub fn write_rank(dir: &Path, step: u64, rank: usize, ckpt: &Checkpoint) -> Result<PathBuf> {
    fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let path = rank_file(dir, step, rank);
    write_atomic(&path, &ckpt.to_bytes())?;
    Ok(path)
}

/// Marks step `step` complete (rank 0, once every rank's file is written).
pub fn write_marker(dir: &Path, step: u64, world_size: usize) -> Result<()> {
    let text = format!("step {step}\nworld_size {world_size}\n");
    write_atomic(&marker_file(dir, step), text.as_bytes())
}

/// The step of a file name of this folder (`step-<S>.…`), if it is one.
fn step_of(name: &str) -> Option<u64> {
    let name = name.strip_prefix('.').unwrap_or(name);
    name.strip_prefix("step-")?.split('.').next()?.parse().ok()
}

/// The complete steps in `dir`, oldest first (none when the folder is absent).
pub fn complete_steps(dir: &Path) -> Result<Vec<u64>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir)(e)),
    };
    let mut steps = Vec::new();
    for e in entries {
        let name = e.map_err(Error::io(dir))?.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".complete") && !name.starts_with('.') {
            if let Some(s) = step_of(&name) {
                steps.push(s);
            }
        }
    }
    steps.sort_unstable();
    Ok(steps)
}

/// Reads and decodes rank `rank`'s file of step `step`; a missing, truncated or corrupted
/// file is an error naming it.
pub fn read_rank(dir: &Path, step: u64, rank: usize) -> Result<Checkpoint> {
    let path = rank_file(dir, step, rank);
    let bytes = fs::read(&path).map_err(Error::io(&path))?;
    Checkpoint::from_bytes(&bytes).map_err(|source| Error::Checkpoint { path, source })
}

/// Deletes every file of a step older than the [`KEEP`] newest complete steps (rank files,
/// markers, leftover temporaries); files of newer steps, complete or not, stay.
pub fn prune(dir: &Path) -> Result<()> {
    let complete = complete_steps(dir)?;
    let Some(&cutoff) = complete.iter().rev().nth(KEEP - 1) else {
        return Ok(());
    };
    for e in fs::read_dir(dir).map_err(Error::io(dir))? {
        let e = e.map_err(Error::io(dir))?;
        let name = e.file_name();
        if step_of(&name.to_string_lossy()).is_some_and(|s| s < cutoff) {
            match fs::remove_file(e.path()) {
                Ok(()) => {}
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => return Err(Error::io(&e.path())(err)),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ckpt(rank: u32) -> Checkpoint {
        Checkpoint {
            rank,
            world_size: 2,
            epoch: 0,
            step_in_epoch: 1,
            global_step: 1,
            loss_sum: 0.5,
            config: "{}".into(),
            software: "test".into(),
            params: vec![1.0; 3],
            optimizer: Vec::new(),
            sync: Vec::new(),
        }
    }

    #[test]
    fn only_marked_steps_are_complete_and_the_two_newest_are_kept() {
        let dir = std::env::temp_dir().join(format!("gw-ckpt-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for step in [2, 4, 6, 8] {
            for r in 0..2 {
                write_rank(&dir, step, r, &ckpt(r as u32)).unwrap();
            }
            if step != 8 {
                write_marker(&dir, step, 2).unwrap();
            }
            prune(&dir).unwrap();
        }
        // Step 8 lost its marker (a rank died while writing): 4 and 6 are the complete ones.
        assert_eq!(complete_steps(&dir).unwrap(), vec![4, 6]);
        assert!(!rank_file(&dir, 2, 0).exists() && !marker_file(&dir, 2).exists());
        assert!(rank_file(&dir, 8, 1).exists());
        assert_eq!(read_rank(&dir, 6, 1).unwrap(), ckpt(1));
        // A truncated file is an error naming it.
        let p = rank_file(&dir, 6, 0);
        let b = fs::read(&p).unwrap();
        fs::write(&p, &b[..b.len() - 3]).unwrap();
        let e = read_rank(&dir, 6, 0).unwrap_err().to_string();
        assert!(
            e.contains("step-6.rank0.ckpt") && e.contains("truncated"),
            "{e}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
