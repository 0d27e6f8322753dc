//! Per-epoch training records: what `gradwire train` writes (JSON lines) and `report` reads.
//! They live in `gradwire_run::report::records`; this module re-exports them so that the
//! CLI's modules keep their `crate::records::...` paths.

pub use gradwire_run::report::records::{append_jsonl, EpochRecord, Provenance, RunRecord};
