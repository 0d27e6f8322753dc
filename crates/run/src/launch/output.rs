//! What happens to the ranks' output: the modes, and the pumps that prefix each line with
//! its rank.

use std::io::{BufRead, BufReader, Read, Write};
use std::thread::JoinHandle;

/// What happens to the ranks' output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Output {
    /// Every line of every rank, prefixed with `[rank]`.
    Prefixed,
    /// Every rank's output passed through untouched (`launch --no-prefix`).
    Inherit,
    /// Rank 0's output passed through (its progress bar included), the other ranks'
    /// standard output discarded (`train`, where only rank 0 reports).
    Rank0,
    /// Rank 0's standard output captured into [`Ranks::captured`](super::Ranks::captured),
    /// the others' discarded.
    CaptureRank0,
}

/// Copies a child's stream line by line to this process's standard output (or error, with
/// `to_stderr`) with a `[rank] ` prefix, until the stream ends or the write fails.
pub(super) fn pump(
    rank: usize,
    stream: impl Read + Send + 'static,
    to_stderr: bool,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        if to_stderr {
            prefix_lines(rank, stream, || std::io::stderr().lock(), false);
        } else {
            prefix_lines(rank, stream, || std::io::stdout().lock(), true);
        }
    })
}

/// Copies `stream` line by line with a `[rank] ` prefix, each line (a last one without a
/// newline gets one) written whole to a fresh `sink()` (flushed with `flush`), until the
/// stream ends or a write fails.
fn prefix_lines<W: Write>(
    rank: usize,
    stream: impl Read,
    mut sink: impl FnMut() -> W,
    flush: bool,
) {
    let mut reader = BufReader::new(stream);
    let prefix = format!("[{rank}] ");
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                let mut w = sink();
                let res = w
                    .write_all(prefix.as_bytes())
                    .and_then(|()| w.write_all(&line))
                    .and_then(|()| if flush { w.flush() } else { Ok(()) });
                if res.is_err() {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A sink appending to a shared buffer.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_gets_the_rank_and_the_last_one_a_newline() {
        let out = Shared::default();
        let sink = out.clone();
        prefix_lines(7, &b"one\n\ntwo"[..], move || sink.clone(), true);
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text, "[7] one\n[7] \n[7] two\n");
    }
}
