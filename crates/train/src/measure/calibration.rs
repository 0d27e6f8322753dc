//! The calibration `--codec auto` prices its candidates with, measured on this machine, and
//! its cache.
//!
//! This file owns making a [`Calibration`] ([`calibrate`]): the stack's costs as
//! [`calibrate_stack`] measures them (about a quarter of a second),
//! and each codec `auto` knows ([`KNOWN`]) encoding and decoding a synthetic 1024 x 1024
//! linear weight's gradient in this process, the median of at least [`CALIBRATION_PASSES`]
//! passes over [`CALIBRATION_SECONDS`] each ([`measure_codec_within`]): about a second in
//! all on a 2-core machine. It also owns reading the cache or making it when there is none
//! ([`cached`]), so that ranks of one host starting together measure once and read the same
//! file: the first takes a lock file beside the cache, the others wait for the cache.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gradwire_engine::codec::{CodecConfig, TensorInfo, TensorRole};
use gradwire_sim::auto::calibration::{utc_date, MAX_TEXT};
use gradwire_sim::auto::{Calibration, CalibrationError, CodecTiming, FORMAT, KNOWN};

use super::codec::measure_codec_within;
use super::passes::Passes;
use super::{calibrate_stack, MeasureError};

/// Rows and columns of the synthetic linear weight the codecs are timed on.
pub const CALIBRATION_SHAPE: [usize; 2] = [1024, 1024];
/// Timed passes per codec at least.
pub const CALIBRATION_PASSES: usize = 7;
/// Seconds of timed passes per codec at least.
pub const CALIBRATION_SECONDS: f64 = 0.1;
/// How long a process waits for another one's calibration (the lock file's holder) before
/// taking the lock over as abandoned.
pub const LOCK_WAIT: Duration = Duration::from_secs(60);

/// Why the calibration cannot be read or made.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// The cache exists but cannot be read or holds no valid calibration, or writing it
    /// failed (the message names the file).
    #[error(transparent)]
    File(#[from] CalibrationError),
    /// A measurement failed.
    #[error("measuring: {0}")]
    Measure(Box<MeasureError>),
    /// A spec of [`KNOWN`] does not parse (a bug of this version).
    #[error("codec `{spec}`: {source}")]
    Spec {
        /// The spec.
        spec: &'static str,
        /// Why it does not parse.
        #[source]
        source: gradwire_engine::codec::ConfigError,
    },
    /// The lock file beside the cache could not be made.
    #[error("locking {}: {source}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

impl From<MeasureError> for CalibrateError {
    fn from(e: MeasureError) -> Self {
        CalibrateError::Measure(Box::new(e))
    }
}

/// Where a calibration [`cached`] returns came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Read from the cache.
    Read,
    /// Measured now and saved to the cache.
    Measured,
}

/// A deterministic gradient of `n` elements in [-1, 1) (an xorshift generator seeded with
/// `seed`).
pub fn synthetic_gradient(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// This host's name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`, else `unknown`), at most
/// [`MAX_TEXT`] characters.
pub fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    name.chars().take(MAX_TEXT).collect()
}

/// Measures this machine's [`Calibration`] (module doc); `git_revision` is recorded as the
/// build's revision.
pub fn calibrate(git_revision: Option<String>) -> Result<Calibration, CalibrateError> {
    let stack = calibrate_stack()?;
    let info = TensorInfo::new(CALIBRATION_SHAPE.to_vec(), TensorRole::LinearWeight);
    let grad = synthetic_gradient(info.numel(), 1);
    let passes = Passes {
        min: CALIBRATION_PASSES,
        min_seconds: CALIBRATION_SECONDS,
    };
    let mut codecs = Vec::new();
    for &(spec, _) in KNOWN.iter().filter(|k| k.0 != "none") {
        let config: CodecConfig = spec
            .parse()
            .map_err(|source| CalibrateError::Spec { spec, source })?;
        let cost = measure_codec_within(&config, std::slice::from_ref(&info), &grad, 1, passes);
        codecs.push(CodecTiming {
            spec: spec.to_string(),
            encode_s_per_elem: cost.encode_s_per_elem,
            decode_s_per_elem: cost.decode_s_per_elem,
        });
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Calibration {
        format: FORMAT,
        codecs,
        loopback_alpha_s: stack.alpha,
        software_beta_s: stack.beta,
        gamma_s: stack.gamma,
        host: host_name(),
        gradwire_version: env!("CARGO_PKG_VERSION").to_string(),
        git_revision: git_revision.map(|r| r.chars().take(MAX_TEXT).collect()),
        date: utc_date(now),
    })
}

/// The calibration cached at `path`, or, when there is none, one measured now
/// ([`calibrate`]) and saved there. A cache that exists but cannot be read or is invalid is
/// an error (never remeasured over). Of several processes finding no cache at once, one
/// measures (holding `path` + `.lock`) and the others wait for its file, up to [`LOCK_WAIT`]
/// before taking an abandoned lock over.
pub fn cached(
    path: &Path,
    git_revision: Option<String>,
) -> Result<(Calibration, Source), CalibrateError> {
    let mut lock = path.as_os_str().to_owned();
    lock.push(".lock");
    let lock = PathBuf::from(lock);
    let start = Instant::now();
    loop {
        match Calibration::load(path) {
            Ok(c) => return Ok((c, Source::Read)),
            Err(e) if e.is_missing() => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| CalibrateError::Lock {
                path: lock.clone(),
                source,
            })?;
        }
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
        {
            Ok(_) => {
                let made = calibrate(git_revision).and_then(|c| {
                    c.save(path)?;
                    Ok(c)
                });
                let _ = std::fs::remove_file(&lock);
                return made.map(|c| (c, Source::Measured));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if start.elapsed() > LOCK_WAIT {
                    // Its holder stopped without removing it: take it over.
                    let _ = std::fs::remove_file(&lock);
                } else {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Err(source) => return Err(CalibrateError::Lock { path: lock, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_synthetic_gradient_is_deterministic_and_bounded() {
        let g = synthetic_gradient(10_000, 3);
        assert_eq!(g, synthetic_gradient(10_000, 3));
        assert_ne!(g, synthetic_gradient(10_000, 4));
        assert!(g.iter().all(|x| (-1.0..1.0).contains(x)));
        // Both signs, spread over the range.
        let mean = g.iter().map(|&x| f64::from(x)).sum::<f64>() / g.len() as f64;
        assert!(mean.abs() < 0.05, "{mean}");
    }

    #[test]
    fn a_calibration_is_measured_once_then_read_from_its_cache() {
        let dir = std::env::temp_dir().join(format!("gradwire-cal-{}", std::process::id()));
        let path = dir.join("c.json");
        let _ = std::fs::remove_file(&path);
        let t = Instant::now();
        let (made, src) = cached(&path, Some("abc".into())).unwrap();
        let took = t.elapsed();
        assert_eq!(src, Source::Measured);
        made.validate().unwrap();
        // Every codec auto knows but `none`, with a cost.
        assert_eq!(made.codecs.len(), KNOWN.len() - 1);
        assert!(made.codecs.iter().all(|c| c.encode_s_per_elem > 0.0));
        assert_eq!(made.git_revision.as_deref(), Some("abc"));
        // Debug builds are slower than the 3 s a release build takes on 2 cores at most.
        assert!(took < Duration::from_secs(60), "{took:?}");
        let (read, src) = cached(&path, None).unwrap();
        assert_eq!(src, Source::Read);
        // JSON keeps each number to within its last digit.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
        assert_eq!(read.git_revision.as_deref(), Some("abc"));
        assert_eq!((&read.host, &read.date), (&made.host, &made.date));
        assert!(close(read.loopback_alpha_s, made.loopback_alpha_s));
        for (r, m) in read.codecs.iter().zip(&made.codecs) {
            assert_eq!(r.spec, m.spec);
            assert!(
                close(r.encode_s_per_elem, m.encode_s_per_elem),
                "{r:?} {m:?}"
            );
            assert!(
                close(r.decode_s_per_elem, m.decode_s_per_elem),
                "{r:?} {m:?}"
            );
        }
        assert!(!dir.join("c.json.lock").exists());
        // An invalid cache is an error, not remeasured over.
        std::fs::write(&path, "{}").unwrap();
        assert!(matches!(
            cached(&path, None),
            Err(CalibrateError::File(CalibrationError::Parse { .. }))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
