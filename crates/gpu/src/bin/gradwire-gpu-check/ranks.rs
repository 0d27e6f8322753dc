//! Rank threads: one per transport of a world, each running the same body.

use crate::R;

/// Runs `body(rank, transport)` on one thread per rank of `world`: every rank's result in rank
/// order, or the first failing rank's error as text.
pub(crate) fn on_ranks<T, V, F>(world: Vec<T>, body: F) -> Result<Vec<V>, String>
where
    T: Send + 'static,
    V: Send + 'static,
    F: Fn(usize, T) -> R<V> + Send + Clone + 'static,
{
    let handles: Vec<_> = world
        .into_iter()
        .enumerate()
        .map(|(rank, t)| {
            let body = body.clone();
            std::thread::spawn(move || body(rank, t).map_err(|e| format!("rank {rank}: {e}")))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err("a rank thread panicked".into()))
        })
        .collect()
}
