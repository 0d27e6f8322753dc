//! All-reduce timings with one process per rank over `tcp` or `shm`, timed exactly as
//! `gradwire bench allreduce` (and `scripts/bench-mpi.py` for Open MPI) times them: per
//! iteration a barrier, the all-reduce, the slowest rank's time; the median; bus bandwidth
//! `2 (P-1)/P · bytes / time`. Builds without the training stack, so the transports and
//! collectives can be timed in release quickly while they change.
//!
//! ```text
//! cargo run --release -p gradwire-collective --example allreduce_procs -- \
//!     tcp|shm NP 4KiB,64KiB,1MiB [algo]
//! ```
//! Prints one JSON object (`{"np":..,"transport":..,"results":[{"bytes","median_us",
//! "busbw_gbps"}]}`) on stdout. After the timed iterations of each size, every rank checks
//! one more all-reduce against the sum it must give (rank `r` contributes `(r + 1) · (j mod
//! 13)` at element `j`: small integers, exact in `f32`); a rank that finds a wrong element
//! fails, and so does the run.

use std::process::{Command, Stdio};
use std::time::Instant;

use gradwire_collective::{Algorithm, Collectives, ReduceOp};
use gradwire_transport::{shm, tcp, Transport};

fn parse_size(s: &str) -> usize {
    let s = s.trim().to_ascii_lowercase();
    let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
    let unit = &s[digits.len()..];
    let mult = match unit {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        _ => panic!("bad size {s}"),
    };
    digits.parse::<usize>().expect("size") * mult
}

/// Pins this process to core `rank mod cores` (what `mpirun` does by default for as many
/// ranks as cores), when `XP_BIND=1`.
fn bind(rank: usize) {
    if std::env::var("XP_BIND").as_deref() != Ok("1") {
        return;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it; the call only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(rank % cores, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn worker(kind: &str, sizes: &[usize], algo: Algorithm) {
    if let Ok(r) = std::env::var("GRADWIRE_RANK") {
        bind(r.parse().unwrap_or(0));
    }
    let mut t: Box<dyn Transport> = match kind {
        "tcp" => {
            let (cfg, _) = gradwire_transport::env::tcp_config_from_env()
                .expect("env")
                .expect("rank");
            Box::new(tcp::Tcp::connect(&cfg).expect("tcp connect"))
        }
        "shm" => {
            let cfg = shm::config_from_env().expect("env").expect("rank");
            Box::new(shm::Shm::connect(&cfg).expect("shm connect"))
        }
        _ => panic!("transport tcp|shm"),
    };
    let np = t.world_size();
    let mut out = Vec::new();
    for &bytes in sizes {
        let elems = bytes / 4;
        let iters = ((256usize << 20) / bytes).clamp(10, 200);
        let mut buf: Vec<f32> = (0..elems).map(|i| (i % 13) as f32).collect();
        let mut times = vec![0f64; iters];
        for i in 0..3 + iters {
            t.barrier().expect("barrier");
            let start = Instant::now();
            t.all_reduce_with(&mut buf, ReduceOp::Sum, algo)
                .expect("all-reduce");
            let dt = start.elapsed().as_secs_f64();
            if i >= 3 {
                times[i - 3] = dt;
            }
            if i % 8 == 7 {
                buf.iter_mut()
                    .enumerate()
                    .for_each(|(j, x)| *x = (j % 13) as f32);
            }
        }
        check(&mut *t, elems, algo);
        t.all_reduce(&mut times, ReduceOp::Max).expect("max");
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        let p = np as f64;
        out.push(format!(
            "{{\"bytes\":{bytes},\"median_us\":{:.2},\"busbw_gbps\":{:.4}}}",
            med * 1e6,
            bytes as f64 * 2.0 * (p - 1.0) / p / med / 1e9
        ));
    }
    if t.rank() == 0 {
        println!(
            "{{\"np\":{np},\"transport\":\"{kind}\",\"algo\":\"{algo}\",\"results\":[{}]}}",
            out.join(",")
        );
    }
}

/// One all-reduce of `elems` values against the reference sum (see the module doc).
fn check(t: &mut dyn Transport, elems: usize, algo: Algorithm) {
    let (rank, np) = (t.rank() as f32, t.world_size() as f32);
    let mut buf: Vec<f32> = (0..elems).map(|j| (rank + 1.0) * (j % 13) as f32).collect();
    t.all_reduce_with(&mut buf, ReduceOp::Sum, algo)
        .expect("all-reduce");
    let ranks_sum = np * (np + 1.0) / 2.0;
    for (j, &x) in buf.iter().enumerate() {
        let want = ranks_sum * (j % 13) as f32;
        assert_eq!(x, want, "rank {rank}: element {j} of {elems}");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let kind = args.first().map_or("shm", String::as_str).to_string();
    let np: usize = args.get(1).map_or(2, |s| s.parse().expect("np"));
    let sizes: Vec<usize> = args
        .get(2)
        .map_or("4KiB", String::as_str)
        .split(',')
        .map(parse_size)
        .collect();
    let algo: Algorithm = args
        .get(3)
        .map_or("auto", String::as_str)
        .parse()
        .expect("algo");
    if std::env::var("GRADWIRE_RANK").is_ok() {
        worker(&kind, &sizes, algo);
        return;
    }
    let exe = std::env::current_exe().expect("exe");
    let port = 20000 + (std::process::id() % 20000);
    let token = format!("procs-{}-{}", std::process::id(), rand::random::<u64>());
    let mut kids: Vec<_> = (0..np)
        .map(|r| {
            Command::new(&exe)
                .args(&args)
                .env("GRADWIRE_RANK", r.to_string())
                .env("GRADWIRE_WORLD_SIZE", np.to_string())
                .env("GRADWIRE_MASTER_ADDR", "127.0.0.1")
                .env("GRADWIRE_MASTER_PORT", port.to_string())
                .env("GRADWIRE_TOKEN", &token)
                .stdout(if r == 0 {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                })
                .spawn()
                .expect("spawn rank")
        })
        .collect();
    let mut ok = true;
    for k in &mut kids {
        ok &= k.wait().map(|s| s.success()).unwrap_or(false);
    }
    if !ok {
        // Leave no rank behind.
        for k in &mut kids {
            let _ = k.kill();
        }
        std::process::exit(1);
    }
}
