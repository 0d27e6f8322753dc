//! All-reduce bus bandwidth over TCP loopback (one process, one thread per rank), per world
//! size, message size, algorithm and data path: `lockstep` hides the transport's split step
//! (one `send_recv_into` per segment, reduce after), `pipelined` uses it (the next segment
//! is posted before the current one is reduced).
//!
//! ```text
//! cargo run --release -p gradwire-collective --example tcp_busbw -- \
//!     --worlds 2,4 --sizes 4K,64K,1M,16M,64M --algos ring --paths lockstep,pipelined
//! ```
//! Bus bandwidth = size * 2 (P-1) / P / time (NCCL's convention: comparable across P).
//! Each cell is the best of `--trials` timed runs of about `--secs` seconds each; the
//! algorithms and paths alternate within each trial, so a change of load hits all alike. Every result is
//! checked against the expected sum.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gradwire_collective::{Algorithm, Collectives, ReduceOp};
use gradwire_transport::{tcp, SplitStep, Transport};

/// Hides the split step of the transport it wraps: the lockstep data path.
struct Lockstep<'a, T: ?Sized>(&'a mut T);

impl<T: Transport + ?Sized> Transport for Lockstep<'_, T> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn send(&mut self, to: usize, msg: &[u8]) -> gradwire_transport::Result<()> {
        self.0.send(to, msg)
    }
    fn recv(&mut self, from: usize, buf: &mut Vec<u8>) -> gradwire_transport::Result<()> {
        self.0.recv(from, buf)
    }
    fn send_recv(
        &mut self,
        to: usize,
        msg: &[u8],
        from: usize,
        buf: &mut Vec<u8>,
    ) -> gradwire_transport::Result<()> {
        self.0.send_recv(to, msg, from, buf)
    }
    fn recv_into(&mut self, from: usize, out: &mut [u8]) -> gradwire_transport::Result<()> {
        self.0.recv_into(from, out)
    }
    fn send_recv_into(
        &mut self,
        to: usize,
        msg: &[u8],
        from: usize,
        out: &mut [u8],
    ) -> gradwire_transport::Result<()> {
        self.0.send_recv_into(to, msg, from, out)
    }
    fn timeout(&self) -> Duration {
        self.0.timeout()
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.0.set_timeout(timeout)
    }
    fn bytes_sent(&self) -> u64 {
        self.0.bytes_sent()
    }
    fn split_step(&mut self) -> Option<&mut dyn SplitStep> {
        None
    }
}

/// One job for every rank: `iters` all-reduces of `len` f32 with `algo` on `path`.
#[derive(Clone, Copy)]
struct Job {
    len: usize,
    algo: Algorithm,
    pipelined: bool,
    iters: u32,
}

struct World {
    go: Vec<Sender<Job>>,
    done: Receiver<Result<(), String>>,
    threads: Vec<JoinHandle<()>>,
}

impl World {
    fn new(n: usize) -> World {
        let (done_tx, done) = channel();
        let mut go = Vec::new();
        let threads = tcp::loopback_world(n)
            .expect("loopback world")
            .into_iter()
            .map(|t| {
                let (tx, rx) = channel::<Job>();
                go.push(tx);
                let done_tx = done_tx.clone();
                std::thread::spawn(move || {
                    let mut pipe = t;
                    let mut buf = Vec::new();
                    while let Ok(job) = rx.recv() {
                        let res = (|| {
                            for _ in 0..job.iters {
                                buf.clear();
                                buf.resize(job.len, 1.0f32);
                                if job.pipelined {
                                    pipe.all_reduce_with(&mut buf, ReduceOp::Sum, job.algo)
                                } else {
                                    let mut lock = Lockstep(&mut pipe);
                                    lock.all_reduce_with(&mut buf, ReduceOp::Sum, job.algo)
                                }
                                .map_err(|e| e.to_string())?;
                            }
                            let want = pipe.world_size() as f32;
                            match buf.iter().position(|&x| x != want) {
                                Some(i) => Err(format!("element {i} is {} not {want}", buf[i])),
                                None => Ok(()),
                            }
                        })();
                        done_tx.send(res).unwrap();
                    }
                })
            })
            .collect();
        World { go, done, threads }
    }

    fn run(&self, job: Job) -> Duration {
        let start = Instant::now();
        for g in &self.go {
            g.send(job).unwrap();
        }
        for _ in &self.go {
            if let Err(e) = self.done.recv().unwrap() {
                panic!("all-reduce failed: {e}");
            }
        }
        start.elapsed()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.go.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn parse_size(s: &str) -> usize {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().expect("size") * mul
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

fn main() {
    let mut worlds = vec![2usize, 4];
    let mut sizes: Vec<usize> = ["4K", "64K", "1M", "16M", "64M"]
        .iter()
        .map(|s| parse_size(s))
        .collect();
    let mut algos = vec![Algorithm::Ring];
    let mut paths = vec![false, true];
    let mut secs = 0.3f64;
    let mut trials = 3;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let v = pair.get(1).map(String::as_str).unwrap_or("");
        match pair[0].as_str() {
            "--worlds" => worlds = v.split(',').map(|x| x.parse().unwrap()).collect(),
            "--sizes" => sizes = v.split(',').map(parse_size).collect(),
            "--algos" => algos = v.split(',').map(|x| x.parse().unwrap()).collect(),
            "--paths" => {
                paths = v
                    .split(',')
                    .map(|x| match x {
                        "lockstep" => false,
                        "pipelined" => true,
                        _ => panic!("path: lockstep|pipelined"),
                    })
                    .collect()
            }
            "--secs" => secs = v.parse().unwrap(),
            "--trials" => trials = v.parse().unwrap(),
            a => panic!("unknown argument {a}"),
        }
    }
    println!("| P | size | algorithm | path | time/op | bus GB/s |");
    println!("|---|---|---|---|---|---|");
    for &p in &worlds {
        let world = World::new(p);
        for &size in &sizes {
            let len = size / 4;
            // Calibrate each algorithm: iterations for about `secs` per timed run.
            let iters: Vec<u32> = algos
                .iter()
                .map(|&algo| {
                    let one = world.run(Job {
                        len,
                        algo,
                        pipelined: true,
                        iters: 1,
                    });
                    ((secs / one.as_secs_f64().max(1e-6)) as u32).clamp(1, 2000)
                })
                .collect();
            // Best of `trials`; algorithms and paths alternate within each trial.
            let mut best = vec![vec![Duration::MAX; paths.len()]; algos.len()];
            for _ in 0..trials {
                for (a, &algo) in algos.iter().enumerate() {
                    for (k, &pipelined) in paths.iter().enumerate() {
                        let t = world.run(Job {
                            len,
                            algo,
                            pipelined,
                            iters: iters[a],
                        }) / iters[a];
                        best[a][k] = best[a][k].min(t);
                    }
                }
            }
            for (a, &algo) in algos.iter().enumerate() {
                for (k, &pipelined) in paths.iter().enumerate() {
                    let t = best[a][k].as_secs_f64();
                    let bus = size as f64 * 2.0 * (p - 1) as f64 / p as f64 / t / 1e9;
                    println!(
                        "| {p} | {} | {algo} | {} | {:.1} us | {bus:.3} |",
                        human(size),
                        if pipelined { "pipelined" } else { "lockstep" },
                        t * 1e6
                    );
                }
            }
        }
    }
}
