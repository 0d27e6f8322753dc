//! One rank of the suite: the parameters every section sweeps, the seeded inputs, the
//! [`Tally`] of checks and mismatches, and [`rank_suite`], which runs the sections in order and
//! agrees on the outcome through MPI itself.

use std::time::{Duration, Instant};

use gradwire_collective::{Algorithm, ReduceOp};
use gradwire_transport::mpi::{Mpi, NativeOp};
use gradwire_transport::Transport;
use rand::{Rng, SeedableRng};

use crate::compressed::compressed_checks;
use crate::dense::{dense_checks, large_checks};
use crate::errors::error_checks;
use crate::groups::split_checks;
use crate::transport::transport_checks;

pub(crate) const ALGOS: [Algorithm; 4] = [
    Algorithm::Auto,
    Algorithm::Ring,
    Algorithm::RecursiveDoubling,
    Algorithm::Rabenseifner,
];
pub(crate) const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Min, ReduceOp::Max];
pub(crate) const SEGS: [usize; 2] = [8, gradwire_collective::select::DEFAULT_SEGMENT_BYTES];

pub(crate) fn rng(seed: u64, rank: usize, salt: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed ^ (rank as u64).wrapping_mul(0x9E37_79B9) ^ salt << 40)
}
pub(crate) fn ints_f32(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut g = rng(seed, rank, 1);
    (0..len).map(|_| g.gen_range(-64i32..64) as f32).collect()
}
pub(crate) fn ints_i32(seed: u64, rank: usize, len: usize) -> Vec<i32> {
    let mut g = rng(seed, rank, 2);
    (0..len).map(|_| g.gen_range(-1000..1000)).collect()
}
pub(crate) fn floats_f64(seed: u64, rank: usize, len: usize) -> Vec<f64> {
    let mut g = rng(seed, rank, 3);
    (0..len).map(|_| g.gen_range(-1.0..1.0)).collect()
}
pub(crate) fn floats_f32(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut g = rng(seed, rank, 4);
    (0..len).map(|_| g.gen_range(-1.0f32..1.0)).collect()
}

/// Mismatches found by this rank, and how many checks ran.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) errs: Vec<String>,
    pub(crate) checks: usize,
    /// A call failed: the message streams may be out of step, so the section stops here.
    pub(crate) broken: bool,
}

impl Tally {
    pub(crate) fn eq<E: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: &[E], want: &[E]) {
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
    pub(crate) fn ok(&mut self, what: &str, cond: bool) {
        self.checks += 1;
        if !cond {
            self.errs.push(what.to_string());
        }
    }
    pub(crate) fn res<T>(&mut self, what: &str, r: Result<T, impl std::fmt::Display>) -> Option<T> {
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
pub(crate) type Section = fn(&mut Mpi, &mut Tally);

pub(crate) fn rank_suite(np: usize) -> i32 {
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
