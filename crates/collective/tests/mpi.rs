//! The collective suite over the MPI transport, under `mpirun -np 2`, `3` and `4`.
//!
//! MPI initializes once per process, so this is one binary (`harness = false`) in two roles:
//! - run by `cargo test -p gradwire-collective --features mpi,test-util --test mpi`, it is
//!   the launcher: it starts `mpirun -np N <itself> --mpi-suite N` for N in 1, 2, 3, 4 (or
//!   `GRADWIRE_MPI_NP`), streams the ranks' output, kills the job (process group) after
//!   `GRADWIRE_MPI_TEST_TIMEOUT` seconds (default 300), and checks every rank's pass line.
//!   Without `mpirun` on the PATH (or `GRADWIRE_MPIRUN`) it skips loudly, unless
//!   `GRADWIRE_REQUIRE_MPI=1`, which makes that a failure.
//! - run under `mpirun` with `--mpi-suite N`, each process is one rank: it initializes MPI
//!   once and checks, against naive references computed from every rank's (seeded) input,
//!   the all-reduce of every algorithm, op and element type, reduce-scatter, all-gather,
//!   broadcast, variable-size all-gather, barrier, the compressed all-reduces with the codec
//!   examples, and the transport's own behaviour (ordering, any size, self-sends, named
//!   timeouts on stalled peers, size mismatches), then splits the world with `grid` (2
//!   partitions on even worlds, one replica otherwise) and checks the all-reduce on both
//!   groups at once, one thread each, against the oracle over each group's own members,
//!   and a group split again. Each rank prints
//!   `mpi suite: PASS rank R/N` or its mismatches, and exits non-zero on any.
//!
//! `-- --bench` instead times our all-reduce over the MPI transport against MPI's native
//! `MPI_Allreduce` at 4 KiB, 64 KiB, 1 MiB and 16 MiB for np 2 and 4 (use `--release`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gradwire_codec::{BuildContext, Codec, CodecConfig, SparseGrad};
use gradwire_collective::compressed::{
    GatherDecode, Leg, QuantizedAllReduce, Reduce, SparseAllReduce,
};
use gradwire_collective::{broadcast, chunks, gather, reference, Algorithm, Collectives, ReduceOp};
use gradwire_transport::mpi::{Mpi, NativeOp};
use gradwire_transport::split::{self, Group};
use gradwire_transport::{Error, Op, Transport};
use rand::{Rng, SeedableRng};

const SUITE_FLAG: &str = "--mpi-suite";
const BENCH_FLAG: &str = "--mpi-bench";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let after = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .map(|i| args.get(i + 1).and_then(|n| n.parse::<usize>().ok()))
    };
    if let Some(np) = after(SUITE_FLAG) {
        std::process::exit(rank_suite(np.expect("--mpi-suite N")));
    }
    if let Some(np) = after(BENCH_FLAG) {
        rank_bench(np.expect("--mpi-bench N"));
        return;
    }
    let bench = args.iter().any(|a| a == "--bench");
    std::process::exit(launch(bench));
}

// ---------------------------------------------------------------------------------------
// Launcher
// ---------------------------------------------------------------------------------------

/// Kills the job's process group when dropped (timeout, panic), so nothing is left behind.
struct JobGuard {
    child: std::process::Child,
    done: bool,
}

impl JobGuard {
    fn kill(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: signalling the process group we created for the job.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        if !self.done {
            self.kill();
        }
    }
}

fn find_mpirun() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("GRADWIRE_MPIRUN") {
        return Some(p.into());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("mpirun"))
        .find(|p| p.is_file())
}

fn launch(bench: bool) -> i32 {
    let Some(mpirun) = find_mpirun() else {
        if std::env::var("GRADWIRE_REQUIRE_MPI").as_deref() == Ok("1") {
            eprintln!("mpi test: FAILED: mpirun not found but GRADWIRE_REQUIRE_MPI=1");
            return 1;
        }
        eprintln!();
        eprintln!("************************************************************************");
        eprintln!("* mpi test: SKIPPED: mpirun is not on the PATH (set GRADWIRE_MPIRUN,   *");
        eprintln!("* or GRADWIRE_REQUIRE_MPI=1 to make this a failure). Nothing was run.  *");
        eprintln!("************************************************************************");
        eprintln!();
        return 0;
    };
    let version = Command::new(&mpirun)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let open_mpi = version.contains("Open MPI") || version.contains("OpenRTE");
    let nps: Vec<usize> = match std::env::var("GRADWIRE_MPI_NP") {
        Ok(s) => s
            .split(',')
            .map(|x| x.trim().parse().expect("GRADWIRE_MPI_NP"))
            .collect(),
        Err(_) if bench => vec![2, 4],
        Err(_) => vec![1, 2, 3, 4],
    };
    let limit = Duration::from_secs_f64(
        std::env::var("GRADWIRE_MPI_TEST_TIMEOUT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300.0),
    );
    if !gradwire_transport::mpi::launched_by_mpi() {
        // Outside a launcher, from_env declines without initializing MPI.
        assert!(
            matches!(Mpi::from_env(), Ok(None)),
            "from_env outside mpirun"
        );
    }
    let exe = std::env::current_exe().expect("own path");
    let mut failed = 0;
    for np in nps {
        let t0 = Instant::now();
        let mut cmd = Command::new(&mpirun);
        cmd.arg("-np").arg(np.to_string());
        if open_mpi {
            cmd.arg("--oversubscribe");
            for (k, v) in [
                ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
                ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
                ("OMPI_MCA_rmaps_base_oversubscribe", "1"),
                // Containers often block process_vm_readv (Open MPI's single-copy mode).
                ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
            ] {
                if std::env::var_os(k).is_none() {
                    cmd.env(k, v);
                }
            }
        }
        let flag = if bench { BENCH_FLAG } else { SUITE_FLAG };
        cmd.arg(&exe).arg(flag).arg(np.to_string());
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        eprintln!("mpi test: {cmd:?}");
        let child = cmd.spawn().expect("spawning mpirun");
        let mut job = JobGuard { child, done: false };
        let stdout = job.child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut passes = 0;
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                println!("{line}");
                if line.starts_with("mpi suite: PASS") {
                    passes += 1;
                }
            }
            passes
        });
        let status = loop {
            if let Some(s) = job.child.try_wait().expect("waiting for mpirun") {
                break Some(s);
            }
            if t0.elapsed() > limit {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let Some(status) = status else {
            eprintln!("mpi test: np {np}: FAILED: no result after {limit:?}, killing the job");
            job.kill();
            job.done = true;
            failed += 1;
            continue;
        };
        job.done = true;
        let passes = reader.join().unwrap_or(0);
        let took = t0.elapsed();
        if !status.success() || (!bench && passes != np) {
            eprintln!("mpi test: np {np}: FAILED ({status}, {passes}/{np} ranks passed)");
            failed += 1;
        } else {
            eprintln!("mpi test: np {np}: ok in {took:.1?}");
        }
    }
    if failed == 0 {
        0
    } else {
        1
    }
}

// ---------------------------------------------------------------------------------------
// One rank of the suite
// ---------------------------------------------------------------------------------------

const ALGOS: [Algorithm; 4] = [
    Algorithm::Auto,
    Algorithm::Ring,
    Algorithm::RecursiveDoubling,
    Algorithm::Rabenseifner,
];
const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max];
const SEGS: [usize; 2] = [8, gradwire_collective::select::DEFAULT_SEGMENT_BYTES];

fn rng(seed: u64, rank: usize, salt: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed ^ (rank as u64).wrapping_mul(0x9E37_79B9) ^ salt << 40)
}
fn ints_f32(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut g = rng(seed, rank, 1);
    (0..len).map(|_| g.gen_range(-64i32..64) as f32).collect()
}
fn ints_i32(seed: u64, rank: usize, len: usize) -> Vec<i32> {
    let mut g = rng(seed, rank, 2);
    (0..len).map(|_| g.gen_range(-1000..1000)).collect()
}
fn floats_f64(seed: u64, rank: usize, len: usize) -> Vec<f64> {
    let mut g = rng(seed, rank, 3);
    (0..len).map(|_| g.gen_range(-1.0..1.0)).collect()
}
fn floats_f32(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut g = rng(seed, rank, 4);
    (0..len).map(|_| g.gen_range(-1.0f32..1.0)).collect()
}

/// Mismatches found by this rank, and how many checks ran.
#[derive(Default)]
struct Tally {
    errs: Vec<String>,
    checks: usize,
    /// A call failed: the message streams may be out of step, so the section stops here.
    broken: bool,
}

impl Tally {
    fn eq<E: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: &[E], want: &[E]) {
        self.checks += 1;
        if got != want {
            let show = |v: &[E]| format!("{:?}", &v[..v.len().min(8)]);
            self.errs.push(format!(
                "{what}: got {} (len {}), want {} (len {})",
                show(got),
                got.len(),
                show(want),
                want.len()
            ));
        }
    }
    fn ok(&mut self, what: &str, cond: bool) {
        self.checks += 1;
        if !cond {
            self.errs.push(what.to_string());
        }
    }
    fn res<T>(&mut self, what: &str, r: Result<T, impl std::fmt::Display>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.checks += 1;
                self.broken = true;
                self.errs.push(format!("{what}: {e}"));
                None
            }
        }
    }
}

/// One part of the suite, run by every rank.
type Section = fn(&mut Mpi, &mut Tally);

fn rank_suite(np: usize) -> i32 {
    let mut t = Mpi::init().expect("initializing MPI");
    let (rank, world) = (t.rank(), t.world_size());
    assert_eq!(
        world, np,
        "mpirun -np {np} gave a world of {world} (singletons?)"
    );
    // Short enough that a broken run fails in seconds, long enough for 4 ranks on 2 cores.
    t.set_timeout(Duration::from_secs(10));
    if rank == 0 {
        println!(
            "mpi suite: {} ranks, {}",
            world,
            t.library_version().lines().next().unwrap_or("")
        );
    }
    let mut tally = Tally::default();
    let sections: [(&str, Section); 6] = [
        ("transport", transport_checks),
        ("dense", dense_checks),
        ("large", large_checks),
        ("compressed", compressed_checks),
        ("split", split_checks),
        ("errors", error_checks),
    ];
    for (name, f) in sections {
        let t0 = Instant::now();
        let before = tally.checks;
        f(&mut t, &mut tally);
        // Every rank learns whether a call failed anywhere (through MPI itself).
        let mut broken = [f32::from(u8::from(tally.broken))];
        t.native_all_reduce_f32(&mut broken, NativeOp::Max)
            .expect("MPI_Allreduce");
        if rank == 0 {
            println!(
                "mpi suite: rank 0: {name}: {} checks in {:.2?}",
                tally.checks - before,
                t0.elapsed()
            );
        }
        if broken[0] > 0.0 {
            println!("mpi suite: rank {rank}: a call failed in section {name}; stopping");
            tally.broken = true;
            break;
        }
    }
    // Agree on the outcome through MPI itself (independent of our collectives).
    let mut bad = [(tally.errs.len() + usize::from(tally.broken)) as f32];
    t.native_all_reduce_f32(&mut bad, NativeOp::Sum)
        .expect("MPI_Allreduce");
    for e in tally.errs.iter().take(20) {
        println!("mpi suite: rank {rank}: MISMATCH {e}");
    }
    if bad[0] == 0.0 {
        println!(
            "mpi suite: PASS rank {rank}/{world} ({} checks, {} bytes sent)",
            tally.checks,
            t.bytes_sent()
        );
        0
    } else {
        println!(
            "mpi suite: FAIL rank {rank}/{world}: {} mismatches here, {} in the job",
            tally.errs.len(),
            bad[0]
        );
        1
    }
}

/// The transport itself: ordering, any size (eager and rendezvous), self-sends, bytes_sent,
/// size mismatch, invalid ranks, named timeouts on a stalled peer (receive and send).
fn transport_checks(t: &mut Mpi, k: &mut Tally) {
    let (me, n) = (t.rank(), t.world_size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let payload = |from: usize, i: usize, len: usize| -> Vec<u8> {
        (0..len).map(|j| (from * 31 + i * 7 + j) as u8).collect()
    };
    let sizes = [0usize, 1, 4095, 4096, 65_537, 3 << 20];
    let mut buf = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        if k.broken {
            return;
        }
        let before = t.bytes_sent();
        if k.res(
            "send_recv",
            t.send_recv(right, &payload(me, i, len), left, &mut buf),
        )
        .is_some()
        {
            k.eq(
                &format!("ring send_recv len {len}"),
                &buf,
                &payload(left, i, len),
            );
        }
        k.ok(
            "bytes_sent counts payload",
            t.bytes_sent() - before == len as u64,
        );
        let mut out = vec![0u8; len];
        if k.res(
            "send_recv_into",
            t.send_recv_into(left, &payload(me, i, len), right, &mut out),
        )
        .is_some()
        {
            k.eq(
                &format!("reverse send_recv_into len {len}"),
                &out,
                &payload(right, i, len),
            );
        }
        // To itself.
        if k.res(
            "self send_recv",
            t.send_recv(me, &payload(me, i, len), me, &mut buf),
        )
        .is_some()
        {
            k.eq("self send_recv", &buf, &payload(me, i, len));
        }
    }
    // Many messages in a row keep their order (sends to the right complete eagerly).
    for i in 0..5 {
        if me % 2 == 0 {
            k.res("send", t.send(right, &payload(me, i, 100)));
            k.res("recv", t.recv(left, &mut buf));
            k.eq("ordered recv", &buf, &payload(left, i, 100));
        } else {
            k.res("recv", t.recv(left, &mut buf));
            k.eq("ordered recv", &buf, &payload(left, i, 100));
            k.res("send", t.send(right, &payload(me, i, 100)));
        }
    }
    k.ok(
        "invalid rank",
        matches!(t.send(n + 3, b"x"), Err(Error::InvalidRank { rank, .. }) if rank == n + 3),
    );
    // A receive into a slice of the wrong length names the sender and consumes the message.
    k.res("send", t.send(right, &[1, 2, 3]));
    let mut two = [0u8; 2];
    let err = t.recv_into(left, &mut two);
    k.ok(
        &format!("size mismatch names rank {left}: {err:?}"),
        matches!(err, Err(Error::SizeMismatch { peer, expected: 2, got: 3 }) if peer == left),
    );
    t.native_barrier().expect("barrier");

    // A stalled peer is named within the deadline: rank 1 sleeps while rank 0 waits on it.
    let short = Duration::from_millis(300);
    let normal = t.timeout();
    if n < 2 {
        return;
    }
    if me == 0 {
        t.set_timeout(short);
        let t0 = Instant::now();
        let err = t.recv(1, &mut buf);
        let took = t0.elapsed();
        k.ok(
            &format!("stalled peer: {err:?} after {took:?}"),
            matches!(
                err,
                Err(Error::Timeout {
                    peer: 1,
                    op: Op::Recv,
                    ..
                })
            ) && took < short + Duration::from_secs(2),
        );
        // A send the peer does not take (large: no eager copy) times out too, and its
        // buffer stays with the transport until the peer takes it late.
        let big = payload(0, 9, 4 << 20);
        let t0 = Instant::now();
        let err = t.send(1, &big);
        let took = t0.elapsed();
        k.ok(
            &format!("stalled receiver: {err:?} after {took:?}"),
            matches!(
                err,
                Err(Error::Timeout {
                    peer: 1,
                    op: Op::Send,
                    ..
                })
            ) && took < short + Duration::from_secs(2),
        );
        drop(big); // our copy is gone; MPI reads the transport's staging buffer
        t.set_timeout(normal);
        // Keep MPI progressing until rank 1 has taken the message.
        k.res("ack", t.recv(1, &mut buf));
    } else if me == 1 {
        std::thread::sleep(short * 3);
        if k.res("late recv", t.recv(0, &mut buf)).is_some() {
            k.eq(
                "late recv of a stranded send",
                &buf,
                &payload(0, 9, 4 << 20),
            );
        }
        k.res("ack", t.send(0, b"ok"));
    }
    t.native_barrier().expect("barrier");
}

fn dense_checks(t: &mut Mpi, k: &mut Tally) {
    let (rank, world) = (t.rank(), t.world_size());
    let lens = [0usize, 1, 2, 3, 5, 7, 13, 31, 97, 1000];
    for (i, &len) in lens.iter().enumerate() {
        let seed = 0x6d70_6900 + i as u64 * 977;
        battery(t, k, len, seed);
        if k.broken {
            return;
        }
    }
    // Float sums (order-dependent bits) agree across ranks.
    let mut bits = Vec::new();
    for algo in ALGOS {
        let mut b = floats_f32(5, rank, 777);
        if k.res(
            "float all_reduce",
            gradwire_collective::all_reduce(t, &mut b, ReduceOp::Sum, algo, 64),
        )
        .is_some()
        {
            bits.extend(b.iter().flat_map(|x| x.to_bits().to_le_bytes()));
        }
    }
    let mut all = Vec::new();
    if k.res("all_gather_bytes", t.all_gather_bytes(&bits, &mut all))
        .is_some()
    {
        for (r, b) in all.iter().enumerate() {
            k.ok(
                &format!("rank {r}'s float sums differ from rank {rank}'s"),
                *b == bits,
            );
        }
    }
    let _ = world;
}

/// One rank's battery for (len, seed), as the in-process property suite runs it.
fn battery(t: &mut Mpi, k: &mut Tally, len: usize, seed: u64) {
    let (rank, world) = (t.rank(), t.world_size());
    let all = |f: &dyn Fn(usize) -> Vec<f32>| -> Vec<Vec<f32>> { (0..world).map(f).collect() };
    let in_f32 = all(&|r| ints_f32(seed, r, len));
    let in_i32: Vec<Vec<i32>> = (0..world).map(|r| ints_i32(seed, r, len)).collect();
    let in_f64: Vec<Vec<f64>> = (0..world).map(|r| floats_f64(seed, r, len)).collect();
    for algo in ALGOS {
        for seg in SEGS {
            if k.broken {
                return;
            }
            for op in OPS {
                let tag = format!("len {len} {algo} seg {seg} {op}");
                let mut b = in_f32[rank].clone();
                if k.res(
                    &tag,
                    gradwire_collective::all_reduce(t, &mut b, op, algo, seg),
                )
                .is_some()
                {
                    k.eq(
                        &format!("{tag} f32"),
                        &b,
                        &reference::all_reduce(&in_f32, op),
                    );
                }
                let mut b = in_i32[rank].clone();
                if k.res(
                    &tag,
                    gradwire_collective::all_reduce(t, &mut b, op, algo, seg),
                )
                .is_some()
                {
                    k.eq(
                        &format!("{tag} i32"),
                        &b,
                        &reference::all_reduce(&in_i32, op),
                    );
                }
            }
            let tag = format!("len {len} {algo} seg {seg}");
            let mut b = in_f64[rank].clone();
            if k.res(
                &tag,
                gradwire_collective::all_reduce(t, &mut b, ReduceOp::Sum, algo, seg),
            )
            .is_some()
            {
                let want = reference::all_reduce(&in_f64, ReduceOp::Sum);
                k.ok(
                    &format!("{tag} f64 within 1e-9"),
                    b.len() == want.len()
                        && b.iter().zip(&want).all(|(x, y)| (x - y).abs() <= 1e-9),
                );
            }
            for op in [ReduceOp::Sum, ReduceOp::Mean] {
                let mut b = in_f32[rank].clone();
                if let Some(r) = k.res(
                    &tag,
                    gradwire_collective::reduce_scatter(t, &mut b, op, algo, seg),
                ) {
                    k.ok(
                        &format!("{tag} reduce_scatter range"),
                        r == chunks::range(len, world, rank),
                    );
                    if r == chunks::range(len, world, rank) {
                        k.eq(
                            &format!("{tag} reduce_scatter {op}"),
                            &b[r],
                            &reference::reduce_scatter(&in_f32, op, rank),
                        );
                    }
                }
            }
            let mut b = in_i32[rank].clone();
            if k.res(&tag, gradwire_collective::all_gather(t, &mut b, algo, seg))
                .is_some()
            {
                k.eq(
                    &format!("{tag} all_gather"),
                    &b,
                    &reference::all_gather(&in_i32),
                );
            }
        }
    }
    for seg in SEGS {
        for root in [0, world - 1, world / 2] {
            let tag = format!("len {len} seg {seg} root {root}");
            let want = &in_f32[root];
            let mut b = in_f32[rank].clone();
            if k.res(&tag, broadcast::binomial(t, &mut b, root, seg))
                .is_some()
            {
                k.eq(&format!("{tag} binomial"), &b, want);
            }
            let mut b = in_f32[rank].clone();
            if k.res(&tag, broadcast::scatter_all_gather(t, &mut b, root, seg))
                .is_some()
            {
                k.eq(&format!("{tag} scatter+allgather"), &b, want);
            }
            let mut b = in_f32[rank].clone();
            if k.res(&tag, broadcast::broadcast(t, &mut b, root, seg))
                .is_some()
            {
                k.eq(&format!("{tag} broadcast"), &b, want);
            }
            let payload = |r: usize| vec![r as u8; (len + r * 3) % 17];
            let mut b = if rank == root {
                payload(root)
            } else {
                vec![9; 3]
            };
            if k.res(
                &tag,
                broadcast::broadcast_bytes(
                    t,
                    &mut b,
                    root,
                    seg,
                    broadcast::DEFAULT_MAX_BROADCAST_BYTES,
                ),
            )
            .is_some()
            {
                k.eq(&format!("{tag} broadcast_bytes"), &b, &payload(root));
            }
        }
        let mut out = vec![0i32; len * world];
        if k.res(
            "all_gather_into",
            gather::all_gather_into(t, &in_i32[rank], &mut out, seg),
        )
        .is_some()
        {
            k.eq(
                &format!("len {len} seg {seg} all_gather_into"),
                &out,
                &reference::concat(&in_i32),
            );
        }
    }
    let mut out = vec![vec![1u8; 5]; 2];
    for round in 0..2usize {
        let payload = |r: usize| -> Vec<u8> {
            (0..(len + 7 * r + round) % 23)
                .map(|i| (i + r) as u8)
                .collect()
        };
        if k.res(
            "all_gather_bytes",
            t.all_gather_bytes(&payload(rank), &mut out),
        )
        .is_some()
        {
            let want: Vec<Vec<u8>> = (0..world).map(payload).collect();
            k.ok(
                &format!("len {len} all_gather_bytes round {round}"),
                out == want,
            );
        }
    }
    k.res("barrier", t.barrier());
}

/// Sizes past the automatic thresholds, through the public trait (default segments).
fn large_checks(t: &mut Mpi, k: &mut Tally) {
    let (r, world) = (t.rank(), t.world_size());
    for len in [20_000usize, 300_001] {
        if k.broken {
            return;
        }
        let inputs: Vec<Vec<f32>> = (0..world).map(|q| ints_f32(7, q, len)).collect();
        let mut b = inputs[r].clone();
        if k.res("all_reduce", t.all_reduce(&mut b, ReduceOp::Sum))
            .is_some()
        {
            k.eq(
                &format!("large all_reduce {len}"),
                &b,
                &reference::all_reduce(&inputs, ReduceOp::Sum),
            );
        }
        let mut c = inputs[r].clone();
        if k.res("broadcast", t.broadcast(&mut c, world - 1)).is_some() {
            k.eq(&format!("large broadcast {len}"), &c, &inputs[world - 1]);
        }
        let mut d = inputs[r].clone();
        if let Some(mine) = k.res("reduce_scatter", t.reduce_scatter(&mut d, ReduceOp::Max)) {
            d[mine.clone()].copy_from_slice(&reference::reduce_scatter(&inputs, ReduceOp::Max, r));
            if k.res("all_gather", t.all_gather(&mut d)).is_some() {
                k.eq(
                    &format!("large rs+ag {len}"),
                    &d,
                    &reference::all_reduce(&inputs, ReduceOp::Max),
                );
            }
        }
    }
}

// ---- compressed all-reduces with the codec crate's examples ----

const SEED: u64 = 0x5eed;

fn grad(rank: usize, step: usize, len: usize) -> Vec<f32> {
    let mut g = rand::rngs::StdRng::seed_from_u64(((rank * 131 + step) as u64) << 20 | len as u64);
    (0..len)
        .map(|_| g.gen_range(-40i32..40) as f32 * 0.25)
        .collect()
}

fn ctx(rank: usize, world: usize, salt: u64) -> BuildContext {
    BuildContext {
        seed: SEED ^ salt,
        rank,
        world_size: world,
        layout: Vec::new(),
        ..Default::default()
    }
}

fn quantized_factory(
    cfg: &CodecConfig,
    rank: usize,
    world: usize,
) -> impl FnMut(Leg, usize) -> Box<dyn Codec> + '_ {
    move |leg, chunk| {
        let salt = (chunk as u64 + 1) << 8 | u64::from(leg == Leg::AllGather);
        cfg.build(&ctx(rank, world, salt))
    }
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|x| x.iter().map(|y| y.to_bits()).collect())
        .collect()
}

fn compressed_checks(t: &mut Mpi, k: &mut Tally) {
    let (rank, world) = (t.rank(), t.world_size());
    const STEPS: usize = 2;
    for cfg in CodecConfig::examples() {
        let (needs_scalar, sparsifies) = (cfg.needs_shared_scalars(), cfg.sparsifies());
        for len in [0usize, 1, 37, 1000] {
            if k.broken {
                return;
            }
            // Gather-decode: every rank decodes every payload, in rank order.
            let mut codecs: Vec<Box<dyn Codec>> =
                (0..world).map(|r| cfg.build(&ctx(r, world, 0))).collect();
            let mut want = Vec::new();
            for step in 0..STEPS {
                let grads: Vec<Vec<f32>> = (0..world).map(|r| grad(r, step, len)).collect();
                let shared = codecs
                    .iter_mut()
                    .zip(&grads)
                    .filter_map(|(c, g)| c.shared_scalars().map(|s| s.local_scalars(g)))
                    .reduce(|a, b| a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect());
                let mut acc = vec![0.0f32; len];
                let mut payloads = Vec::new();
                for r in 0..world {
                    if let (Some(s), Some(c)) = (&shared, codecs[r].shared_scalars()) {
                        c.set_shared_scalars(s);
                    }
                    let mut p = Vec::new();
                    codecs[r].encode(&grads[r], &mut p);
                    payloads.push(p);
                }
                for p in &payloads {
                    codecs[0].decode_add(p, &mut acc).expect("decode");
                }
                acc.iter_mut().for_each(|x| *x /= world as f32);
                want.push(acc);
            }
            let mut codec = cfg.build(&ctx(rank, world, 0));
            let mut g = GatherDecode::new();
            let got: Result<Vec<Vec<f32>>, _> = (0..STEPS)
                .map(|step| {
                    let mut b = grad(rank, step, len);
                    g.all_reduce(t, &mut *codec, &mut b, Reduce::Mean)
                        .map(|()| b)
                })
                .collect();
            if let Some(got) = k.res(&format!("{cfg} gather-decode len {len}"), got) {
                k.eq(
                    &format!("{cfg} gather-decode len {len}"),
                    &bits(&got),
                    &bits(&want),
                );
            }

            if !needs_scalar {
                quantized_one(t, k, &cfg, len, STEPS);
            }
            if sparsifies {
                let mut codecs: Vec<Box<dyn Codec>> =
                    (0..world).map(|r| cfg.build(&ctx(r, world, 0))).collect();
                let mut want = Vec::new();
                for step in 0..STEPS {
                    let mut acc = vec![0.0f32; len];
                    let mut s = SparseGrad::default();
                    for (r, c) in codecs.iter_mut().enumerate() {
                        let c = c.sparse_encode().expect("a sparsifier");
                        c.encode_sparse(&grad(r, step, len), &mut s);
                        for (&i, &v) in s.indices.iter().zip(&s.values) {
                            acc[i as usize] += v;
                        }
                    }
                    want.push(acc);
                }
                let mut codec = cfg.build(&ctx(rank, world, 0));
                let mut sa = SparseAllReduce::new();
                let got: Result<Vec<Vec<f32>>, _> = (0..STEPS)
                    .map(|step| {
                        let mut b = grad(rank, step, len);
                        sa.all_reduce(t, &mut *codec, &mut b, Reduce::Sum)
                            .map(|()| b)
                    })
                    .collect();
                if let Some(got) = k.res(&format!("{cfg} sparse len {len}"), got) {
                    k.eq(&format!("{cfg} sparse len {len}"), &got, &want);
                }
            }
        }
    }
}

/// The quantized ring (Dryden) against a step-by-step simulation with independent codecs.
fn quantized_one(t: &mut Mpi, k: &mut Tally, cfg: &CodecConfig, len: usize, steps: usize) {
    let (rank, world) = (t.rank(), t.world_size());
    let mut rs: Vec<Vec<Box<dyn Codec>>> = (0..world)
        .map(|r| {
            let mut f = quantized_factory(cfg, r, world);
            (0..world).map(|c| f(Leg::ReduceScatter, c)).collect()
        })
        .collect();
    let mut ag: Vec<Box<dyn Codec>> = (0..world)
        .map(|r| quantized_factory(cfg, r, world)(Leg::AllGather, r))
        .collect();
    let mut want = Vec::new();
    for step in 0..steps {
        let bufs: Vec<Vec<f32>> = (0..world).map(|r| grad(r, step, len)).collect();
        want.push(reference::quantized_ring(&mut rs, &mut ag, bufs));
    }
    let mut q = QuantizedAllReduce::new(len, rank, world, quantized_factory(cfg, rank, world));
    let got: Result<Vec<Vec<f32>>, _> = (0..steps)
        .map(|step| {
            let mut b = grad(rank, step, len);
            q.all_reduce(t, &mut b, Reduce::Sum).map(|()| b)
        })
        .collect();
    if let Some(got) = k.res(&format!("{cfg} quantized len {len}"), got) {
        k.eq(
            &format!("{cfg} quantized len {len}"),
            &bits(&got),
            &bits(&want),
        );
    }
}

/// Last (they leave messages in flight): ranks that disagree on a length fail, naming a
/// rank, instead of hanging; a bad root is refused.
/// Global rank `g`'s input to a group's all-reduce: bit `g` plus a multiple of 64, so a
/// sum is exact in any order and its low bits say which ranks were summed.
fn tagged(g: usize, round: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((1usize << g) + 64 * (round * 5 + i % 97)) as f32)
        .collect()
}

/// The checks of one group whose members (by group rank) must be the global ranks
/// `members`: every algorithm's all-reduce and a broadcast, against the oracle over those
/// members' inputs. Returns its own tally, which [`merge`] adds to the rank's.
fn group_checks(g: &mut Group, members: &[usize], me: usize) -> Tally {
    let mut k = Tally::default();
    let label = g.label().to_string();
    k.eq(&format!("{label}: members"), g.members(), members);
    k.ok(
        &format!("{label}: group rank {} is not global rank {me}", g.rank()),
        members.get(g.rank()) == Some(&me),
    );
    for (round, algo) in ALGOS.into_iter().enumerate() {
        for len in [1usize, 1000, 70_001] {
            let mut buf = tagged(me, round, len);
            let what = format!("{label}: {algo} all-reduce of {len}");
            if k.res(&what, g.all_reduce_with(&mut buf, ReduceOp::Sum, algo))
                .is_none()
            {
                return k;
            }
            let inputs: Vec<Vec<f32>> = members.iter().map(|&m| tagged(m, round, len)).collect();
            k.eq(&what, &buf, &reference::all_reduce(&inputs, ReduceOp::Sum));
        }
    }
    let root = members.len() - 1;
    let mut buf = tagged(me, 9, 3000);
    let what = format!("{label}: broadcast from group rank {root}");
    if k.res(&what, g.broadcast(&mut buf, root)).is_some() {
        k.eq(&what, &buf, &tagged(members[root], 9, 3000));
    }
    k
}

/// Adds a group's tally to the rank's.
fn merge(k: &mut Tally, g: Tally) {
    k.checks += g.checks;
    k.errs.extend(g.errs);
    k.broken |= g.broken;
}

/// `grid` over MPI: both groups of every rank used at once from two threads (which needs
/// MPI_THREAD_MULTIPLE; without it, the split's refusal), then a partition group split
/// again by the parity of the replica index, and the world still reducing over everyone.
fn split_checks(t: &mut Mpi, k: &mut Tally) {
    let (me, n) = (t.rank(), t.world_size());
    if !t.thread_multiple() {
        // Groups need MPI_THREAD_MULTIPLE: without it the split is refused by name (on every
        // rank, before any message moves).
        let err = split::split(t, 0, 0).map(|_| ()).map_err(|e| e.to_string());
        k.ok(
            &format!("split without MPI_THREAD_MULTIPLE refused by name: {err:?}"),
            matches!(&err, Err(e) if e.contains("MPI_THREAD_MULTIPLE")),
        );
        if me == 0 {
            println!("mpi suite: the library lacks MPI_THREAD_MULTIPLE; groups not checked");
        }
        return;
    }
    let partitions = if n % 2 == 0 { 2 } else { n };
    let replicas = n / partitions;
    let Some((mut rep, mut part)) = k.res("grid", split::grid(t, replicas, partitions)) else {
        return;
    };
    let (r, j) = (me / partitions, me % partitions);
    let rep_members: Vec<usize> = (0..partitions).map(|q| r * partitions + q).collect();
    let part_members: Vec<usize> = (0..replicas).map(|q| q * partitions + j).collect();
    k.eq(
        "replica label",
        &[rep.label()],
        &[format!("replica {r}").as_str()],
    );
    k.eq(
        "partition label",
        &[part.label()],
        &[format!("partition group {j}").as_str()],
    );
    k.ok("group deadline", rep.timeout() == t.timeout());
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| group_checks(&mut rep, &rep_members, me));
        let b = s.spawn(|| group_checks(&mut part, &part_members, me));
        (
            a.join().expect("replica thread"),
            b.join().expect("partition thread"),
        )
    });
    merge(k, a);
    merge(k, b);
    // The partition group split again by the parity of the replica index.
    let Some(mut sub) = k.res("nested split", split::split(&mut part, (r % 2) as u32, 0)) else {
        return;
    };
    let sub_members: Vec<usize> = part_members
        .iter()
        .copied()
        .filter(|g| (g / partitions) % 2 == r % 2)
        .collect();
    merge(k, group_checks(&mut sub, &sub_members, me));
    drop((sub, rep, part));
    let mut buf = tagged(me, 11, 500);
    if k.res(
        "world all-reduce after the split",
        t.all_reduce(&mut buf, ReduceOp::Sum),
    )
    .is_some()
    {
        let inputs: Vec<Vec<f32>> = (0..n).map(|g| tagged(g, 11, 500)).collect();
        k.eq(
            "world all-reduce after the split",
            &buf,
            &reference::all_reduce(&inputs, ReduceOp::Sum),
        );
    }
}

fn error_checks(t: &mut Mpi, k: &mut Tally) {
    let rank = t.rank();
    let err = t.broadcast(&mut [1.0f32], 99).map_err(|e| e.to_string());
    k.ok(
        &format!("bad root refused: {err:?}"),
        matches!(&err, Err(e) if e.contains("root 99")),
    );
    if t.world_size() < 2 {
        return; // one rank cannot disagree with itself
    }
    t.set_timeout(Duration::from_secs(2));
    let mut b = vec![1i32; 10 + rank];
    let res = t.all_reduce_with(&mut b, ReduceOp::Sum, Algorithm::Ring);
    // With different lengths some rank must fail, and every failure names a rank.
    let mut failed = [f32::from(u8::from(res.is_err()))];
    t.native_all_reduce_f32(&mut failed, NativeOp::Sum)
        .expect("MPI_Allreduce");
    k.ok("length mismatch went unnoticed", failed[0] > 0.0);
    if let Err(e) = res {
        k.ok(
            &format!("length mismatch error names a rank: {e}"),
            e.peer().is_some(),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Benchmark: ours over the MPI transport vs MPI_Allreduce
// ---------------------------------------------------------------------------------------

fn rank_bench(np: usize) {
    let mut t = Mpi::init().expect("initializing MPI");
    let (rank, world) = (t.rank(), t.world_size());
    assert_eq!(world, np);
    if rank == 0 {
        println!("all-reduce f32 sum, np {world}; median over iterations of the slowest rank;");
        println!("bus bandwidth = 2(P-1)/P * bytes / time (nccl-tests convention)");
        println!(
            "{:>8} {:>12} {:>10} {:>12} {:>10} {:>7}",
            "size", "ours us", "ours GB/s", "native us", "nat GB/s", "ratio"
        );
    }
    for size in [4usize << 10, 64 << 10, 1 << 20, 16 << 20] {
        let n = size / 4;
        let iters = ((256usize << 20) / size).clamp(10, 200);
        let mut buf: Vec<f32> = (0..n).map(|i| (i % 13) as f32).collect();
        let mut time = |t: &mut Mpi, native: bool| -> f64 {
            let mut samples = Vec::with_capacity(iters);
            for i in 0..iters + 3 {
                t.native_barrier().expect("barrier");
                let t0 = Instant::now();
                if native {
                    t.native_all_reduce_f32(&mut buf, NativeOp::Sum)
                        .expect("native");
                } else {
                    t.all_reduce(&mut buf, ReduceOp::Sum).expect("ours");
                }
                let mut dt = [t0.elapsed().as_secs_f32()];
                t.native_all_reduce_f32(&mut dt, NativeOp::Max)
                    .expect("max");
                if i >= 3 {
                    samples.push(dt[0] as f64);
                }
            }
            samples.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
            samples[samples.len() / 2]
        };
        let ours = time(&mut t, false);
        let native = time(&mut t, true);
        if rank == 0 {
            let bus = |s: f64| 2.0 * (world as f64 - 1.0) / world as f64 * size as f64 / s / 1e9;
            println!(
                "{:>8} {:>12.1} {:>10.2} {:>12.1} {:>10.2} {:>7.2}",
                human(size),
                ours * 1e6,
                bus(ours),
                native * 1e6,
                bus(native),
                ours / native
            );
        }
    }
}

fn human(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{}MiB", b >> 20)
    } else {
        format!("{}KiB", b >> 10)
    }
}
