//! Shared helpers of the PS integration tests.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use gradwire_ps::auth::{connect, token_from_env};
use gradwire_ps::{ClientConfig, KvStore, Peer, Role, Server, ServerConfig, ShardConfig, WorkerId};

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

/// A raw connection to a shard, authenticated (with the environment's token, as
/// `ServerConfig::loopback` uses) as `worker` in `role`, ready for PS frames.
pub fn authed(addr: SocketAddr, worker: u32, role: Role) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connects");
    let peer = Peer {
        worker: WorkerId(worker),
        role,
    };
    connect(
        &mut s,
        &token_from_env(),
        peer,
        Instant::now() + Duration::from_secs(5),
    )
    .expect("handshake");
    s
}

/// A child process killed (and reaped) on drop, so a failing test leaves none behind.
pub struct KillOnDrop(pub Option<std::process::Child>);

impl KillOnDrop {
    /// Waits up to `limit` for the child to exit and returns its output; kills it (and
    /// fails) past the limit.
    pub fn wait_output(mut self, limit: Duration) -> std::io::Result<std::process::Output> {
        let t0 = Instant::now();
        let child = self.0.as_mut().expect("a child");
        while child.try_wait()?.is_none() {
            if t0.elapsed() > limit {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.0.take().expect("a child").wait_with_output()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
