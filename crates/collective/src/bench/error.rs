//! The error of a collective measurement.

/// Errors of [`super::measure`] and [`super::check_iteration`].
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A message size below one `f32`.
    #[error("every size must be at least 4 bytes (one f32)")]
    SizeTooSmall {
        /// The size given, bytes.
        bytes: usize,
    },
    /// A collective failed (the error names the rank concerned).
    #[error(transparent)]
    Collective(#[from] crate::Error),
    /// The all-reduce of a known pattern gave another value than the exact sum.
    #[error("rank {rank}: element {index} is {got}, expected {expected}")]
    Mismatch {
        /// The rank that saw it.
        rank: usize,
        /// Index of the first wrong element.
        index: usize,
        /// Its value.
        got: f32,
        /// The exact sum.
        expected: f32,
    },
}
