//! `gradwire report`: train one model with each codec in turn and write the comparison:
//! a Markdown table (final accuracy or perplexity, difference from dense, bytes per step,
//! compression ratio, time, time to a target accuracy and the speedup it gives) and one plot
//! of quality against bytes per step. With `--link`, the matrix runs once per emulated link
//! speed and the report adds time to accuracy against link speed, with the speed above which
//! dense wins, and its chart.
//!
//! The command alone is here: its arguments, the `gradwire train` processes, the files and
//! the charts. The matrix of runs, the records, time to accuracy and the Markdown are
//! `gradwire_run::report`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

pub use gradwire_run::report::matrix::split_codecs;
use gradwire_run::report::matrix::{finished_run, plan_jobs, preset, Variant, MC_ONLY, RUN_JSON};
use gradwire_run::report::records::{read_run, RunRecord};
use gradwire_run::report::render::{render_markdown, COMPARISON_PNG, TIME_TO_ACCURACY_PNG};

/// Arguments of `gradwire report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Model: mlp, lenet, resnet, lstm, or a spec with options (mlp:hidden=1024x2,
    /// lstm:hidden=128).
    #[arg(long, default_value = "lenet")]
    model: String,
    /// Data set (default: fashion-mnist, or shakespeare for lstm).
    #[arg(long)]
    dataset: Option<String>,
    /// Codecs to compare, comma-separated names or specs. A bare name takes the setting of
    /// its paper's headline result: topk = topk:ratio=0.01, qsgd = qsgd:bits=4,
    /// dgc = dgc:ratio=0.001, threshold = threshold:tau=0.005; adaptive runs with its
    /// paper defaults (Dryden: pi = 1/64, per column); `auto` is train's `--codec auto`
    /// (a codec per tensor from the cost model; no `mc` row).
    /// Specs with parameters may be listed too: `topk:ratio=0.001,qsgd:bits=2,bucket=128,dgc`
    /// (a `key=value` piece belongs to the codec before it). `SPEC+mc` runs only SPEC's
    /// `mc` row, whatever `--variants` says (e.g. `--codecs none,topk,topk:warmup_epochs=4+mc
    /// --variants paper`).
    #[arg(
        long,
        default_value = "none,fp16,onebit,threshold,adaptive,topk,qsgd,terngrad,dgc"
    )]
    codecs: String,
    /// Workers per run.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Epochs per run.
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// Output directory (one sub-directory per codec, report.md and comparison.png).
    #[arg(long, default_value = "out/report")]
    out: PathBuf,
    /// The codec the differences are measured against.
    #[arg(long, default_value = "none")]
    baseline: String,
    /// Seeds, comma-separated: each codec runs once per seed, and the report gives the mean
    /// and the spread (lowest to highest) over them. The runs go seed by seed (every codec
    /// with the first seed, then every codec with the next), so that codecs compared in
    /// time run close together. Without it, one run with train's default seed.
    #[arg(long, value_delimiter = ',')]
    seeds: Vec<u64>,
    /// Rows per codec, comma-separated: `paper` (the codec as its paper specifies it) and
    /// `mc` (the same codec with `--momentum-correction on`, DGC's momentum correction as a
    /// gradwire option). `mc` rows are left out for `none` (momentum correction is then the
    /// same as momentum SGD), for `dgc` (its paper already includes it) and for `auto` (which
    /// mixes codecs per tensor).
    #[arg(long, value_delimiter = ',', default_value = "paper")]
    variants: Vec<Variant>,
    /// Keep the runs already in `--out` whose `run.json` has all `--epochs` epochs (to resume
    /// an interrupted matrix, or to redo one codec after deleting its directory).
    #[arg(long)]
    resume: bool,
    /// Record each run's timeline (`<run>/timeline.json`, every rank's spans merged) and
    /// draw one step of it (`<run>/timeline.png`), shown in report.md. A run directory that
    /// already has a `timeline.json` (e.g. kept with `--resume`) gets its drawing too.
    #[arg(long)]
    timeline: bool,
    /// Train every run over an emulated link (train's `--link`), e.g. `--link 1gbit,50us`.
    /// Repeat it to run the whole matrix at several speeds (`--link 100mbit --link 1gbit
    /// --link none`; `none` is loopback without emulation): each speed gets its own table and
    /// sub-directory, and the report adds time to target against link speed, the speed above
    /// which the baseline wins, and `time-to-accuracy.png`.
    #[arg(long = "link", value_name = "SPEC")]
    links: Vec<String>,
    /// The accuracy in percent (perplexity for a language model) that "time to target"
    /// measures. Default: the baseline's mean final accuracy minus 0.5 points (its
    /// perplexity plus 2%). Checked at the end of each epoch: `-- --max-steps N` makes epochs
    /// of N steps, for a finer grain.
    #[arg(long)]
    target: Option<f64>,
    /// Further `gradwire train` arguments for every run (e.g. `--max-steps 200 --lr 0.05`).
    #[arg(last = true)]
    train_args: Vec<String>,
}

/// Runs the matrix and writes the report.
///
/// Longer than 120 lines on purpose: the command's steps run in order (plan the matrix, run
/// each `gradwire train` process or reuse its finished run, gather the records, write the
/// Markdown and the charts); the matrix, the records and the Markdown are
/// `gradwire_run::report`.
pub fn run(args: &ReportArgs) -> Result<()> {
    let codecs = split_codecs(&args.codecs);
    if codecs.is_empty() {
        bail!("--codecs is empty");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
    let parsed = codecs
        .iter()
        .map(|name| {
            // `SPEC+mc`: only that codec's momentum-corrected row (kept through parsing).
            let (name, suffix) = match name.strip_suffix(MC_ONLY) {
                Some(n) => (n, MC_ONLY),
                None => (name.as_str(), ""),
            };
            let spec = preset(name);
            if spec.eq_ignore_ascii_case("auto") {
                if !suffix.is_empty() {
                    bail!("codec '{name}{suffix}': auto has no momentum-corrected row");
                }
                // train's --codec auto: a codec per tensor, chosen by the cost model.
                return Ok("auto".to_string());
            }
            spec.parse::<gradwire_codec::CodecConfig>()
                .map(|c| format!("{c}{suffix}"))
                .with_context(|| format!("codec '{spec}'"))
        })
        .collect::<Result<Vec<_>>>()?;
    if args.variants.is_empty() {
        bail!("--variants is empty");
    }
    for link in &args.links {
        if !link.eq_ignore_ascii_case("none") {
            link.parse::<gradwire_transport::link::LinkConfig>()
                .with_context(|| format!("--link {link}"))?;
        }
    }
    if !args.links.is_empty() && args.train_args.iter().any(|a| a.starts_with("--link")) {
        bail!("give the link with report's own --link, not among the train arguments");
    }
    let jobs = plan_jobs(&parsed, &args.variants, &args.seeds, &args.links, &args.out);
    let mut runs = Vec::new();
    let mut dirs = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let label = format!(
            "[{}/{}] {}{}{}",
            i + 1,
            jobs.len(),
            job.spec,
            if job.variant == Variant::Mc {
                " +momentum correction"
            } else {
                ""
            },
            job.seed.map_or(String::new(), |s| format!(", seed {s}"))
        ) + &job
            .link
            .as_ref()
            .map_or(String::new(), |l| format!(", link {l}"));
        if args.resume {
            if let Some(run) = finished_run(&job.dir, args.epochs) {
                eprintln!(
                    "gradwire report: {label}: kept the finished run in {}",
                    job.dir.display()
                );
                runs.push(run);
                dirs.push(job.dir.clone());
                continue;
            }
        }
        eprintln!("gradwire report: {label}");
        let mut cmd = Command::new(&exe);
        cmd.args([
            "train",
            "--model",
            &args.model,
            "--codec",
            &job.spec,
            "--quiet",
        ])
        .arg("--workers")
        .arg(args.workers.to_string())
        .arg("--epochs")
        .arg(args.epochs.to_string())
        .arg("--out")
        .arg(&job.dir);
        if let Some(seed) = job.seed {
            cmd.arg("--seed").arg(seed.to_string());
        }
        if job.variant == Variant::Mc {
            cmd.args(["--momentum-correction", "on"]);
        }
        if let Some(link) = &job.link {
            cmd.arg("--link").arg(link);
        }
        cmd.args(&args.train_args);
        if args.timeline {
            cmd.arg("--timeline").arg(job.dir.join(TIMELINE_JSON));
        }
        if let Some(d) = &args.dataset {
            cmd.args(["--dataset", d]);
        }
        let status = cmd
            .status()
            .with_context(|| format!("running gradwire train for {label}"))?;
        if !status.success() {
            bail!("training {label} failed ({status})");
        }
        let run = read_run(&job.dir.join(RUN_JSON))?;
        runs.push(run);
        dirs.push(job.dir.clone());
    }
    let baseline = preset(&args.baseline)
        .parse::<gradwire_codec::CodecConfig>()
        .map(|c| c.to_string())?;
    let command = std::env::args()
        .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
        .collect::<Vec<_>>()
        .join(" ");
    let command = command.replacen(&exe.display().to_string(), "gradwire", 1);
    let mut md = render_markdown(&runs, &baseline, &command, args.target);
    md.push_str(&timeline_section(&runs, &dirs, &args.out));
    let md_path = args.out.join("report.md");
    std::fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    if let Err(e) = gradwire_job::plot::plot_comparison(&runs, &args.out.join(COMPARISON_PNG)) {
        eprintln!("gradwire report: warning: comparison chart not drawn ({e:#})");
    }
    if !args.links.is_empty() {
        if let Err(e) = time_to_accuracy_chart(&runs, &baseline, args.target, &args.out) {
            eprintln!("gradwire report: warning: time-to-accuracy chart not drawn ({e:#})");
        }
    }
    std::fs::write(
        args.out.join("runs.json"),
        serde_json::to_string_pretty(&runs)? + "\n",
    )?;
    println!("{md}");
    eprintln!("gradwire report: wrote {}", md_path.display());
    Ok(())
}

/// Draws `time-to-accuracy.png`: per codec row, training time to the target against the
/// emulated link speed (runs without emulation and runs that missed the target are left
/// out).
fn time_to_accuracy_chart(
    runs: &[RunRecord],
    baseline: &str,
    target: Option<f64>,
    out: &Path,
) -> Result<()> {
    let Some((target, series)) = gradwire_run::report::tta::time_series(runs, baseline, target)
    else {
        bail!("no baseline run and no --target, so no target to time");
    };
    Ok(gradwire_job::plot::plot_time_to_accuracy(
        series,
        &target.label(),
        &out.join(TIME_TO_ACCURACY_PNG),
    )?)
}

/// Where a run's merged timeline is, in its directory (`--timeline`).
const TIMELINE_JSON: &str = "timeline.json";

/// One step of each run's timeline, for report.md: drawn (`timeline.png` next to
/// `timeline.json`) where a run has a timeline and no drawing yet; empty when no run has one.
fn timeline_section(runs: &[RunRecord], dirs: &[PathBuf], out_dir: &Path) -> String {
    let mut out = String::new();
    for (run, dir) in runs.iter().zip(dirs) {
        let json = dir.join(TIMELINE_JSON);
        if !json.is_file() {
            continue;
        }
        let png = json.with_extension("png");
        if !png.is_file() {
            if let Err(e) = gradwire_job::plot::plot_step(&json, &png) {
                eprintln!(
                    "gradwire report: warning: timeline of {} not drawn ({e:#})",
                    dir.display()
                );
                continue;
            }
        }
        if out.is_empty() {
            out.push_str("\n## One step of each run's timeline\n\n");
        }
        // Relative to report.md (a seed's run sits one level deeper).
        let sub = dir
            .strip_prefix(out_dir)
            .unwrap_or(dir)
            .display()
            .to_string();
        let label = match run.seed {
            Some(s) => format!("{}, seed {s}", run.codec),
            None => run.codec.clone(),
        };
        out.push_str(&format!("![{label}]({sub}/timeline.png)\n\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_run::report::records::testing::{sample_run, scratch_dir};

    #[test]
    fn a_run_with_a_timeline_gets_its_step_drawn_and_shown() {
        use gradwire_engine::{Phase, Span};
        let out = scratch_dir("timeline-section");
        let (with, without) = (out.join("none"), out.join("topk"));
        std::fs::create_dir_all(&with).unwrap();
        std::fs::create_dir_all(&without).unwrap();
        let span = |phase, start_us, end_us| Span {
            tensor: "step".into(),
            phase,
            rank: 0,
            start_us,
            end_us,
        };
        let spans = [
            span(Phase::Forward, 0, 50),
            span(Phase::Backward, 50, 120),
            span(Phase::Wire, 120, 180),
            span(Phase::Update, 180, 200),
            span(Phase::Forward, 200, 250),
        ];
        gradwire_engine::timeline::write_trace(&with.join(TIMELINE_JSON), 0, &spans).unwrap();
        let runs = [
            sample_run("none", &[0.8], 1000),
            sample_run("topk:ratio=0.01", &[0.7], 100),
        ];
        let md = timeline_section(&runs, &[with.clone(), without.clone()], &out);
        assert!(with.join("timeline.png").is_file(), "no drawing made");
        assert!(md.contains("](none/timeline.png)"), "{md}");
        assert!(!md.contains("topk/timeline.png"), "{md}");
        assert_eq!(timeline_section(&runs[1..], &[without], &out), "");
    }
}
