//! The matrix of `gradwire report`: which training runs it makes (codec × row kind × seed ×
//! link), in which order, and in which directories; the codec lists and presets it reads.

use std::path::{Path, PathBuf};

use super::records::{read_run, RunRecord};

/// Where a run's record is, in its directory (what train's `--out` writes).
pub const RUN_JSON: &str = "run.json";

/// One row kind of the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Variant {
    /// The codec with its paper's defaults.
    Paper,
    /// The codec with `--momentum-correction on`.
    Mc,
}

/// One training run of the matrix: a codec, a row kind and a seed.
#[derive(Debug, PartialEq)]
pub struct Job {
    /// The codec spec given to train's `--codec`.
    pub spec: String,
    /// The row kind.
    pub variant: Variant,
    /// train's `--seed`, if the matrix has seeds.
    pub seed: Option<u64>,
    /// train's `--link`, if the run is over an emulated link.
    pub link: Option<String>,
    /// The run's directory (train's `--out`).
    pub dir: PathBuf,
}

/// The runs of the matrix, link-major, then seed-major (each seed runs every codec in the
/// order given before the next seed starts, so that runs compared in time sit close
/// together on a machine whose speed drifts), then codec-major; `mc` rows are skipped
/// where momentum correction is not an option distinct from the paper's algorithm.
/// Without links the runs sit directly in `out`; with links each has its own
/// `out/link-<spec>` (`none`: no emulation).
pub fn plan_jobs(
    codecs: &[String],
    variants: &[Variant],
    seeds: &[u64],
    links: &[String],
    out: &Path,
) -> Vec<Job> {
    if links.is_empty() {
        return plan_link(codecs, variants, seeds, None, out);
    }
    let mut jobs = Vec::new();
    for link in links {
        let dir = out.join(format!("link-{}", sanitize(link)));
        let link = (!link.eq_ignore_ascii_case("none")).then(|| link.clone());
        jobs.extend(plan_link(codecs, variants, seeds, link, &dir));
    }
    jobs
}

/// The runs of one link.
fn plan_link(
    codecs: &[String],
    variants: &[Variant],
    seeds: &[u64],
    link: Option<String>,
    out: &Path,
) -> Vec<Job> {
    let seeds: Vec<Option<u64>> = if seeds.is_empty() {
        vec![None]
    } else {
        seeds.iter().copied().map(Some).collect()
    };
    let mut jobs = Vec::new();
    for &seed in &seeds {
        for name in codecs {
            // `SPEC+mc` runs only the momentum-corrected row of SPEC, whatever `variants` says.
            let (name, only) = match name.strip_suffix(MC_ONLY) {
                Some(n) => (n, Some(Variant::Mc)),
                None => (name.as_str(), None),
            };
            let family = name.split(':').next().unwrap_or_default();
            let rows: &[Variant] = match &only {
                Some(v) => std::slice::from_ref(v),
                None => variants,
            };
            for &variant in rows {
                if variant == Variant::Mc && matches!(family, "none" | "dgc" | "auto") {
                    continue;
                }
                let dir = match variant {
                    Variant::Mc => out.join(format!("{}+mc", sanitize(name))),
                    Variant::Paper => out.join(sanitize(name)),
                };
                let dir = match seed {
                    Some(s) => dir.join(format!("seed-{s}")),
                    None => dir,
                };
                jobs.push(Job {
                    spec: name.to_string(),
                    variant,
                    seed,
                    link: link.clone(),
                    dir,
                });
            }
        }
    }
    jobs
}

/// The suffix of a `--codecs` entry that runs only its momentum-corrected row.
pub const MC_ONLY: &str = "+mc";

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

/// The run recorded in `dir`, if it finished all `epochs`.
pub fn finished_run(dir: &Path, epochs: usize) -> Option<RunRecord> {
    let run = read_run(&dir.join(RUN_JSON)).ok()?;
    (run.epochs.len() == epochs).then_some(run)
}

/// Splits a comma-separated codec list in which specs may carry their own `key=value`
/// parameters: a piece with `=` but no `:` continues the spec before it
/// ([`gradwire_codec::bench::split_specs`]).
pub use gradwire_codec::bench::split_specs as split_codecs;

/// A codec spec as a directory name: characters other than ASCII letters, digits, `.` and
/// `-` become `_`.
pub fn sanitize(spec: &str) -> String {
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
    use super::super::records::testing::{sample_run, scratch_dir};
    use super::*;

    #[test]
    fn the_matrix_skips_mc_rows_that_equal_the_paper_and_nests_seeds() {
        let codecs: Vec<String> = ["none", "dgc:ratio=0.001", "qsgd:bits=4"]
            .iter()
            .map(|c| {
                c.parse::<gradwire_codec::CodecConfig>()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let out = Path::new("o");
        let jobs = plan_jobs(&codecs, &[Variant::Paper, Variant::Mc], &[1, 2], &[], out);
        let got: Vec<(String, Variant, Option<u64>)> = jobs
            .iter()
            .map(|j| (j.spec.clone(), j.variant, j.seed))
            .collect();
        let qsgd = codecs[2].clone();
        let dgc = codecs[1].clone();
        // Seed-major: every codec of seed 1, then every codec of seed 2.
        let want = vec![
            ("none".to_string(), Variant::Paper, Some(1)),
            (dgc.clone(), Variant::Paper, Some(1)),
            (qsgd.clone(), Variant::Paper, Some(1)),
            (qsgd.clone(), Variant::Mc, Some(1)),
            ("none".to_string(), Variant::Paper, Some(2)),
            (dgc, Variant::Paper, Some(2)),
            (qsgd.clone(), Variant::Paper, Some(2)),
            (qsgd, Variant::Mc, Some(2)),
        ];
        assert_eq!(got, want);
        // Every run has its own directory.
        let mut dirs: Vec<_> = jobs.iter().map(|j| j.dir.clone()).collect();
        dirs.sort();
        dirs.dedup();
        assert_eq!(dirs.len(), jobs.len());
        let qsgd_mc = out.join(format!("{}+mc", sanitize(&codecs[2])));
        assert_eq!(jobs[3].dir, qsgd_mc.join("seed-1"));
        // Without seeds: one run per row, in the row's directory.
        let single = plan_jobs(&codecs[..1], &[Variant::Paper], &[], &[], out);
        assert_eq!(single.len(), 1);
        assert_eq!(single[0].seed, None);
        assert_eq!(single[0].dir, out.join("none"));
        // `auto` gets no momentum-correction row.
        let auto = plan_jobs(
            &["auto".to_string()],
            &[Variant::Paper, Variant::Mc],
            &[],
            &[],
            out,
        );
        assert_eq!(auto.len(), 1);
        assert_eq!(auto[0].spec, "auto");
        // `SPEC+mc`: only the momentum-corrected row of SPEC, whatever the variants; the
        // other codecs keep theirs.
        let mc_only = format!("{qsgd}+mc", qsgd = codecs[2]);
        let rows = plan_jobs(
            &[codecs[0].clone(), codecs[2].clone(), mc_only],
            &[Variant::Paper],
            &[],
            &[],
            out,
        );
        let got: Vec<(&str, Variant, &Path)> = rows
            .iter()
            .map(|j| (j.spec.as_str(), j.variant, j.dir.as_path()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("none", Variant::Paper, out.join("none").as_path()),
                (
                    codecs[2].as_str(),
                    Variant::Paper,
                    out.join(sanitize(&codecs[2])).as_path()
                ),
                (codecs[2].as_str(), Variant::Mc, qsgd_mc.as_path()),
            ]
        );
        // With links: the whole matrix once per link, each in its own directory; `none`
        // runs without emulation.
        let links = ["100mbit".to_string(), "none".to_string()];
        let by_link = plan_jobs(&codecs[..2], &[Variant::Paper], &[], &links, out);
        let got: Vec<(Option<&str>, &Path)> = by_link
            .iter()
            .map(|j| (j.link.as_deref(), j.dir.as_path()))
            .collect();
        let dgc_dir = sanitize(&codecs[1]);
        assert_eq!(
            got,
            vec![
                (Some("100mbit"), out.join("link-100mbit/none").as_path()),
                (
                    Some("100mbit"),
                    out.join("link-100mbit").join(&dgc_dir).as_path()
                ),
                (None, out.join("link-none/none").as_path()),
                (None, out.join("link-none").join(&dgc_dir).as_path()),
            ]
        );
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
