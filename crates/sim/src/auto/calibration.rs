//! This machine's costs as `--codec auto` weighs them: a [`Calibration`], its JSON file and
//! where that file is cached.
//!
//! A calibration holds each candidate codec's encode and decode seconds per gradient element,
//! the software's per-message cost over loopback (`alpha`), its per-byte cost (`beta`, added
//! to any link's wire time) and the reduction cost (`gamma`), and where and when it was made
//! (host, gradwire version, git revision, date). `gradwire_train::measure::calibration`
//! measures one; nothing here is timed.
//!
//! The file is untrusted input: [`Calibration::load`] reads at most [`MAX_FILE_BYTES`], and
//! [`Calibration::validate`] refuses an unknown format, more than [`MAX_CODECS`] codecs, a
//! codec listed twice, text longer than [`MAX_TEXT`] characters and any cost that is not
//! finite or lies outside `0..=`[`MAX_COST_S`] seconds (per element, message or byte).

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file format this version writes and reads.
pub const FORMAT: u32 = 1;
/// The largest calibration file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 64 * 1024;
/// The most codecs one calibration lists.
pub const MAX_CODECS: usize = 64;
/// The longest text field (a spec, the host name, a version, a revision, the date).
pub const MAX_TEXT: usize = 256;
/// The largest cost accepted, in seconds (per element, per message or per byte): a second per
/// element or per byte is already absurd for any machine that trains.
pub const MAX_COST_S: f64 = 1.0;

/// One codec's measured cost per gradient element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CodecTiming {
    /// The codec spec (as `--auto-codecs` names it: `qsgd:bits=4`).
    pub spec: String,
    /// Encode seconds per element.
    pub encode_s_per_elem: f64,
    /// Decode (`decode_add`) seconds per element.
    pub decode_s_per_elem: f64,
}

/// The costs `--codec auto` predicts with, measured on one machine, and where they come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The file format ([`FORMAT`]).
    pub format: u32,
    /// Each codec's encode and decode cost per element.
    pub codecs: Vec<CodecTiming>,
    /// Seconds per message over loopback without emulation: the software's per-message cost.
    pub loopback_alpha_s: f64,
    /// Seconds per byte of software copies, added to any link's wire time.
    pub software_beta_s: f64,
    /// Seconds per byte reduced (f32 adds).
    pub gamma_s: f64,
    /// The host it was measured on.
    pub host: String,
    /// The gradwire version that measured it.
    pub gradwire_version: String,
    /// The git revision that gradwire was built from, where known.
    pub git_revision: Option<String>,
    /// When it was measured, UTC (`2026-12-06T06:30:00Z`).
    pub date: String,
}

/// What is wrong inside a calibration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Invalid {
    /// A format this version does not read.
    #[error("format {0}, this gradwire reads format {FORMAT}")]
    Format(u32),
    /// Too many codecs.
    #[error("{0} codecs, at most {MAX_CODECS}")]
    TooManyCodecs(usize),
    /// A codec listed twice.
    #[error("codec {0:?} is listed twice")]
    Duplicate(String),
    /// A text field too long (`what` names it).
    #[error("{what} is longer than {MAX_TEXT} characters")]
    TooLong {
        /// Which field.
        what: &'static str,
    },
    /// A cost that is not finite or lies outside `0..=MAX_COST_S`.
    #[error("{what} is {value}, not between 0 and {MAX_COST_S} seconds")]
    Cost {
        /// Which cost (`fp16 encode_s_per_elem`, `gamma_s`).
        what: String,
        /// Its value.
        value: f64,
    },
}

/// Why a calibration file cannot be read or written, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// Opening or reading the file failed.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// Writing the file (or making its folder) failed.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_FILE_BYTES`].
    #[error("{}: larger than a calibration's {MAX_FILE_BYTES} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a calibration's JSON.
    #[error("{}: not a calibration: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: serde_json::Error,
    },
    /// The file parses but holds values refused ([`Calibration::validate`]).
    #[error("{}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: Invalid,
    },
    /// No cache path: neither `GRADWIRE_CALIBRATION`, `XDG_CACHE_HOME` nor `HOME` is set.
    #[error("no calibration path: set GRADWIRE_CALIBRATION, XDG_CACHE_HOME or HOME")]
    NoPath,
}

impl Calibration {
    /// A fixed, hand-written calibration (four ranks sharing the two cores of a 2-core
    /// machine, as measured there once), for tests and examples whose choices must not
    /// depend on the machine they run on.
    pub fn two_core_example() -> Calibration {
        let t = |spec: &str, e, d| CodecTiming {
            spec: spec.into(),
            encode_s_per_elem: e,
            decode_s_per_elem: d,
        };
        Calibration {
            format: FORMAT,
            codecs: vec![
                t("fp16", 6.4e-9, 1.9e-8),
                t("qsgd:bits=4", 7.2e-9, 3.45e-9),
                t("terngrad", 2.1e-8, 6.8e-9),
                t("onebit", 7.0e-9, 3.65e-9),
                t("topk:ratio=0.01", 1.26e-8, 5.1e-10),
            ],
            loopback_alpha_s: 4.4e-6,
            software_beta_s: 1.0e-9,
            gamma_s: 1.0e-9,
            host: "example".into(),
            gradwire_version: "0.0.0".into(),
            git_revision: None,
            date: "2026-12-06T00:00:00Z".into(),
        }
    }

    /// The timing of the codec `spec`, compared as written (callers pass canonical specs).
    pub fn codec(&self, spec: &str) -> Option<&CodecTiming> {
        self.codecs.iter().find(|c| c.spec == spec)
    }

    /// Checks every value against the bounds of the module doc.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.format != FORMAT {
            return Err(Invalid::Format(self.format));
        }
        if self.codecs.len() > MAX_CODECS {
            return Err(Invalid::TooManyCodecs(self.codecs.len()));
        }
        let text = |what, s: &str| {
            if s.chars().count() > MAX_TEXT {
                Err(Invalid::TooLong { what })
            } else {
                Ok(())
            }
        };
        text("host", &self.host)?;
        text("gradwire_version", &self.gradwire_version)?;
        text("git_revision", self.git_revision.as_deref().unwrap_or(""))?;
        text("date", &self.date)?;
        let cost = |what: String, value: f64| {
            if value.is_finite() && (0.0..=MAX_COST_S).contains(&value) {
                Ok(())
            } else {
                Err(Invalid::Cost { what, value })
            }
        };
        for (i, c) in self.codecs.iter().enumerate() {
            text("a codec spec", &c.spec)?;
            if self.codecs[..i].iter().any(|o| o.spec == c.spec) {
                return Err(Invalid::Duplicate(c.spec.clone()));
            }
            cost(format!("{} encode_s_per_elem", c.spec), c.encode_s_per_elem)?;
            cost(format!("{} decode_s_per_elem", c.spec), c.decode_s_per_elem)?;
        }
        cost("loopback_alpha_s".into(), self.loopback_alpha_s)?;
        cost("software_beta_s".into(), self.software_beta_s)?;
        cost("gamma_s".into(), self.gamma_s)?;
        Ok(())
    }

    /// Parses and validates a calibration's JSON; `path` only names the source in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<Calibration, CalibrationError> {
        let c: Calibration =
            serde_json::from_str(text).map_err(|source| CalibrationError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        c.validate().map_err(|reason| CalibrationError::Invalid {
            path: path.to_path_buf(),
            reason,
        })?;
        Ok(c)
    }

    /// Reads and validates the calibration at `path` (at most [`MAX_FILE_BYTES`]). A missing
    /// file is a [`CalibrationError::Read`] whose source is `NotFound`
    /// ([`CalibrationError::is_missing`]).
    pub fn load(path: &Path) -> Result<Calibration, CalibrationError> {
        let read = |source| CalibrationError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read)?;
        let mut text = String::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(read)?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(CalibrationError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        Calibration::from_json(&text, path)
    }

    /// Validates and writes the calibration to `path` as pretty JSON, making its folder; the
    /// file is written beside `path` and renamed over it, so a reader never sees half of it.
    pub fn save(&self, path: &Path) -> Result<(), CalibrationError> {
        self.validate()
            .map_err(|reason| CalibrationError::Invalid {
                path: path.to_path_buf(),
                reason,
            })?;
        let write = |source| CalibrationError::Write {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(write)?;
        }
        let json = serde_json::to_string_pretty(self).map_err(|e| write(e.into()))? + "\n";
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, json).map_err(write)?;
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            write(e)
        })
    }
}

impl CalibrationError {
    /// Whether the file does not exist (no calibration made yet).
    pub fn is_missing(&self) -> bool {
        matches!(self, CalibrationError::Read { source, .. }
            if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// The calibration cache's path: `$GRADWIRE_CALIBRATION` if set, else
/// `$XDG_CACHE_HOME/gradwire/calibration.json`, else `~/.cache/gradwire/calibration.json`.
pub fn default_path() -> Result<PathBuf, CalibrationError> {
    path_from(|k| std::env::var_os(k))
}

/// [`default_path`] with the environment read through `var` (empty values count as unset).
pub fn path_from(
    var: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<PathBuf, CalibrationError> {
    let var = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = var("GRADWIRE_CALIBRATION") {
        return Ok(p);
    }
    let cache = match var("XDG_CACHE_HOME") {
        Some(c) => c,
        None => var("HOME").ok_or(CalibrationError::NoPath)?.join(".cache"),
    };
    Ok(cache.join("gradwire").join("calibration.json"))
}

/// A UTC date and time, `YYYY-MM-DDTHH:MM:SSZ`, of `unix_s` seconds since 1970.
pub fn utc_date(unix_s: u64) -> String {
    let (days, rem) = (unix_s / 86_400, unix_s % 86_400);
    // Civil from days (Howard Hinnant's algorithm), in u64 since dates before 1970 never
    // come up.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
