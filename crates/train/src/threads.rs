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
