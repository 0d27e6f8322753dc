//! [`Group`]: one rank's transport in a group made by a split, which numbers its ranks by
//! group rank and names the group and the global ranks in its errors.

use std::time::Duration;

use super::Split;
use crate::{Error, Result, SplitStep, Transport};

/// This rank's transport in a group (see [`crate::split`]): ranks `0..world_size()` are the
/// group's members, rank `i` being global rank `members()[i]`. Owns its own connections, so
/// it is independent of the transport it was split from and of other groups; move it to its
/// own thread or into an engine.
pub struct Group {
    inner: Box<dyn Transport>,
    label: String,
    color: u32,
    /// The global rank of each group rank.
    members: Vec<usize>,
}

impl Group {
    /// Wraps a group's transport (`inner` numbers the group's ranks) whose rank `i` is global
    /// rank `members[i]`.
    pub(crate) fn new(inner: Box<dyn Transport>, color: u32, members: Vec<usize>) -> Group {
        Group {
            inner,
            label: default_label(color),
            color,
            members,
        }
    }

    /// The group's name in errors ("group 3" unless [`Group::set_label`] changed it;
    /// [`crate::split::grid`] names "replica r" and "partition group j").
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Renames the group in errors from now on.
    pub fn set_label(&mut self, label: impl Into<String>) {
        self.label = label.into();
    }

    /// The color the members passed to the split.
    pub fn color(&self) -> u32 {
        self.color
    }

    /// The global rank of each group rank (the rank in the transport first split).
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// This rank's global rank.
    pub fn global_rank(&self) -> usize {
        self.members[self.inner.rank()]
    }

    /// The same error, naming the group and the global ranks (see [`Error::InGroup`]).
    pub fn name_error(&self, e: Error) -> Error {
        name_error(&self.label, &self.members, e)
    }

    fn named<R>(&self, r: Result<R>) -> Result<R> {
        r.map_err(|e| self.name_error(e))
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("label", &self.label)
            .field("rank", &self.inner.rank())
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

impl Transport for Group {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn send(&mut self, to: usize, msg: &[u8]) -> Result<()> {
        let r = self.inner.send(to, msg);
        self.named(r)
    }
    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> Result<()> {
        let r = self.inner.recv(from, buf);
        self.named(r)
    }
    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()> {
        let r = self.inner.send_recv(to, msg, from, buf);
        self.named(r)
    }
    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        let r = self.inner.recv_into(from, out);
        self.named(r)
    }
    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        let r = self.inner.send_recv_into(to, msg, from, out);
        self.named(r)
    }
    fn send_recv_parts(
        &mut self,
        to: usize,
        parts: &[&[u8]],
        from: usize,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        let r = self.inner.send_recv_parts(to, parts, from, buf);
        self.named(r)
    }
    fn send_recv_parts_into(
        &mut self,
        to: usize,
        parts: &[&[u8]],
        from: usize,
        out: &mut [&mut [u8]],
    ) -> Result<()> {
        let r = self.inner.send_recv_parts_into(to, parts, from, out);
        self.named(r)
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
    fn bytes_sent(&self) -> u64 {
        self.inner.bytes_sent()
    }
    fn split_step(&mut self) -> Option<&mut dyn SplitStep> {
        if self.inner.split_step().is_some() {
            Some(self)
        } else {
            None
        }
    }
    fn splitter(&mut self) -> Option<&mut dyn Split> {
        Some(self)
    }
}

/// The inner transport's split step, its errors named.
impl SplitStep for Group {
    fn post(&mut self, to: usize, msg: &[u8], from: usize) -> Result<()> {
        let r = match self.inner.split_step() {
            Some(s) => s.post(to, msg, from),
            None => Err(NO_SPLIT_STEP),
        };
        self.named(r)
    }

    fn complete_into(&mut self, msg: &[u8], out: &mut [u8]) -> Result<()> {
        let r = match self.inner.split_step() {
            Some(s) => s.complete_into(msg, out),
            None => Err(NO_SPLIT_STEP),
        };
        self.named(r)
    }
}

/// `e`, raised in the group `label` whose rank `i` is global rank `members[i]`, naming the
/// group and the global ranks (an error already named is left as it is).
pub(crate) fn name_error(label: &str, members: &[usize], e: Error) -> Error {
    if let Error::InGroup { .. } = e {
        return e;
    }
    let global = |r: usize| members.get(r).copied();
    let global_reported_by = match e {
        Error::PeerFailed { reported_by, .. } => global(reported_by),
        _ => None,
    };
    Error::InGroup {
        group: label.to_string(),
        global_peer: e.peer().and_then(global),
        global_reported_by,
        source: Box::new(e),
    }
}

const NO_SPLIT_STEP: Error = Error::Misuse {
    what: "a split step on a transport that has none",
};

/// A group splits again: the inner transport splits, and the new group's members are
/// numbered globally through this group's.
impl Split for Group {
    fn split(&mut self, color: u32, key: u32) -> Result<Group> {
        let r = super::split(self.inner.as_mut(), color, key);
        let mut sub = self.named(r)?;
        sub.members = sub.members.iter().map(|&r| self.members[r]).collect();
        sub.label = format!("{} of {}", sub.label, self.label);
        Ok(sub)
    }
}

/// A group's label until it is renamed.
pub(crate) fn default_label(color: u32) -> String {
    format!("group {color}")
}
