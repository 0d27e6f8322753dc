//! What an elastic worker keeps across generations ([`Kept`]): its two newest commits, the
//! last step it completed, and the count and cost of its commit points.

use std::collections::VecDeque;

use gradwire_train::elastic::Commit;

/// What a rank keeps across generations.
#[derive(Default)]
pub(super) struct Kept {
    /// The two newest commits.
    commits: VecDeque<Commit>,
    /// The last global step completed.
    pub(super) reached: u64,
    /// Commit points passed on this rank.
    pub(super) commit_n: u64,
    /// Their seconds on this rank (the copy, and the check for joiners with the agreement
    /// on it).
    pub(super) commit_s: f64,
}

impl Kept {
    /// Keeps `c`, replacing a commit of the same step, and drops all but the two newest.
    pub(super) fn push(&mut self, c: Commit) {
        if self
            .commits
            .back()
            .is_some_and(|b| b.checkpoint.global_step == c.checkpoint.global_step)
        {
            self.commits.pop_back();
        }
        self.commits.push_back(c);
        while self.commits.len() > 2 {
            self.commits.pop_front();
        }
    }

    /// The steps of the commits held, oldest first.
    pub(super) fn steps(&self) -> Vec<u64> {
        self.commits
            .iter()
            .map(|c| c.checkpoint.global_step)
            .collect()
    }

    /// The commit of `step`, if held.
    pub(super) fn at(&self, step: u64) -> Option<&Commit> {
        self.commits
            .iter()
            .find(|c| c.checkpoint.global_step == step)
    }
}
