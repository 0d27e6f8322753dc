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
//!
//! Files: `launcher` (the launcher role), `suite` (one rank: inputs, tally, the sections in
//! order), one file per section (`transport`, `dense`, `compressed`, `groups`, `errors`), and
//! `bench` (the `--bench` comparison with MPI's native all-reduce).

mod bench;
mod compressed;
mod dense;
mod errors;
mod groups;
mod launcher;
mod suite;
mod transport;

use crate::bench::rank_bench;
use crate::launcher::launch;
use crate::suite::rank_suite;

pub(crate) const SUITE_FLAG: &str = "--mpi-suite";
pub(crate) const BENCH_FLAG: &str = "--mpi-bench";

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
