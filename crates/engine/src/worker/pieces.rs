//! A batch of tensors seen as one element range (the tensors laid end to end): the pieces
//! of a range, as byte slices for a vectored send or copied out, two disjoint ranges carved
//! out mutable at once, floats read where they arrived, and the kept allocations
//! ([`Spares`]) that spare a round allocating its vectors of slices.

/// Calls `f(tensor, range inside it)` for each piece of the batch's element range `r`
/// (the batch being `batch`'s tensors laid end to end), in order.
pub(super) fn for_pieces(
    batch: &[&[f32]],
    r: std::ops::Range<usize>,
    mut f: impl FnMut(usize, std::ops::Range<usize>),
) {
    let mut off = 0;
    for (i, t) in batch.iter().enumerate() {
        let (lo, hi) = (r.start.max(off), r.end.min(off + t.len()));
        if lo < hi {
            f(i, lo - off..hi - off);
        }
        off += t.len();
        if off >= r.end {
            break;
        }
    }
}

/// Appends the bytes of the batch's element range `r` to `out`, one slice per tensor it
/// touches (a vectored send's pieces; nothing copied).
pub(super) fn byte_pieces<'a>(
    batch: &[&'a [f32]],
    r: std::ops::Range<usize>,
    out: &mut Vec<&'a [u8]>,
) {
    for_pieces(batch, r, |i, p| {
        out.push(bytemuck::cast_slice(&batch[i][p]))
    });
}

/// Copies the batch's element range `r` into `out` (`r.len()` floats).
pub(super) fn copy_range(batch: &[&[f32]], r: std::ops::Range<usize>, out: &mut [f32]) {
    let mut at = 0;
    for_pieces(batch, r, |i, p| {
        out[at..at + p.len()].copy_from_slice(&batch[i][p.clone()]);
        at += p.len();
    });
}

/// Allocations of vectors of borrowed slices (`&[f32]`, `&mut [f32]`, `&[u8]`: all of one
/// size and alignment), kept empty between rounds so that a round allocates none of them.
#[derive(Default)]
pub(crate) struct Spares(Vec<Vec<&'static [u8]>>);

impl Spares {
    /// An empty vector (of slices, for the allocation to fit), on a kept allocation when
    /// there is one.
    pub(super) fn take<U>(&mut self) -> Vec<U> {
        self.0.pop().map(recycle).unwrap_or_default()
    }

    /// Keeps `v`'s allocation (emptied) for a later [`Spares::take`].
    pub(super) fn put<T>(&mut self, v: Vec<T>) {
        if v.capacity() > 0 {
            self.0.push(recycle(v));
        }
    }
}

/// `v` emptied, as a vector of another element type: the same allocation when the types
/// have the same size and alignment (the standard library collects in place), else a new,
/// empty vector.
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter()
        .map(|_| -> U { unreachable!("the vector is empty") })
        .collect()
}

/// The pieces of the batch's element ranges `a` and `b` (disjoint), one per tensor each
/// touches, in order: both mutable at once, carved out of the tensors' buffers.
pub(super) fn carve<'a>(
    batch: &'a mut [&mut [f32]],
    a: std::ops::Range<usize>,
    b: std::ops::Range<usize>,
    spares: &mut Spares,
) -> (Vec<&'a mut [f32]>, Vec<&'a mut [f32]>) {
    debug_assert!(a.end <= b.start || b.end <= a.start || a.is_empty() || b.is_empty());
    let (mut pa, mut pb): (Vec<&mut [f32]>, Vec<&mut [f32]>) = (spares.take(), spares.take());
    let mut off = 0;
    for t in batch.iter_mut() {
        let end = off + t.len();
        let mut rest: &'a mut [f32] = t;
        let mut pos = off;
        let mut cuts = [a.start, a.end, b.start, b.end, end];
        cuts.sort_unstable();
        for c in cuts {
            if c <= pos || c > end {
                continue;
            }
            let (seg, tail) = std::mem::take(&mut rest).split_at_mut(c - pos);
            if a.contains(&pos) {
                pa.push(seg);
            } else if b.contains(&pos) {
                pb.push(seg);
            }
            rest = tail;
            pos = c;
        }
        off = end;
    }
    (pa, pb)
}

/// Makes `v` at least `n` long. Spare space for parts that arrive off a 4-byte boundary,
/// which the padding makes rare: sized once, not cut and zeroed again every step (its
/// length alternates between the tree round's steps).
pub(super) fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// `bytes` (a peer's floats as they arrived) read as floats: in place when they start on a
/// 4-byte boundary, otherwise copied into `spare` (as many floats).
pub(super) fn floats_in_place<'a>(bytes: &'a [u8], spare: &'a mut [f32]) -> &'a [f32] {
    match bytemuck::try_cast_slice(bytes) {
        Ok(f) => f,
        Err(_) => {
            bytemuck::cast_slice_mut::<f32, u8>(spare).copy_from_slice(bytes);
            spare
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch's pieces for every range equal the same range of the tensors concatenated
    /// by hand, as bytes (what a vectored send puts on the wire) and as a copy.
    #[test]
    fn batch_ranges_equal_the_concatenation() {
        let tensors: Vec<Vec<f32>> = [5usize, 0, 1, 7, 3]
            .iter()
            .enumerate()
            .map(|(t, &n)| (0..n).map(|i| (t * 100 + i) as f32).collect())
            .collect();
        let batch: Vec<&[f32]> = tensors.iter().map(Vec::as_slice).collect();
        let mut whole = Vec::new();
        for t in &tensors {
            whole.extend_from_slice(t);
        }
        for lo in 0..=whole.len() {
            for hi in lo..=whole.len() {
                let mut pieces = Vec::new();
                byte_pieces(&batch, lo..hi, &mut pieces);
                assert!(pieces.iter().all(|p| !p.is_empty()), "{lo}..{hi}");
                let bytes: Vec<u8> = pieces.concat();
                assert_eq!(bytes, bytemuck::cast_slice::<f32, u8>(&whole[lo..hi]));
                let mut out = vec![f32::NAN; hi - lo];
                copy_range(&batch, lo..hi, &mut out);
                assert_eq!(out, whole[lo..hi]);
            }
        }
    }

    /// `carve` hands out exactly the elements of two disjoint ranges, mutable at once: every
    /// pair of disjoint ranges over a batch with an empty and a one-element tensor.
    #[test]
    fn carve_gives_exactly_both_ranges() {
        let lens = [4usize, 0, 1, 6, 3];
        let total: usize = lens.iter().sum();
        for a0 in 0..=total {
            for a1 in a0..=total {
                for b0 in 0..=total {
                    for b1 in b0..=total {
                        if !(a1 <= b0 || b1 <= a0) {
                            continue;
                        }
                        let mut tensors: Vec<Vec<f32>> =
                            lens.iter().map(|&n| vec![0.0; n]).collect();
                        let mut batch: Vec<&mut [f32]> =
                            tensors.iter_mut().map(Vec::as_mut_slice).collect();
                        let (pa, pb) = carve(&mut batch, a0..a1, b0..b1, &mut Spares::default());
                        assert!(pa.iter().chain(&pb).all(|p| !p.is_empty()));
                        for p in pa {
                            p.iter_mut().for_each(|x| *x += 1.0);
                        }
                        for p in pb {
                            p.iter_mut().for_each(|x| *x += 2.0);
                        }
                        let flat: Vec<f32> = tensors.concat();
                        for (i, x) in flat.iter().enumerate() {
                            let want = if (a0..a1).contains(&i) {
                                1.0
                            } else if (b0..b1).contains(&i) {
                                2.0
                            } else {
                                0.0
                            };
                            assert_eq!(*x, want, "a {a0}..{a1} b {b0}..{b1} at {i}");
                        }
                    }
                }
            }
        }
    }

    /// Floats read where they arrived, and copied out when they are off a 4-byte boundary.
    #[test]
    fn floats_in_place_and_off_boundary() {
        let want = [1.5f32, -0.25, 3.0e-7];
        let mut buf = [0u8; 4 + 12 + 4];
        let aligned = (4 - buf.as_ptr() as usize % 4) % 4;
        for (off, copied) in [(aligned, false), (aligned + 1, true), (aligned + 2, true)] {
            for (i, x) in want.iter().enumerate() {
                buf[off + 4 * i..off + 4 * i + 4].copy_from_slice(&x.to_ne_bytes());
            }
            let mut spare = [f32::NAN; 3];
            let got = floats_in_place(&buf[off..off + 12], &mut spare).to_vec();
            assert_eq!(got, want, "offset {off}");
            assert_eq!(
                spare == want,
                copied,
                "offset {off}: copied only when off a boundary"
            );
        }
    }
}
