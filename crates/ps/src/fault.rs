//! Fault injection users can run: a seeded TCP proxy over the client↔shard message path, and
//! a guard for real shard processes that tests can SIGKILL and restart.
//!
//! [`FaultProxy`] sits between clients and one shard, passes each connection's handshake
//! through untouched, then forwards whole PS frames. For each
//! frame, in each direction, a ChaCha8 stream seeded from (seed, connection number,
//! direction) decides whether to drop it, duplicate it, hold it back and send it after the
//! next frame (reorder), delay it, or flip one bit of its checksum or body (corrupt).
//! [`FaultProxy::partition`] drops every frame both ways until healed. Decisions are
//! deterministic per frame sequence; thread timing is not, so tests assert invariants
//! (exact sums, applied-once) rather than schedules.
//!
//! [`ShardProcess`] runs the `gradwire-ps-server` binary, reads the address it prints, and
//! kills (SIGKILL) the child on [`ShardProcess::kill`] or on drop, so a failing test leaves
//! no process behind.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use gradwire_transport::tcp::service::{ACCEPTING_SIDE_BYTES, CONNECTING_SIDE_BYTES};

use crate::wire::HEADER_LEN;

/// Probabilities (each in `[0, 1]`, per frame) and the seed of a [`FaultProxy`].
#[derive(Debug, Clone, Default)]
pub struct FaultConfig {
    /// Seed of the decisions.
    pub seed: u64,
    /// Drop the frame.
    pub drop: f64,
    /// Send the frame twice.
    pub duplicate: f64,
    /// Hold the frame and send it after the next one (or after 5 ms without one).
    pub reorder: f64,
    /// Sleep up to `max_delay` before forwarding.
    pub delay: f64,
    /// Longest injected delay.
    pub max_delay: Duration,
    /// Flip one bit of the checksum or body.
    pub corrupt: f64,
    /// Apply faults to shard→client frames too (not only client→shard).
    pub both_directions: bool,
}

/// How many faults a proxy injected.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Frames forwarded.
    pub forwarded: AtomicU64,
    /// Frames dropped (partition included).
    pub dropped: AtomicU64,
    /// Frames duplicated.
    pub duplicated: AtomicU64,
    /// Frames reordered.
    pub reordered: AtomicU64,
    /// Frames delayed.
    pub delayed: AtomicU64,
    /// Frames corrupted.
    pub corrupted: AtomicU64,
}

/// A seeded, frame-aware fault-injecting TCP proxy in front of one shard.
pub struct FaultProxy {
    addr: SocketAddr,
    partitioned: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    counts: Arc<FaultCounts>,
}

const PROXY_MAX_FRAME: usize = 256 << 20;

impl FaultProxy {
    /// Listens on 127.0.0.1 (any port) and forwards to `upstream` with `cfg`'s faults.
    pub fn start(upstream: SocketAddr, cfg: FaultConfig) -> io::Result<FaultProxy> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let addr = listener.local_addr()?;
        let partitioned = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(FaultCounts::default());
        let (p, s, c) = (partitioned.clone(), stop.clone(), counts.clone());
        std::thread::spawn(move || {
            for (n, conn) in listener.incoming().enumerate() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2))
                else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                for (dir, from, to) in [
                    (0u64, client.try_clone(), server.try_clone()),
                    (1u64, server.try_clone(), client.try_clone()),
                ] {
                    let (Ok(from), Ok(to)) = (from, to) else {
                        continue;
                    };
                    let seed = cfg.seed ^ ((n as u64) << 8) ^ dir;
                    let faulty = dir == 0 || cfg.both_directions;
                    let handshake = if dir == 0 {
                        CONNECTING_SIDE_BYTES
                    } else {
                        ACCEPTING_SIDE_BYTES
                    };
                    let (cfg, p, c) = (cfg.clone(), p.clone(), c.clone());
                    std::thread::spawn(move || {
                        if pass_handshake(&from, &to, handshake) {
                            pump(from, to, seed, faulty, &cfg, &p, &c)
                        }
                    });
                }
            }
        });
        Ok(FaultProxy {
            addr,
            partitioned,
            stop,
            counts,
        })
    }

    /// The address clients should use instead of the shard's.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts (`true`) or heals (`false`) a partition: every frame is dropped meanwhile.
    pub fn partition(&self, on: bool) {
        self.partitioned.store(on, Ordering::SeqCst);
    }

    /// The injected-fault counters.
    pub fn counts(&self) -> &FaultCounts {
        &self.counts
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn read_raw_frame(s: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut f = vec![0u8; HEADER_LEN];
    s.read_exact(&mut f)?;
    let len = u32::from_le_bytes(f[8..12].try_into().expect("4 bytes")) as usize;
    if len > PROXY_MAX_FRAME {
        return Err(io::ErrorKind::InvalidData.into());
    }
    f.resize(HEADER_LEN + len, 0);
    s.read_exact(&mut f[HEADER_LEN..])?;
    Ok(f)
}

/// Forwards the `n` handshake bytes of one direction untouched, as they come (faults apply
/// to PS frames only); `false` (both ends shut) when either side fails first.
fn pass_handshake(mut from: &TcpStream, mut to: &TcpStream, n: usize) -> bool {
    let mut left = n;
    let mut buf = [0u8; 256];
    while left > 0 {
        let want = left.min(buf.len());
        match from.read(&mut buf[..want]) {
            Ok(k) if k > 0 && to.write_all(&buf[..k]).is_ok() => left -= k,
            _ => {
                let _ = from.shutdown(Shutdown::Both);
                let _ = to.shutdown(Shutdown::Both);
                return false;
            }
        }
    }
    true
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    seed: u64,
    faulty: bool,
    cfg: &FaultConfig,
    partitioned: &AtomicBool,
    counts: &FaultCounts,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut held: Option<Vec<u8>> = None;
    let hit = |rng: &mut ChaCha8Rng, p: f64| p > 0.0 && rng.gen_bool(p.min(1.0));
    loop {
        if let Some(h) = held.as_ref() {
            // A held frame goes out after the next frame, or after 5 ms without one.
            let _ = from.set_read_timeout(Some(Duration::from_millis(5)));
            let waiting = from.peek(&mut [0u8; 1]);
            let _ = from.set_read_timeout(None);
            if matches!(&waiting, Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
            {
                if to.write_all(h).is_err() {
                    break;
                }
                held = None;
                continue;
            }
        }
        let Ok(mut frame) = read_raw_frame(&mut from) else {
            break;
        };
        if partitioned.load(Ordering::SeqCst) {
            counts.dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let mut copies = 1;
        if faulty {
            if hit(&mut rng, cfg.drop) {
                counts.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if hit(&mut rng, cfg.corrupt) {
                // Flip a bit of the CRC or the body (never the length: framing survives).
                let span = 4 + frame.len() - HEADER_LEN;
                let i = rng.gen_range(0..span);
                let at = if i < 4 { 12 + i } else { HEADER_LEN + i - 4 };
                frame[at] ^= 1 << rng.gen_range(0..8);
                counts.corrupted.fetch_add(1, Ordering::Relaxed);
            }
            if hit(&mut rng, cfg.delay) && !cfg.max_delay.is_zero() {
                let d = rng.gen_range(0..cfg.max_delay.as_micros() as u64);
                std::thread::sleep(Duration::from_micros(d));
                counts.delayed.fetch_add(1, Ordering::Relaxed);
            }
            if hit(&mut rng, cfg.duplicate) {
                copies = 2;
                counts.duplicated.fetch_add(1, Ordering::Relaxed);
            }
            if held.is_none() && hit(&mut rng, cfg.reorder) {
                counts.reordered.fetch_add(1, Ordering::Relaxed);
                held = Some(frame);
                continue;
            }
        }
        let mut ok = true;
        for _ in 0..copies {
            ok &= to.write_all(&frame).is_ok();
        }
        if let Some(h) = held.take() {
            ok &= to.write_all(&h).is_ok();
        }
        counts.forwarded.fetch_add(1, Ordering::Relaxed);
        if !ok {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// A real shard process (`gradwire-ps-server`), killed with SIGKILL on drop.
pub struct ShardProcess {
    child: Option<Child>,
    addr: SocketAddr,
}

impl ShardProcess {
    /// Runs `bin` with `args`, waits (up to 20 s) for its `listening on ADDR` line.
    pub fn spawn(bin: &Path, args: &[String]) -> io::Result<ShardProcess> {
        Self::spawn_with_env(bin, args, &[])
    }

    /// [`ShardProcess::spawn`] with `env` added to the child's environment.
    pub fn spawn_with_env(
        bin: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> io::Result<ShardProcess> {
        let mut child = Command::new(bin)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(l)) = lines.next() {
                let _ = tx.send(l);
            }
            // Keep draining so the child never blocks on a full pipe.
            for _ in lines {}
        });
        let mut guard = ShardProcess {
            child: Some(child),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let line = rx.recv_timeout(Duration::from_secs(20)).map_err(|_| {
            io::Error::new(io::ErrorKind::TimedOut, "shard did not report its address")
        })?;
        guard.addr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unexpected first line: {line}"),
                )
            })?;
        Ok(guard)
    }

    /// The shard's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// SIGKILLs the process and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ShardProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
