//! The elastic side of a `Runtime`: this process as a member of a `gradwire launch
//! --elastic` job (`GRADWIRE_ELASTIC` names the coordinator). Each world (*generation*) comes
//! from the coordinator (`gradwire_run::elastic`), and the ranks build a fresh TCP mesh for
//! it under the generation's job id and the job's token, as `gradwire train --elastic` does.

use std::time::Duration;

use gradwire_run::elastic::{Member, World};
use gradwire_transport::tcp::{Tcp, TcpConfig};
use pyo3::prelude::*;

use crate::error::{raise, raise_in};

/// How long the first connection to the coordinator may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(30);

/// The job's membership: the connection to its coordinator and the current generation.
pub struct Membership {
    member: Member,
    token: String,
    timeout: Duration,
    generation: u64,
}

/// The transport deadline of the ranks (`GRADWIRE_TIMEOUT`, else the transport's default).
fn transport_timeout() -> Duration {
    std::env::var("GRADWIRE_TIMEOUT")
        .ok()
        .and_then(|t| gradwire_transport::env::parse_seconds(&t))
        .unwrap_or(gradwire_transport::DEFAULT_TIMEOUT)
}

impl Membership {
    /// The membership this process has: `None` without `GRADWIRE_ELASTIC`.
    pub fn from_env() -> PyResult<Option<Membership>> {
        let member = Member::from_env(CONNECT_LIMIT)
            .map_err(|e| raise_in("connecting to the elastic coordinator", &e))?;
        Ok(member.map(|member| Membership {
            member,
            token: std::env::var(gradwire_run::elastic::ENV_TOKEN).unwrap_or_default(),
            timeout: transport_timeout(),
            generation: 0,
        }))
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Asks for the next world (`commits`: the commit counters this rank holds; `reached`:
    /// the newest) and joins its mesh. Blocks until the coordinator forms it.
    pub fn next(&mut self, commits: &[u64], reached: u64) -> PyResult<(World, Tcp)> {
        // The longest a world may take to form: survivors awaited, then joiners awaited.
        let wait = 3 * (self.timeout + Duration::from_secs(10)) + Duration::from_secs(120);
        let world = self
            .member
            .next_world(commits, reached, wait)
            .map_err(|e| raise_in("asking the elastic coordinator for the next world", &e))?;
        let master = world.master.parse().map_err(|e| raise(&e))?;
        let mut cfg = TcpConfig::new(
            world.rank as usize,
            world.world_size as usize,
            master,
            self.token.clone(),
        );
        cfg.job = world.job.clone();
        cfg.timeout = self.timeout;
        let t = Tcp::connect(&cfg).map_err(|e| {
            raise_in(
                &format!(
                    "generation {}: rank {} joining the mesh at {master}",
                    world.generation, world.rank
                ),
                &e,
            )
        })?;
        self.generation = world.generation;
        Ok((world, t))
    }

    /// Whether a joiner waits with room for it.
    pub fn pending(&mut self) -> PyResult<bool> {
        self.member
            .pending()
            .map_err(|e| raise_in("asking the elastic coordinator for joiners", &e))
    }

    /// Reports that `generation` trains again since `unix_s`.
    pub fn resumed(&mut self, generation: u64, unix_s: f64) -> PyResult<()> {
        self.member
            .resumed(generation, unix_s)
            .map_err(|e| raise_in("reporting to the elastic coordinator", &e))
    }

    /// Reports that this member finished.
    pub fn done(&mut self) -> PyResult<()> {
        self.member
            .done()
            .map_err(|e| raise_in("telling the elastic coordinator the run is done", &e))
    }
}
