//! Unit tests of the `mpi` transport that need no launcher.

use super::launched_by_mpi;
use crate::Error;

/// Unit-testable without a launcher: the environment check (multi-rank behaviour is
/// tested under `mpirun` by `gradwire-collective`'s `mpi` test).
#[test]
fn launcher_detection_reads_known_variables() {
    let vars = crate::env::MPI_LAUNCHER_VARS;
    assert!(vars.contains(&"OMPI_COMM_WORLD_SIZE"));
    assert!(vars.contains(&"PMI_RANK"));
    // In a plain `cargo test` none is set; under a launcher all of them may be.
    let _ = launched_by_mpi();
}

#[test]
fn mpi_errors_name_the_peer() {
    let e = Error::Mpi {
        peer: Some(2),
        code: 15,
        message: "MPI_Test during receive: MPI_ERR_TRUNCATE".into(),
    };
    assert_eq!(e.peer(), Some(2));
    assert!(e.to_string().contains("with rank 2"), "{e}");
    let e = Error::Mpi {
        peer: None,
        code: 1,
        message: "MPI_Allreduce: x".into(),
    };
    assert_eq!(e.peer(), None);
}
