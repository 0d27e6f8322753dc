//! Shared helpers of the PS integration tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use gradwire_ps::{ClientConfig, KvStore, Server, ServerConfig, ShardConfig, WorkerId};

/// Starts `n` in-process shards for `workers` workers.
pub fn shards(n: usize, workers: u32, tweak: impl Fn(&mut ShardConfig)) -> Vec<Server> {
    (0..n)
        .map(|i| {
            let mut c = ShardConfig {
                shard_id: i as u32,
                num_workers: workers,
                heartbeat_timeout: Duration::from_secs(5),
                max_wait: Duration::from_secs(10),
                ..ShardConfig::default()
            };
            tweak(&mut c);
            Server::start(ServerConfig::loopback(c)).expect("shard starts")
        })
        .collect()
}

pub fn addrs(s: &[Server]) -> Vec<SocketAddr> {
    s.iter().map(|s| s.local_addr()).collect()
}

/// A client config with short, test-sized deadlines.
pub fn client_cfg(worker: u32, addrs: Vec<SocketAddr>) -> ClientConfig {
    let mut c = ClientConfig::new(WorkerId(worker), addrs);
    c.attempt_timeout = Duration::from_secs(15);
    c.deadline = Duration::from_secs(20);
    c.heartbeat = Some(Duration::from_millis(50));
    c.chunk_elems = 256;
    c
}

pub fn client(worker: u32, addrs: Vec<SocketAddr>) -> KvStore {
    KvStore::connect(client_cfg(worker, addrs)).expect("client connects")
}
