//! Fixed-width bit packing in lane-parallel ("vertical") 32-bit words.
//!
//! Codes of `W` bits are packed `K = 32 / W` per little-endian `u32` word. Elements are
//! grouped in blocks of `LANES * K`; inside a block, element `j * LANES + l` sits in word `l`
//! at bit `j * W`. Packing and unpacking then shift every SIMD lane by the same constant,
//! which the compiler vectorizes on plain SSE2, and no code straddles a word. The last,
//! partial block of `r` elements uses `lanes = ceil(r / K)` words with element
//! `j * lanes + l` in word `l` at bit `j * W`. The packed size is exactly
//! `ceil(n / K)` words; unused slots are zero.

/// Words per full block.
pub(crate) const LANES: usize = 16;

/// Bytes that `n` codes of `w` bits take.
#[inline]
pub(crate) const fn packed_bytes(n: usize, w: u32) -> usize {
    n.div_ceil((32 / w) as usize) * 4
}

/// How `n` codes of `W` bits lie in the words: `(k, mask, block, full)`, with `k` codes a
/// word, `mask` the low `W` bits, `block` codes a full block and `full` full blocks before
/// the partial one.
#[inline(always)]
fn grid<const W: u32>(n: usize) -> (usize, u32, usize, usize) {
    let k = (32 / W) as usize;
    let mask = if W == 32 { u32::MAX } else { (1u32 << W) - 1 };
    (k, mask, LANES * k, n / (LANES * k))
}

#[inline(always)]
fn load(d: &[u8], l: usize) -> u32 {
    u32::from_le_bytes([d[4 * l], d[4 * l + 1], d[4 * l + 2], d[4 * l + 3]])
}

/// Packs `code(x, base + i)` for every `x = src[i]` into `dst`, which must be
/// `packed_bytes(src.len(), W)` long.
#[inline(always)]
pub(crate) fn pack<const W: u32>(
    src: &[f32],
    base: u32,
    dst: &mut [u8],
    mut code: impl FnMut(f32, u32) -> u32,
) {
    let (k, mask, block, full) = grid::<W>(src.len());
    debug_assert_eq!(dst.len(), packed_bytes(src.len(), W));
    let (sb, st) = src.split_at(full * block);
    let (db, dt) = dst.split_at_mut(full * LANES * 4);
    for (bi, (s, d)) in sb
        .chunks_exact(block)
        .zip(db.chunks_exact_mut(LANES * 4))
        .enumerate()
    {
        let b0 = base.wrapping_add((bi * block) as u32);
        let mut words = [0u32; LANES];
        for j in 0..k {
            let row = &s[j * LANES..j * LANES + LANES];
            for l in 0..LANES {
                let i = b0.wrapping_add((j * LANES + l) as u32);
                words[l] |= (code(row[l], i) & mask) << (j as u32 * W);
            }
        }
        for (l, w) in words.iter().enumerate() {
            d[4 * l..4 * l + 4].copy_from_slice(&w.to_le_bytes());
        }
    }
    if !st.is_empty() {
        let lanes = st.len().div_ceil(k);
        let b0 = base.wrapping_add((full * block) as u32);
        for l in 0..lanes {
            let mut w = 0u32;
            for j in 0..k {
                let i = j * lanes + l;
                if i < st.len() {
                    w |= (code(st[i], b0.wrapping_add(i as u32)) & mask) << (j as u32 * W);
                }
            }
            dt[4 * l..4 * l + 4].copy_from_slice(&w.to_le_bytes());
        }
    }
}

/// Adds `val(code)` of every code packed in `src` (`packed_bytes(acc.len(), W)` long) into
/// `acc`.
#[inline(always)]
pub(crate) fn unpack_add<const W: u32>(src: &[u8], acc: &mut [f32], val: impl Fn(u32) -> f32) {
    let (k, mask, block, full) = grid::<W>(acc.len());
    debug_assert_eq!(src.len(), packed_bytes(acc.len(), W));
    let (ab, at) = acc.split_at_mut(full * block);
    let (sb, st) = src.split_at(full * LANES * 4);
    for (a, s) in ab.chunks_exact_mut(block).zip(sb.chunks_exact(LANES * 4)) {
        let mut words = [0u32; LANES];
        for (l, w) in words.iter_mut().enumerate() {
            *w = load(s, l);
        }
        for j in 0..k {
            let row = &mut a[j * LANES..j * LANES + LANES];
            for l in 0..LANES {
                row[l] += val((words[l] >> (j as u32 * W)) & mask);
            }
        }
    }
    if !at.is_empty() {
        let lanes = at.len().div_ceil(k);
        for l in 0..lanes {
            let w = load(st, l);
            for j in 0..k {
                let i = j * lanes + l;
                if i < at.len() {
                    at[i] += val((w >> (j as u32 * W)) & mask);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<const W: u32>() {
        for n in [0usize, 1, 5, 31, 32, 33, 255, 256, 257, 1000, 2049] {
            let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let m = if W == 32 { u32::MAX } else { (1u32 << W) - 1 };
            let mut dst = vec![0u8; packed_bytes(n, W)];
            pack::<W>(&src, 7, &mut dst, |x, i| {
                assert_eq!(i, x as u32 + 7);
                (x as u32).wrapping_mul(2654435761) & m
            });
            let mut acc = vec![0.5f32; n];
            unpack_add::<W>(&dst, &mut acc, |c| c as f32);
            for (i, a) in acc.iter().enumerate() {
                assert_eq!(*a, ((i as u32).wrapping_mul(2654435761) & m) as f32 + 0.5);
            }
        }
    }

    #[test]
    fn pack_unpack_all_widths() {
        check::<1>();
        check::<2>();
        check::<3>();
        check::<4>();
        check::<5>();
        check::<8>();
        check::<11>();
        check::<16>();
    }
}
