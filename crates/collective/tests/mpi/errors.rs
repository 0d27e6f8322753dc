//! The errors section (last: it leaves messages in flight).

use std::time::Duration;

use gradwire_collective::{Algorithm, Collectives, ReduceOp};
use gradwire_transport::mpi::{Mpi, NativeOp};
use gradwire_transport::Transport;

use crate::suite::Tally;

/// Last (they leave messages in flight): ranks that disagree on a length fail, naming a
/// rank, instead of hanging; a bad root is refused.
pub(crate) fn error_checks(t: &mut Mpi, k: &mut Tally) {
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
