//! `gradwire report`: train one model with each codec in turn and write the comparison:
//! a Markdown table (final accuracy or perplexity, difference from dense, bytes per step,
//! compression ratio, time) and one plot of quality against bytes per step.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::records::RunRecord;

/// Arguments of `gradwire report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Model: mlp, lenet, resnet, lstm.
    #[arg(long, default_value = "lenet")]
    model: String,
    /// Data set (default: fashion-mnist, or shakespeare for lstm).
    #[arg(long)]
    dataset: Option<String>,
    /// Codecs to compare, comma-separated names or specs. A bare name takes the setting of
    /// its paper's headline result: topk = topk:ratio=0.01, qsgd = qsgd:bits=4,
    /// dgc = dgc:ratio=0.001, threshold = threshold:tau=0.005; adaptive runs with its
    /// paper defaults (Dryden: pi = 1/64, per column).
    /// Specs with parameters may be listed too: `topk:ratio=0.001,qsgd:bits=2,bucket=128,dgc`
    /// (a `key=value` piece belongs to the codec before it).
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
    /// Keep the runs already in `--out` whose `run.json` has all `--epochs` epochs (to resume
    /// an interrupted matrix, or to redo one codec after deleting its directory).
    #[arg(long)]
    resume: bool,
    /// Record each run's timeline (`<run>/timeline.json`, every rank's spans merged) and
    /// draw one step of it (`<run>/timeline.png`), shown in report.md. A run directory that
    /// already has a `timeline.json` (e.g. kept with `--resume`) gets its drawing too.
    #[arg(long)]
    timeline: bool,
    /// Further `gradwire train` arguments for every run (e.g. `--max-steps 200 --lr 0.05`).
    #[arg(last = true)]
    train_args: Vec<String>,
}

/// The spec a bare codec name stands for in a report.
pub fn preset(name: &str) -> String {
    match name.trim() {
        "topk" => "topk:ratio=0.01".into(),
        "qsgd" => "qsgd:bits=4".into(),
        "dgc" => "dgc:ratio=0.001".into(),
        "threshold" => "threshold:tau=0.005".into(),
        other => other.into(),
    }
}

/// Runs the matrix and writes the report.
pub fn run(args: &ReportArgs) -> Result<()> {
    let codecs = split_codecs(&args.codecs);
    if codecs.is_empty() {
        bail!("--codecs is empty");
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
    let mut runs = Vec::new();
    let mut dirs = Vec::new();
    for (i, name) in codecs.iter().enumerate() {
        let spec = preset(name);
        let spec_parsed: gradwire_codec::CodecConfig =
            spec.parse().with_context(|| format!("codec '{spec}'"))?;
        let dir = args.out.join(sanitize(&spec_parsed.to_string()));
        if args.resume {
            if let Some(run) = finished_run(&dir, args.epochs) {
                eprintln!(
                    "gradwire report: [{}/{}] {spec_parsed}: kept the finished run in {}",
                    i + 1,
                    codecs.len(),
                    dir.display()
                );
                runs.push(run);
                dirs.push(dir);
                continue;
            }
        }
        eprintln!(
            "gradwire report: [{}/{}] {spec_parsed}",
            i + 1,
            codecs.len()
        );
        let mut cmd = Command::new(&exe);
        cmd.args(["train", "--model", &args.model, "--codec", &spec, "--quiet"])
            .arg("--workers")
            .arg(args.workers.to_string())
            .arg("--epochs")
            .arg(args.epochs.to_string())
            .arg("--out")
            .arg(&dir)
            .args(&args.train_args);
        if args.timeline {
            cmd.arg("--timeline").arg(dir.join(TIMELINE_JSON));
        }
        if let Some(d) = &args.dataset {
            cmd.args(["--dataset", d]);
        }
        let status = cmd
            .status()
            .with_context(|| format!("running gradwire train for {spec}"))?;
        if !status.success() {
            bail!("training with codec {spec} failed ({status})");
        }
        let run: RunRecord = serde_json::from_str(
            &std::fs::read_to_string(dir.join("run.json"))
                .with_context(|| format!("reading {}/run.json", dir.display()))?,
        )?;
        runs.push(run);
        dirs.push(dir);
    }
    let baseline = preset(&args.baseline)
        .parse::<gradwire_codec::CodecConfig>()
        .map(|c| c.to_string())?;
    let command = std::env::args()
        .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
        .collect::<Vec<_>>()
        .join(" ");
    let command = command.replacen(&exe.display().to_string(), "gradwire", 1);
    let mut md = crate::report_render::render_markdown(&runs, &baseline, &command);
    md.push_str(&timeline_section(&runs, &dirs));
    let md_path = args.out.join("report.md");
    std::fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    if let Err(e) = crate::plot::plot_comparison(&runs, &args.out.join(crate::plot::COMPARISON_PNG))
    {
        eprintln!("gradwire report: warning: comparison chart not drawn ({e:#})");
    }
    std::fs::write(
        args.out.join("runs.json"),
        serde_json::to_string_pretty(&runs)? + "\n",
    )?;
    println!("{md}");
    eprintln!("gradwire report: wrote {}", md_path.display());
    Ok(())
}

/// Where a run's merged timeline is, in its directory (`--timeline`).
const TIMELINE_JSON: &str = "timeline.json";

/// One step of each run's timeline, for report.md: drawn (`timeline.png` next to
/// `timeline.json`) where a run has a timeline and no drawing yet; empty when no run has one.
fn timeline_section(runs: &[RunRecord], dirs: &[PathBuf]) -> String {
    let mut out = String::new();
    for (run, dir) in runs.iter().zip(dirs) {
        let json = dir.join(TIMELINE_JSON);
        if !json.is_file() {
            continue;
        }
        let png = json.with_extension("png");
        if !png.is_file() {
            if let Err(e) = crate::plot_timeline::plot_step(&json, &png) {
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
        let sub = dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        out.push_str(&format!("![{}]({sub}/timeline.png)\n\n", run.codec));
    }
    out
}

/// The run recorded in `dir`, if it finished all `epochs`.
fn finished_run(dir: &std::path::Path, epochs: usize) -> Option<RunRecord> {
    let text = std::fs::read_to_string(dir.join("run.json")).ok()?;
    let run: RunRecord = serde_json::from_str(&text).ok()?;
    (run.epochs.len() == epochs).then_some(run)
}

/// Splits a comma-separated codec list in which specs may carry their own `key=value`
/// parameters: a piece with `=` but no `:` continues the spec before it.
pub fn split_codecs(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for piece in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match out.last_mut() {
            Some(prev) if piece.contains('=') && !piece.contains(':') => {
                prev.push(',');
                prev.push_str(piece);
            }
            _ => out.push(piece.to_string()),
        }
    }
    out
}

fn sanitize(spec: &str) -> String {
    spec.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::tests::{sample_run, scratch_dir};

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
        let md = timeline_section(&runs, &[with.clone(), without.clone()]);
        assert!(with.join("timeline.png").is_file(), "no drawing made");
        assert!(md.contains("](none/timeline.png)"), "{md}");
        assert!(!md.contains("topk/timeline.png"), "{md}");
        assert_eq!(timeline_section(&runs[1..], &[without]), "");
    }

    #[test]
    fn resume_keeps_only_finished_runs() {
        let dir = scratch_dir("resume");
        assert!(finished_run(&dir, 3).is_none(), "no run.json yet");
        let run = sample_run("topk:ratio=0.01", &[0.5, 0.6, 0.7], 1000);
        std::fs::write(dir.join("run.json"), serde_json::to_string(&run).unwrap()).unwrap();
        assert_eq!(finished_run(&dir, 3).map(|r| r.epochs.len()), Some(3));
        assert!(finished_run(&dir, 5).is_none(), "a shorter run is redone");
        std::fs::write(dir.join("run.json"), "{ truncated").unwrap();
        assert!(
            finished_run(&dir, 3).is_none(),
            "a broken run.json is redone"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn codec_lists_keep_their_parameters() {
        assert_eq!(
            split_codecs("none, topk:ratio=0.01,qsgd:bits=4,bucket=512,dgc"),
            vec!["none", "topk:ratio=0.01", "qsgd:bits=4,bucket=512", "dgc"]
        );
        assert!(split_codecs(" , ").is_empty());
        assert_eq!(preset("qsgd"), "qsgd:bits=4");
        assert_eq!(preset("qsgd:bits=2"), "qsgd:bits=2");
    }
}
