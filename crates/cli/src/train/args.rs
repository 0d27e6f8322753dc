//! The flags of `gradwire train` ([`TrainArgs`], also its `--help` text): the job's settings
//! (`gradwire_job`'s, each also a key of `--config FILE.toml`) and how this process runs.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::Result;
use clap::Args;
use gradwire_job::{Host, Plan, Request};
use gradwire_sim::auto::Calibration;
use gradwire_train::measure::{cached, Source};

/// Arguments of `gradwire train` (each may also come from `--config FILE.toml`, same keys).
/// Values are parsed here, at the edge: a bad one is refused with the allowed values.
#[derive(Args, Debug, Clone, Default)]
pub struct TrainArgs {
    /// TOML file with any of these settings (flags given on the command line win).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// What to train and how.
    #[command(flatten)]
    pub run: gradwire_job::Settings,
    /// Run the workers as threads of this process instead of processes (`--transport
    /// local` does the same).
    #[arg(long)]
    pub threads_as_workers: bool,
    /// The transport between the ranks (help text: `join::TRANSPORT_HELP`).
    #[arg(long, value_enum, default_value = "auto", help = gradwire_run::join::TRANSPORT_HELP)]
    pub transport: gradwire_run::join::TransportKind,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Internal: this process is one rank started by the parent.
    #[arg(long, hide = true)]
    pub worker: bool,
    /// Parameter-server settings.
    #[command(flatten)]
    pub ps: gradwire_job::ps::PsSettings,
    /// Model-parallel settings.
    #[command(flatten)]
    pub mp: gradwire_job::model_parallel::MpSettings,
    /// Elastic settings.
    #[command(flatten)]
    pub elastic: gradwire_job::elastic::ElasticSettings,
}

impl TrainArgs {
    /// The settings given as flags, as the plan takes them.
    pub fn request(&self) -> Request<'_> {
        Request {
            settings: &self.run,
            ps: &self.ps,
            mp: &self.mp,
            elastic: &self.elastic,
        }
    }

    /// The validated plan: the flags over `--config`'s file over the defaults
    /// ([`Plan::new`]), this machine's calibration read (or made) only under `--codec auto`.
    pub fn plan(&self, host: Host) -> Result<Plan> {
        let host = Host {
            worker: self.worker,
            threads_as_workers: self.threads_as_workers,
            ..host
        };
        Ok(Plan::new(
            self.request(),
            self.config.as_deref(),
            host,
            &machine_calibration,
        )?)
    }
}

/// This machine's calibration for `--codec auto`, read once per process from its cache
/// (`gradwire_sim::auto::default_path`), or measured and saved there when there is none yet
/// (one line on stderr says so). A cache that cannot be read or is invalid is an error
/// naming the file.
fn machine_calibration() -> std::result::Result<Calibration, gradwire_train::measure::CalibrateError>
{
    static CALIBRATION: OnceLock<Calibration> = OnceLock::new();
    if let Some(c) = CALIBRATION.get() {
        return Ok(c.clone());
    }
    let path = gradwire_sim::auto::default_path()?;
    let start = std::time::Instant::now();
    let (c, source) = cached(&path, crate::calibrate::git_revision())?;
    if source == Source::Measured {
        eprintln!(
            "gradwire: no calibration of this machine yet: measured it in {:.1} s for --codec \
             auto and saved it to {} (`gradwire calibrate` measures again)",
            start.elapsed().as_secs_f64(),
            path.display()
        );
    }
    Ok(CALIBRATION.get_or_init(|| c).clone())
}
