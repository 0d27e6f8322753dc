//! Launching an elastic job (`gradwire launch --elastic MIN:MAX`, and `gradwire train
//! --elastic`, which launches itself this way): a membership coordinator
//! ([`crate::elastic::Coordinator`]) in this process, the processes with its address
//! instead of a rank in their environment ([`spawn_elastic`]), a wait that survives a
//! process's death and ends on the coordinator's outcome ([`Ranks::wait_elastic`]), and the
//! join file through which one more process joins the running job ([`join`]; `gradwire
//! launch --join FILE`, `gradwire train --join OUT`).
//!
//! [`Ranks::wait_elastic`]: super::Ranks::wait_elastic

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::elastic::{Coordinator, CoordinatorConfig, MembershipEvent, Outcome};

use super::{spawn_elastic, ElasticEnv, LaunchError, RankSpec, Stopped};

/// What a joiner needs to find a running elastic job (written mode 0600: it holds the
/// token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

impl JoinFile {
    /// Writes it to `path` (pretty JSON), readable by this user only, creating the folder
    /// above; a file already there is replaced.
    pub fn write(&self, path: &Path) -> Result<(), LaunchError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| LaunchError::WriteJoinFile {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let bytes = serde_json::to_vec_pretty(self).expect("a join file serializes");
        write_private(path, &bytes).map_err(|source| LaunchError::WriteJoinFile {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Reads the join file at `path`.
    pub fn read(path: &Path) -> Result<JoinFile, LaunchError> {
        let text = std::fs::read_to_string(path).map_err(|source| LaunchError::ReadJoinFile {
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| LaunchError::ParseJoinFile {
            path: path.to_path_buf(),
            source,
        })
    }
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
#[derive(Debug, Clone, Copy)]
pub struct ElasticJob<'a> {
    /// The processes to start, `spec.np` of them (`spec.master` is not used: the
    /// coordinator names each generation's).
    pub spec: &'a RankSpec,
    /// The fewest processes.
    pub min: usize,
    /// The most processes.
    pub max: usize,
    /// Where to write the join file, if anywhere (removed when the job ends).
    pub join_file: Option<&'a Path>,
    /// Who launches (`gradwire launch`, `gradwire train`): how the front end's log lines
    /// about the job start.
    pub who: &'a str,
}

/// How an elastic job ended: [`run`]'s answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ElasticEnd {
    /// The membership events, generation by generation.
    pub events: Vec<MembershipEvent>,
    /// `Ok`: the job finished; `Err`: it stopped (the coordinator aborted it, or a signal
    /// stopped it).
    pub outcome: Result<(), Stopped>,
}

/// Runs an elastic job to its end: the coordinator, the join file, the processes, the wait.
/// Returns the membership events and how the job ended; an `Err` only when the job could
/// not be run (the coordinator, the join file, a process that did not start, a wait).
pub fn run(job: &ElasticJob) -> Result<ElasticEnd, LaunchError> {
    let token = format!("{:032x}", rand::random::<u128>());
    let id = format!("{:032x}", rand::random::<u128>());
    let mut cfg = CoordinatorConfig::new(job.min, job.max, job.spec.np, token.clone(), id.clone());
    // Once a world breaks, every live member learns it within a transport deadline (its own
    // collective fails, or a peer's abort frame reaches it): one deadline and a margin for
    // the step it may be computing, then the silent ones are evicted.
    cfg.timeout = transport_timeout() + EVICT_MARGIN;
    let coord = Coordinator::start(cfg).map_err(LaunchError::Coordinator)?;
    tracing::debug!(who = job.who, addr = %coord.addr(), "elastic coordinator started");
    // Removes the join file however this function returns, once it was written.
    let join_file = match job.join_file {
        Some(path) => {
            let file = JoinFile {
                coordinator: coord.addr().to_string(),
                token: token.clone(),
                job: id.clone(),
                program: job.spec.program.clone(),
                args: job.spec.args.clone(),
            };
            file.write(path)?;
            Some(RemoveOnDrop(path.to_path_buf()))
        }
        None => None,
    };
    let env = ElasticEnv {
        coordinator: coord.addr(),
        token,
        job: id,
    };
    let ranks = spawn_elastic(job.spec, &env)?;
    let outcome = ranks.wait_elastic(|wait| {
        coord.wait(wait).map(|o| match o {
            Outcome::Finished => Ok(()),
            Outcome::Aborted(why) => Err(Stopped::Aborted(why)),
        })
    });
    drop(join_file);
    let events = coord.events();
    Ok(ElasticEnd {
        events,
        outcome: outcome?,
    })
}

/// A file removed when this is dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes `bytes` to `path` readable by this user only (a file already there is removed
/// first, so the mode holds).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// Becomes one more process of the elastic job the join file `path` describes: replaces
/// this process with the job's command, its environment naming the coordinator. Returns
/// only on failure.
pub fn join(path: &Path) -> Result<(), LaunchError> {
    use std::os::unix::process::CommandExt;
    let file = JoinFile::read(path)?;
    let source = std::process::Command::new(&file.program)
        .args(&file.args)
        .env(crate::elastic::ENV_ELASTIC, &file.coordinator)
        .env("GRADWIRE_TOKEN", &file.token)
        .env("GRADWIRE_JOB_ID", &file.job)
        .exec();
    Err(LaunchError::Exec {
        program: file.program,
        source,
    })
}

/// One line for an event (`generation 0: 4 ranks`, `generation 2: lost (lost ranks [1], 0
/// joined), 4 -> 3 ranks, ...`).
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
/// (`detect_to_world_s`, `detect_to_training_s`, `null` while it has not trained again).
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh folder under the system's temporary one (removed by the test).
    fn scratch(name: &str) -> PathBuf {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        std::env::temp_dir().join(format!(
            "gradwire-launch-{name}-{}-{nanos}",
            std::process::id()
        ))
    }

    fn lost() -> MembershipEvent {
        MembershipEvent {
            generation: 2,
            kind: "lost".into(),
            world_size_before: 4,
            world_size_after: 3,
            lost_ranks: vec![1],
            joined: 0,
            restore_step: Some(40),
            reached_step: 43,
            steps_lost: 3,
            detected_unix_s: 100.0,
            formed_unix_s: 101.5,
            resumed_unix_s: Some(102.25),
        }
    }

    #[test]
    fn a_join_file_round_trips_readable_by_its_owner_only() {
        let dir = scratch("join");
        let path = dir.join("nested").join("join.json");
        let file = JoinFile {
            coordinator: "127.0.0.1:4000".into(),
            token: "secret".into(),
            job: "job".into(),
            program: "/bin/true".into(),
            args: vec!["--x".into(), "y z".into()],
        };
        file.write(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(JoinFile::read(&path).unwrap(), file);
        // A second write replaces the first, mode and all.
        let second = JoinFile {
            token: "other".into(),
            ..file
        };
        second.write(&path).unwrap();
        assert_eq!(JoinFile::read(&path).unwrap(), second);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_or_broken_join_file_is_refused_by_name() {
        let dir = scratch("join-bad");
        let missing = dir.join("none.json");
        let e = join(&missing).unwrap_err();
        assert!(matches!(e, LaunchError::ReadJoinFile { .. }), "{e:?}");
        assert!(e.to_string().contains("no running elastic job"), "{e}");
        std::fs::create_dir_all(&dir).unwrap();
        let broken = dir.join("broken.json");
        std::fs::write(&broken, "{not json").unwrap();
        let e = JoinFile::read(&broken).unwrap_err();
        assert!(matches!(e, LaunchError::ParseJoinFile { .. }), "{e:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn membership_json_adds_the_costs_in_seconds() {
        let mut pending = lost();
        pending.resumed_unix_s = None;
        let v = membership_json(&[lost(), pending]);
        let a = &v[0];
        assert_eq!(a["generation"], 2);
        assert_eq!(a["kind"], "lost");
        assert_eq!(a["lost_ranks"], serde_json::json!([1]));
        assert_eq!(a["detect_to_world_s"], 1.5);
        assert_eq!(a["detect_to_training_s"], 2.25);
        assert!(v[1]["detect_to_training_s"].is_null());
        assert!(v[1]["resumed_unix_s"].is_null());
    }

    #[test]
    fn events_read_as_one_line_each() {
        let start = MembershipEvent {
            generation: 0,
            kind: "start".into(),
            world_size_before: 0,
            world_size_after: 4,
            lost_ranks: Vec::new(),
            joined: 0,
            restore_step: None,
            reached_step: 0,
            steps_lost: 0,
            detected_unix_s: 1.0,
            formed_unix_s: 1.0,
            resumed_unix_s: None,
        };
        assert_eq!(describe_event(&start), "generation 0: 4 ranks");
        assert_eq!(
            describe_event(&lost()),
            "generation 2: lost (lost ranks [1], 0 joined), 4 -> 3 ranks, restored step 40, \
             3 steps lost, new world after 1.50 s, training again after 2.25 s"
        );
    }
}
