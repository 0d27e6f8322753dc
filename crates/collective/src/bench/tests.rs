//! The measurements over in-process ranks: the numbers' bookkeeping (sizes, bandwidth from
//! the median), the checks' verdicts; never the timings themselves.

use gradwire_transport::local::Local;
use gradwire_transport::Transport;

use super::*;
use crate::{Algorithm, ReduceOp};

/// Runs `f` on every rank of an in-process world of `n`; the ranks' results in rank order.
fn on_ranks<R: Send + 'static>(
    n: usize,
    f: impl Fn(&mut dyn Transport) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let hs: Vec<_> = Local::world(n)
        .into_iter()
        .map(|mut t| {
            let f = f.clone();
            std::thread::spawn(move || f(&mut t))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn spec(op: BenchOp, sizes: Vec<usize>) -> BenchSpec {
    BenchSpec {
        op,
        sizes,
        algo: Algorithm::Auto,
        iters: Some(3),
        warmup: 1,
    }
}

#[test]
fn every_rank_reports_every_size_with_the_same_numbers() {
    for op in [BenchOp::Allreduce, BenchOp::Allgather, BenchOp::Broadcast] {
        let sp = spec(op, vec![4, 4096, 1 << 16]);
        let all = on_ranks(3, move |t| measure(t, None, &sp).unwrap());
        for r in &all {
            assert_eq!(r, &all[0], "{op:?}: ranks disagree");
            let bytes: Vec<usize> = r.iter().map(|x| x.bytes).collect();
            assert_eq!(bytes, vec![4, 4096, 1 << 16]);
            for x in r {
                assert!(x.median_us > 0.0, "{op:?} {x:?}");
                let want = x.bytes as f64 * op.bus_factor(3) / (x.median_us / 1e6) / 1e9;
                assert!(
                    (x.busbw_gbps - want).abs() <= 1e-9 * want.max(1.0),
                    "{op:?} {x:?}: bus bandwidth {} != {want}",
                    x.busbw_gbps
                );
            }
        }
    }
}

#[test]
fn bus_factors_follow_nccl_tests() {
    assert_eq!(BenchOp::Allreduce.bus_factor(4), 1.5);
    assert_eq!(BenchOp::Allgather.bus_factor(4), 0.75);
    assert_eq!(BenchOp::Broadcast.bus_factor(4), 1.0);
    assert_eq!(BenchOp::Allreduce.bus_factor(1), 0.0);
}

#[test]
fn default_iterations_shrink_with_the_size() {
    assert_eq!(iterations(4096, None), 200);
    assert_eq!(iterations(1 << 20, None), 200);
    assert_eq!(iterations(16 << 20, None), 16);
    assert_eq!(iterations(1 << 30, None), 10);
    assert_eq!(iterations(1 << 30, Some(3)), 3);
}

#[test]
fn a_size_below_one_float_is_refused_before_any_collective() {
    let mut w = Local::world(1);
    let err = measure(&mut w[0], None, &spec(BenchOp::Allreduce, vec![4096, 3])).unwrap_err();
    assert!(
        matches!(err, BenchError::SizeTooSmall { bytes: 3 }),
        "{err}"
    );
}

/// A "hierarchical" all-reduce that counts its calls and reduces flat.
struct Counting(usize);

impl HierarchicalAllReduce for Counting {
    fn all_reduce_f32(
        &mut self,
        world: &mut dyn Transport,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> crate::Result<()> {
        self.0 += 1;
        crate::Collectives::all_reduce(world, buf, op)
    }
}

#[test]
fn all_reduces_go_through_the_hierarchy_when_given() {
    let calls = on_ranks(2, |t| {
        let mut h = Counting(0);
        let sp = BenchSpec {
            iters: Some(4),
            warmup: 2,
            ..spec(BenchOp::Allreduce, vec![64, 128])
        };
        measure(t, Some(&mut h), &sp).unwrap();
        for iter in 0..3 {
            let mut buf = vec![0f32; 1001];
            check_iteration(t, Some(&mut h), Algorithm::Ring, &mut buf, iter).unwrap();
        }
        h.0
    });
    // Two sizes of 2 + 4 calls, then three checks.
    assert_eq!(calls, vec![15, 15]);
}

#[test]
fn the_check_passes_on_a_correct_all_reduce() {
    for algo in [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::Auto,
    ] {
        let ok = on_ranks(4, move |t| {
            let mut buf = vec![0f32; 10_007];
            (0..3).all(|iter| check_iteration(t, None, algo, &mut buf, iter).is_ok())
        });
        assert_eq!(ok, vec![true; 4], "{algo}");
    }
}

/// An all-reduce that gets one element wrong on rank 1.
struct OffByOne;

impl HierarchicalAllReduce for OffByOne {
    fn all_reduce_f32(
        &mut self,
        world: &mut dyn Transport,
        buf: &mut [f32],
        op: ReduceOp,
    ) -> crate::Result<()> {
        crate::Collectives::all_reduce(&mut *world, buf, op)?;
        if world.rank() == 1 {
            buf[5] += 1.0;
        }
        Ok(())
    }
}

#[test]
fn the_check_names_the_first_wrong_element() {
    let errs = on_ranks(3, |t| {
        let mut buf = vec![0f32; 64];
        check_iteration(t, Some(&mut OffByOne), Algorithm::Auto, &mut buf, 2)
            .err()
            .map(|e| e.to_string())
    });
    // Element 5 of iteration 2: 6 * (5 % 7 + 2) = 42.
    assert_eq!(
        errs,
        vec![
            None,
            Some("rank 1: element 5 is 43, expected 42".to_string()),
            None
        ]
    );
}
