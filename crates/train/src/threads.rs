//! The compute thread pool: burn's flex backend and its GEMM run on rayon's global pool.

/// Sizes rayon's global pool to `n` threads (0 = one per core). Call it before the first
/// model is built; with several workers sharing a few cores, give each 1 thread. Returns
/// false when the pool was already initialized (then its size stays as it was).
pub fn init_threads(n: usize) -> bool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .is_ok()
}

/// Compute threads for each of `ranks` workers sharing `cores` cores: the cores divided
/// among them, at least 1.
pub fn threads_per_worker(cores: usize, ranks: usize) -> usize {
    (cores / ranks.max(1)).max(1)
}

/// Threads in rayon's global pool (initializing it with the default size if needed).
pub fn num_threads() -> usize {
    rayon::current_num_threads()
}

/// Runs `f` with `n` compute threads (at least 1) in a pool of its own instead of the global
/// one, as a worker process sized by [`init_threads`] would run: the model code inside `f`
/// (burn's kernels, the GEMM) parallelizes over this pool. For measuring several ranks in
/// threads of one process, each with the threads its own process would have.
pub fn with_threads<R: Send>(
    n: usize,
    f: impl FnOnce() -> R + Send,
) -> Result<R, rayon::ThreadPoolBuildError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n.max(1))
        .build()?;
    Ok(pool.install(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_threads_runs_in_a_pool_of_that_size() {
        assert_eq!(with_threads(3, rayon::current_num_threads).unwrap(), 3);
        assert_eq!(with_threads(0, rayon::current_num_threads).unwrap(), 1);
        // Parallel work inside runs on that pool (5 threads: not the size of the global
        // pool on a machine of 1 to 4 cores).
        let sizes = with_threads(5, || {
            use rayon::prelude::*;
            (0..64)
                .into_par_iter()
                .map(|_| rayon::current_num_threads())
                .collect::<Vec<_>>()
        })
        .unwrap();
        assert!(sizes.iter().all(|&n| n == 5), "{sizes:?}");
    }
}
