//! Launching an elastic job (`gradwire launch --elastic MIN:MAX`, and `gradwire train
//! --elastic`, which launches itself this way): a membership coordinator
//! (`gradwire_run::elastic`) in this process, the processes with its address instead of a
//! rank in their environment, a wait that survives a process's death and ends on the
//! coordinator's outcome, and the join file through which one more process joins the
//! running job (`gradwire launch --join FILE`, `gradwire train --join OUT`).

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use gradwire_run::elastic::{Coordinator, CoordinatorConfig, MembershipEvent, Outcome};
use serde::{Deserialize, Serialize};

use crate::launch::{spawn_elastic, ElasticEnv, RankSpec};

/// What a joiner needs to find a running elastic job (written mode 0600: it holds the
/// token).
#[derive(Debug, Serialize, Deserialize)]
pub struct JoinFile {
    /// The coordinator's address.
    pub coordinator: String,
    /// The job's token.
    pub token: String,
    /// The job's id.
    pub job: String,
    /// The program every process runs.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

/// The transport deadline the processes use (`GRADWIRE_TIMEOUT`, else the default).
pub fn transport_timeout() -> Duration {
    std::env::var("GRADWIRE_TIMEOUT")
        .ok()
        .and_then(|t| gradwire_transport::env::parse_seconds(&t))
        .unwrap_or(gradwire_transport::DEFAULT_TIMEOUT)
}

/// What the coordinator waits beyond a transport deadline for a member of a broken world
/// to report before it evicts it (and, short of MIN, for joiners).
pub const EVICT_MARGIN: Duration = Duration::from_secs(5);

/// An elastic job to launch.
pub struct ElasticJob<'a> {
    /// The processes to start, `spec.np` of them.
    pub spec: &'a RankSpec,
    /// The fewest and most processes.
    pub min: usize,
    /// The most processes.
    pub max: usize,
    /// Where to write the join file, if anywhere.
    pub join_file: Option<&'a Path>,
    /// How a log line starts (`gradwire launch`, `gradwire train`).
    pub who: &'a str,
}

/// Runs an elastic job to its end: the coordinator, the processes, the wait. The
/// membership events, or the reason the job stopped.
pub fn run(job: &ElasticJob) -> Result<Vec<MembershipEvent>> {
    let token = format!("{:032x}", rand::random::<u128>());
    let id = format!("{:032x}", rand::random::<u128>());
    let mut cfg = CoordinatorConfig::new(job.min, job.max, job.spec.np, token.clone(), id.clone());
    // Once a world breaks, every live member learns it within a transport deadline (its own
    // collective fails, or a peer's abort frame reaches it): one deadline and a margin for
    // the step it may be computing, then the silent ones are evicted.
    cfg.timeout = transport_timeout() + EVICT_MARGIN;
    let coord = Coordinator::start(cfg).context("starting the elastic coordinator")?;
    if let Some(path) = job.join_file {
        let file = JoinFile {
            coordinator: coord.addr().to_string(),
            token: token.clone(),
            job: id.clone(),
            program: job.spec.program.clone(),
            args: job.spec.args.clone(),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        write_private(path, &serde_json::to_vec_pretty(&file)?)?;
    }
    let env = ElasticEnv {
        coordinator: coord.addr(),
        token,
        job: id,
    };
    let ranks = spawn_elastic(job.spec, &env)?;
    let result = ranks.wait_elastic(|wait| {
        coord.wait(wait).map(|o| match o {
            Outcome::Finished => Ok(()),
            Outcome::Aborted(why) => Err(why),
        })
    });
    if let Some(path) = job.join_file {
        let _ = std::fs::remove_file(path);
    }
    let events = coord.events();
    for e in &events {
        eprintln!("{}: membership: {}", job.who, describe_event(e));
    }
    if let Err(why) = result? {
        bail!("the elastic job stopped: {why}");
    }
    Ok(events)
}

/// Writes `bytes` to `path` readable by this user only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// Becomes one more process of the elastic job `path` describes: replaces this process
/// with the job's command, its environment naming the coordinator.
pub fn join(path: &Path) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "no running elastic job to join: {} unreadable",
            path.display()
        )
    })?;
    let file: JoinFile =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let err = std::process::Command::new(&file.program)
        .args(&file.args)
        .env(gradwire_run::elastic::ENV_ELASTIC, &file.coordinator)
        .env("GRADWIRE_TOKEN", &file.token)
        .env("GRADWIRE_JOB_ID", &file.job)
        .exec();
    Err(err).with_context(|| format!("starting {}", file.program))
}

/// One line for an event.
pub fn describe_event(e: &MembershipEvent) -> String {
    let after =
        |t: Option<f64>| t.map_or("-".into(), |t| format!("{:.2} s", t - e.detected_unix_s));
    match e.kind.as_str() {
        "start" => format!("generation 0: {} ranks", e.world_size_after),
        _ => format!(
            "generation {}: {} (lost ranks {:?}, {} joined), {} -> {} ranks, restored step {}, {} steps lost, new world after {}, training again after {}",
            e.generation,
            e.kind,
            e.lost_ranks,
            e.joined,
            e.world_size_before,
            e.world_size_after,
            e.restore_step.map_or("-".into(), |s| s.to_string()),
            e.steps_lost,
            after(Some(e.formed_unix_s)),
            after(e.resumed_unix_s),
        ),
    }
}

/// The events as run.json keeps them: each with its costs in seconds
/// (`detect_to_world_s`, `detect_to_training_s`).
pub fn membership_json(events: &[MembershipEvent]) -> serde_json::Value {
    serde_json::Value::Array(
        events
            .iter()
            .map(|e| {
                let mut v = serde_json::to_value(e).expect("events serialize");
                v["detect_to_world_s"] = (e.formed_unix_s - e.detected_unix_s).into();
                v["detect_to_training_s"] = e.resumed_unix_s.map(|r| r - e.detected_unix_s).into();
                v
            })
            .collect(),
    )
}
