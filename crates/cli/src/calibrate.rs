//! `gradwire calibrate`: measures this machine's costs for `--codec auto`
//! ([`gradwire_train::measure::calibrate`]) and writes them to the calibration cache
//! ([`gradwire_sim::auto::default_path`], or `--out`), printing what was measured.

use std::path::PathBuf;

use anyhow::Result;
use gradwire_sim::auto::Calibration;

/// Arguments of `gradwire calibrate`.
#[derive(clap::Args, Debug, Clone)]
pub struct CalibrateArgs {
    /// Write the calibration here [default: $GRADWIRE_CALIBRATION, else
    /// $XDG_CACHE_HOME/gradwire/calibration.json, else ~/.cache/gradwire/calibration.json].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print the calibration as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The build's git revision, unless unknown.
pub fn git_revision() -> Option<String> {
    Some(gradwire_run::GIT_REV.to_string()).filter(|r| r != "unknown")
}

/// Runs `gradwire calibrate`.
pub fn run(args: &CalibrateArgs) -> Result<()> {
    let path = match &args.out {
        Some(p) => p.clone(),
        None => gradwire_sim::auto::default_path()?,
    };
    let start = std::time::Instant::now();
    let c = gradwire_train::measure::calibrate(git_revision())?;
    c.save(&path)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print_table(&c);
        println!(
            "measured in {:.1} s, saved to {}",
            start.elapsed().as_secs_f64(),
            path.display()
        );
    }
    Ok(())
}

/// The calibration as a short table.
fn print_table(c: &Calibration) {
    println!(
        "{} (gradwire {}{}, {})",
        c.host,
        c.gradwire_version,
        c.git_revision
            .as_deref()
            .map(|r| format!(" at {r}"))
            .unwrap_or_default(),
        c.date
    );
    println!(
        "stack: alpha {:.1} us per message, beta {:.3} ns per byte ({:.2} GB/s), gamma {:.3} \
         ns per byte reduced",
        c.loopback_alpha_s * 1e6,
        c.software_beta_s * 1e9,
        1e-9 / c.software_beta_s.max(1e-15),
        c.gamma_s * 1e9
    );
    println!(
        "{:<18} {:>14} {:>14}",
        "codec", "encode ns/el", "decode ns/el"
    );
    for t in &c.codecs {
        println!(
            "{:<18} {:>14.3} {:>14.3}",
            t.spec,
            t.encode_s_per_elem * 1e9,
            t.decode_s_per_elem * 1e9
        );
    }
}
