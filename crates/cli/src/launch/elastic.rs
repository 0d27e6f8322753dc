//! Launching an elastic job (`gradwire launch --elastic MIN:MAX`, and `gradwire train
//! --elastic`, which launches itself this way): [`gradwire_run::launch::elastic`],
//! re-exported, and [`run`], which reports the job's membership events on standard error.

use anyhow::{bail, Result};
use gradwire_run::elastic::MembershipEvent;

pub use gradwire_run::launch::elastic::{describe_event, join, ElasticJob};

/// Runs an elastic job to its end ([`gradwire_run::launch::elastic::run`]), then prints its
/// membership events, one line each (`{who}: membership: ...`). The events, or the reason
/// the job stopped.
pub fn run(job: &ElasticJob) -> Result<Vec<MembershipEvent>> {
    let end = gradwire_run::launch::elastic::run(job)?;
    for e in &end.events {
        eprintln!("{}: membership: {}", job.who, describe_event(e));
    }
    if let Err(why) = end.outcome {
        bail!("the elastic job stopped: {why}");
    }
    Ok(end.events)
}
