//! A TCP mesh split into groups ([`crate::split`]): every rank binds a fresh listener on the
//! interface its mesh uses and sends its address in its offer; then each group forms its own
//! full mesh (`rendezvous::join_mesh`: connect to lower group ranks, accept higher ones), every
//! connection running the job's handshake on the token, bound to [`split_digest`] of the
//! parent mesh's identity, the split's sequence number, the color and the members. A rank of
//! another group, another split or another job presents another digest and is refused before
//! anything derived from the token is answered, and a wrong token fails the proof.

use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::auth::split_digest;
use super::frame::{decode_table, encode_table, JOB_LEN};
use super::rendezvous::join_mesh;
use super::{rendezvous, Tcp, TcpConfig};
use crate::split::offer::{Offer, OfferError};
use crate::split::{self, Group, Split};
use crate::{Error, Result, Transport};

/// What a mesh keeps to form its groups' meshes.
pub(super) struct SplitBase {
    token: String,
    /// The digest binding this mesh's connections (a group's derives from it).
    identity: [u8; JOB_LEN],
    /// Splits of this mesh so far.
    splits: u32,
    max_frame: u64,
    socket_buffer: Option<usize>,
    handshake_timeout: Duration,
}

impl SplitBase {
    pub(super) fn new(cfg: &TcpConfig, identity: [u8; JOB_LEN]) -> SplitBase {
        SplitBase {
            token: cfg.token.clone(),
            identity,
            splits: 0,
            max_frame: cfg.max_frame,
            socket_buffer: cfg.socket_buffer,
            handshake_timeout: cfg.handshake_timeout,
        }
    }
}

impl Split for Tcp {
    fn split(&mut self, color: u32, key: u32) -> Result<Group> {
        let seq = self.split.splits;
        self.split.splits += 1;
        // The interface this mesh already uses (loopback for a world of one).
        let ip = self
            .peers
            .iter()
            .flatten()
            .find_map(|s| s.local_addr().ok())
            .map(|a| a.ip())
            .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let listener = TcpListener::bind((ip, 0))
            .map_err(|e| rendezvous(format!("split: cannot listen on {ip}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| rendezvous(format!("split: listener address: {e}")))?;
        let payload = encode_table(&[addr]);
        let offer = Offer {
            seq,
            color,
            key,
            payload: &payload,
        };
        let all = split::exchange(self, &offer)?;
        let (plan, offers) = split::plan_of(self.rank, &all)?;
        let addrs = plan
            .members
            .iter()
            .map(|&r| match decode_table(offers[r].payload, 1).as_deref() {
                Ok([a]) => Ok(*a),
                _ => Err(Error::BadSplit {
                    peer: r,
                    source: OfferError::BadPayload {
                        what: "not one listening address",
                    },
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        let identity = split_digest(&self.split.identity, seq, plan.color, &plan.members);
        let cfg = TcpConfig {
            job: String::new(),
            insecure: true,
            timeout: self.timeout,
            max_frame: self.split.max_frame,
            socket_buffer: self.split.socket_buffer,
            handshake_timeout: self.split.handshake_timeout,
            spin: self.spin,
            ..TcpConfig::new(
                plan.rank,
                plan.members.len(),
                addrs[0],
                self.split.token.clone(),
            )
        };
        let mut peers: Vec<Option<TcpStream>> = (0..plan.members.len()).map(|_| None).collect();
        let deadline = Instant::now() + self.timeout;
        join_mesh(&cfg, &listener, &addrs, &identity, &mut peers, deadline)
            .map_err(|e| plan.name_error(e))?;
        drop(listener);
        let sub = Tcp::finish(&cfg, peers, identity).map_err(|e| plan.name_error(e))?;
        tracing::debug!(
            rank = self.rank(),
            color,
            group_rank = plan.rank,
            "tcp group mesh up"
        );
        Ok(Group::new(Box::new(sub), plan.color, plan.members))
    }
}

#[cfg(test)]
mod tests;
