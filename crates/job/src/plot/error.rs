//! What can go wrong drawing a chart: each error names the file it was reading or writing.

use std::path::PathBuf;

/// Drawing a chart or reading what it shows failed.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The directory the charts go into could not be created.
    #[error("creating plot directory {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file the chart shows (a timeline) could not be read.
    #[error("reading {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A timeline is larger than [`MAX_TRACE_BYTES`](super::MAX_TRACE_BYTES).
    #[error("{} is larger than {limit} bytes, too large to draw", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The largest file read, in bytes.
        limit: u64,
    },
    /// A timeline is not JSON.
    #[error("parsing {}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why the JSON is invalid.
        source: serde_json::Error,
    },
    /// A timeline's JSON has no `traceEvents` array, so it is no Chrome trace.
    #[error("{}: no traceEvents array", path.display())]
    NoTraceEvents {
        /// The file.
        path: PathBuf,
    },
    /// A timeline has no complete span (`"ph": "X"` with a rank, a name, a start and a
    /// duration) to draw, or its spans have no finite time span.
    #[error("{} holds no spans", path.display())]
    NoSpans {
        /// The file.
        path: PathBuf,
    },
    /// A timeline names more ranks than one chart draws lanes for.
    #[error("{} has {ranks} ranks; at most {limit} are drawn", path.display())]
    TooManyRanks {
        /// The file.
        path: PathBuf,
        /// The ranks it names (its highest rank plus one).
        ranks: usize,
        /// The most ranks drawn.
        limit: usize,
    },
    /// The drawing backend failed: no font, or the PNG could not be written. plotters'
    /// errors are generic over the backend, so their message is kept.
    #[error("drawing {}: {message}", file.display())]
    Draw {
        /// The PNG being drawn.
        file: PathBuf,
        /// plotters' message.
        message: String,
    },
}
