//! The timings the ranks of a shared-host step measurement (`gradwire simulate
//! --host-cores`) send rank 0: a wire format, so decoded as untrusted.
//!
//! Each rank's message, byte by byte: its mean seconds per step as an `f64` in little-endian
//! order (8 bytes), then its compute seconds of each timed pass, 8 bytes each, as many as
//! rank 0's. So a message is `8 (1 + passes)` bytes. [`decode`] takes every rank's message
//! (rank 0's included) and checks each length against rank 0's before reading a value;
//! the values themselves are not judged here (a NaN is refused later, when the prediction
//! checks its inputs).

/// Why the ranks' timings cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingsError {
    /// No rank's message at all.
    #[error("no rank sent its timings")]
    Empty,
    /// Rank 0's message is not a whole number of 8-byte values, or holds no step time.
    #[error("rank 0 sent {0} bytes of timings, not 8 per value with at least one")]
    BadLength(usize),
    /// A rank's message has a different length from rank 0's.
    #[error("rank {rank} sent {got} bytes of timings, rank 0 {expected}")]
    Mismatch {
        /// The rank.
        rank: usize,
        /// Its message's length.
        got: usize,
        /// Rank 0's message's length.
        expected: usize,
    },
}

/// One rank's message: `step_s`, then `compute` (module doc).
pub fn encode(step_s: f64, compute: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 * (1 + compute.len()));
    out.extend_from_slice(&step_s.to_le_bytes());
    for c in compute {
        out.extend_from_slice(&c.to_le_bytes());
    }
    out
}

/// Every rank's step time, and every rank's compute per pass, in rank order.
pub fn decode(all: &[Vec<u8>]) -> Result<(Vec<f64>, Vec<Vec<f64>>), TimingsError> {
    let expected = all.first().ok_or(TimingsError::Empty)?.len();
    if expected == 0 || expected % 8 != 0 {
        return Err(TimingsError::BadLength(expected));
    }
    let mut steps = Vec::with_capacity(all.len());
    let mut compute = Vec::with_capacity(all.len());
    for (rank, bytes) in all.iter().enumerate() {
        if bytes.len() != expected {
            return Err(TimingsError::Mismatch {
                rank,
                got: bytes.len(),
                expected,
            });
        }
        let mut values = bytes.chunks_exact(8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            f64::from_le_bytes(a)
        });
        steps.push(values.next().unwrap_or(0.0));
        compute.push(values.collect());
    }
    Ok((steps, compute))
}

/// For the fuzz target: `data` split at every `0xff` byte into rank messages; decoding never
/// panics, and what decodes has one step and the same number of passes per rank.
#[cfg(any(test, fuzzing))]
pub fn fuzz_decode(data: &[u8]) {
    let all: Vec<Vec<u8>> = data.split(|&b| b == 0xff).map(<[u8]>::to_vec).collect();
    if let Ok((steps, compute)) = decode(&all) {
        assert_eq!(steps.len(), all.len());
        assert!(compute.iter().all(|c| c.len() * 8 + 8 == all[0].len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_by_hand() {
        let a = encode(0.5, &[0.1, 0.2]);
        assert_eq!(a.len(), 24);
        assert_eq!(&a[..8], &0.5f64.to_le_bytes());
        let b = encode(0.25, &[0.3, 0.4]);
        let (steps, compute) = decode(&[a, b]).unwrap();
        assert_eq!(steps, [0.5, 0.25]);
        assert_eq!(compute, [vec![0.1, 0.2], vec![0.3, 0.4]]);
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        let whole = encode(0.5, &[0.1, 0.2]);
        for cut in 0..whole.len() {
            let short = whole[..cut].to_vec();
            // As rank 1's message: a mismatch naming rank 1.
            assert_eq!(
                decode(&[whole.clone(), short.clone()]),
                Err(TimingsError::Mismatch {
                    rank: 1,
                    got: cut,
                    expected: 24
                })
            );
            // As rank 0's: not whole values (8 and 16 bytes are whole, and then rank 1's
            // full message mismatches).
            let err = decode(&[short, whole.clone()]).unwrap_err();
            if cut % 8 == 0 && cut > 0 {
                assert!(
                    matches!(err, TimingsError::Mismatch { rank: 1, .. }),
                    "{err}"
                );
            } else {
                assert_eq!(err, TimingsError::BadLength(cut));
            }
        }
        assert_eq!(decode(&[]), Err(TimingsError::Empty));
        // An oversized message is refused the same way.
        let mut long = whole.clone();
        long.push(0);
        assert!(matches!(
            decode(&[whole, long]),
            Err(TimingsError::Mismatch { got: 25, .. })
        ));
    }
}
