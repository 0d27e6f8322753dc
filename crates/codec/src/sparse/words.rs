//! The signed index words of threshold quantization (Strom 2015) and adaptive quantization
//! (Dryden 2016): one word per sent element, `(index << 1) | sign` (sign 1 = the negative
//! value), little-endian; 32-bit words (31 index bits + 1 sign bit) while the tensor has at
//! most 2^31 elements, 64-bit words above. The values are implicit (the codec's `+-tau` or
//! its columns' means), so only index and sign travel.

use crate::DecodeError;

/// Bytes of one word for a tensor of `n` elements: 4 up to 2^31 elements, 8 above.
pub(crate) fn word_bytes(n: usize) -> usize {
    if n as u64 > 1 << 31 {
        8
    } else {
        4
    }
}

/// Appends one word per `(index, negative)` pair, `word_bytes(n)` bytes each.
pub(crate) fn put_words(out: &mut Vec<u8>, n: usize, words: impl Iterator<Item = (u32, bool)>) {
    let wide = word_bytes(n) == 8;
    for (i, negative) in words {
        let word = (u64::from(i) << 1) | u64::from(negative);
        if wide {
            out.extend_from_slice(&word.to_le_bytes());
        } else {
            out.extend_from_slice(&(word as u32).to_le_bytes());
        }
    }
}

/// The `j`-th word of `words` (`width` bytes each, `words` long enough: checked before).
#[inline]
pub(crate) fn word_at(words: &[u8], width: usize, j: usize) -> u64 {
    let c = &words[width * j..width * (j + 1)];
    if width == 8 {
        u64::from_le_bytes(c.try_into().expect("8 bytes"))
    } else {
        u64::from(u32::from_le_bytes(c.try_into().expect("4 bytes")))
    }
}

/// The element index of a word.
#[inline]
pub(crate) fn index_of(word: u64) -> u64 {
    word >> 1
}

/// Whether a word stands for the negative value.
#[inline]
pub(crate) fn is_negative(word: u64) -> bool {
    word & 1 == 1
}

/// Checks the index of the next word of a tensor of `n` elements, `next` being one past the
/// previous index (0 at first): below `n` and strictly increasing. Returns the new `next`.
pub(crate) fn check_next(index: u64, next: u64, n: usize) -> Result<u64, DecodeError> {
    if index >= n as u64 {
        return Err(DecodeError::IndexOutOfRange { index, len: n });
    }
    if index < next {
        return Err(DecodeError::InvalidField {
            field: "index",
            reason: "indices not strictly increasing",
        });
    }
    Ok(index + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_by_hand() {
        let mut out = Vec::new();
        put_words(&mut out, 10, [(3, false), (7, true)].into_iter());
        assert_eq!(out, [6, 0, 0, 0, 15, 0, 0, 0]);
        assert_eq!(word_at(&out, 4, 1), 15);
        assert_eq!((index_of(15), is_negative(15)), (7, true));
        let mut wide = Vec::new();
        put_words(&mut wide, (1 << 31) + 1, [(u32::MAX, true)].into_iter());
        assert_eq!(wide, ((u64::from(u32::MAX) << 1) | 1).to_le_bytes());
        assert_eq!(word_bytes(1 << 31), 4);
        assert_eq!(word_bytes((1 << 31) + 1), 8);
        assert_eq!(check_next(3, 0, 10), Ok(4));
        assert!(matches!(
            check_next(10, 0, 10),
            Err(DecodeError::IndexOutOfRange { index: 10, len: 10 })
        ));
        assert!(matches!(
            check_next(3, 4, 10),
            Err(DecodeError::InvalidField { field: "index", .. })
        ));
    }
}
