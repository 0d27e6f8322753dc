//! Splitting `len` elements into `parts` contiguous ranges (pure).
//!
//! The first `len % parts` ranges hold one element more than the others; ranges may be
//! empty when `len < parts`. Every collective uses this one partition, so rank `r`'s "own
//! chunk" is the same everywhere.

use std::ops::Range;

/// The `i`-th of `parts` contiguous ranges covering `0..len`.
pub fn range(len: usize, parts: usize, i: usize) -> Range<usize> {
    assert!(parts > 0 && i < parts, "chunk {i} of {parts}");
    let base = len / parts;
    let extra = len % parts;
    let start = i * base + i.min(extra);
    let size = base + usize::from(i < extra);
    start..start + size
}

/// All `parts` ranges covering `0..len`, in order.
pub fn ranges(len: usize, parts: usize) -> impl ExactSizeIterator<Item = Range<usize>> {
    (0..parts).map(move |i| range(len, parts, i))
}

/// The range spanning chunks `lo..hi` of the partition of `len` into `parts`.
pub fn span(len: usize, parts: usize, lo: usize, hi: usize) -> Range<usize> {
    debug_assert!(lo <= hi && hi <= parts);
    if lo == hi {
        let s = if lo == parts {
            len
        } else {
            range(len, parts, lo).start
        };
        return s..s;
    }
    range(len, parts, lo).start..range(len, parts, hi - 1).end
}

/// How many segments of at most `seg_elems` elements a message of `len` elements takes
/// (at least one, so an empty message still travels).
pub fn segments(len: usize, seg_elems: usize) -> usize {
    len.div_ceil(seg_elems.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_covers_exactly() {
        for len in 0..40 {
            for parts in 1..10 {
                let rs: Vec<_> = ranges(len, parts).collect();
                assert_eq!(rs.len(), parts);
                assert_eq!(rs[0].start, 0);
                assert_eq!(rs[parts - 1].end, len);
                for w in rs.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() >= w[1].len());
                    assert!(w[0].len() - w[1].len() <= 1);
                }
                for lo in 0..=parts {
                    for hi in lo..=parts {
                        let s = span(len, parts, lo, hi);
                        let want: usize = rs[lo..hi].iter().map(|r| r.len()).sum();
                        assert_eq!(s.len(), want);
                        if lo < parts {
                            assert_eq!(s.start, rs[lo].start);
                        }
                    }
                }
            }
        }
        assert_eq!(range(10, 3, 0), 0..4);
        assert_eq!(range(10, 3, 2), 7..10);
        assert_eq!(range(2, 4, 3), 2..2);
    }

    #[test]
    fn segment_counts() {
        assert_eq!(segments(0, 4), 1);
        assert_eq!(segments(4, 4), 1);
        assert_eq!(segments(5, 4), 2);
        assert_eq!(segments(5, 0), 5);
    }
}
