//! What a run leaves behind and how runs compare: the records `gradwire train` writes and
//! `gradwire report` reads, and the report made from them, as data and Markdown. The command
//! lines, the training processes, the files the user names and the charts stay in the front
//! end (the CLI's `report.rs` and `plot.rs`).
//!
//! - [`records`]: [`RunRecord`] (`run.json`) and [`EpochRecord`] (one line of
//!   `metrics.jsonl`), their [`Provenance`], the quality [`Metric`]; their JSON shapes are
//!   read by other tools and stay stable;
//! - [`matrix`]: the runs of a report (codec × row kind × seed × link), their order and
//!   directories;
//! - [`tta`]: time to accuracy: the [`Target`], each group's time to it, the speedup over
//!   the baseline and, across emulated link speeds, the speed above which the baseline wins;
//! - [`render`]: the Markdown tables.

pub mod matrix;
pub mod records;
pub mod render;
pub mod tta;

pub use matrix::{plan_jobs, preset, split_codecs, Job, Variant};
pub use records::{
    append_jsonl, common_metric, read_jsonl, read_run, EpochRecord, Metric, Provenance,
    RecordError, RunRecord,
};
pub use render::{human_bytes, render_markdown};
pub use tta::{Crossover, GroupTime, SpeedupCurve, Target};
