//! [`Transport`] for [`Mpi`]: every call is one `exchange` of a send and/or a receive.

use std::time::Duration;

use super::exchange::Sink;
use super::Mpi;
use crate::split::Split;
use crate::{Result, Transport};

impl Transport for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn send(&mut self, to: usize, msg: &[u8]) -> Result<()> {
        self.exchange(Some((to, msg)), None)
    }

    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.exchange(None, Some((from, Sink::Vec(buf))))
    }

    fn send_recv(&mut self, to: usize, msg: &[u8], from: usize, buf: &mut Vec<u8>) -> Result<()> {
        self.exchange(Some((to, msg)), Some((from, Sink::Vec(buf))))
    }

    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> Result<()> {
        self.exchange(None, Some((from, Sink::Slice(out))))
    }

    fn send_recv_into(&mut self, to: usize, msg: &[u8], from: usize, out: &mut [u8]) -> Result<()> {
        self.exchange(Some((to, msg)), Some((from, Sink::Slice(out))))
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    fn splitter(&mut self) -> Option<&mut dyn Split> {
        Some(self)
    }
}
