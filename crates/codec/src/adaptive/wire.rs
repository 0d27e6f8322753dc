//! The wire format (layout in the module doc): the encoder, the decoder, and the Golomb-Rice
//! coded index gaps (`index=golomb`).

use super::Adaptive;
use crate::elias::{BitReader, BitWriter};
use crate::sparse::{
    check_len, check_next, index_of, is_negative, load_rng_residual, put_words, read_f32, read_u32,
    read_u64, save_rng_residual, word_at, word_bytes,
};
use crate::{Caps, Codec, CodecId, DecodeError, Feedback, Header, Progress, HEADER_LEN};

/// Decodes `total` Golomb-Rice (M = 16) coded entries of a tensor of `n` elements into
/// words `(index << 1) | sign`; the stream must fill `bytes` exactly (to the padding byte).
pub(super) fn golomb_words(bytes: &[u8], total: usize, n: usize) -> Result<Vec<u64>, DecodeError> {
    let mut r = BitReader::new(bytes);
    let mut words = Vec::with_capacity(total);
    let mut next = 0u64;
    for _ in 0..total {
        let mut q = 0u64;
        while r.get(1)? == 1 {
            q += 1;
            if q > (n as u64 >> 4) {
                return Err(DecodeError::InvalidField {
                    field: "gap",
                    reason: "index gap beyond the tensor",
                });
            }
        }
        let i = next + (q << 4) + u64::from(r.get(4)?);
        if i >= n as u64 {
            return Err(DecodeError::IndexOutOfRange { index: i, len: n });
        }
        words.push((i << 1) | u64::from(r.get(1)?));
        next = i + 1;
    }
    if r.bytes_used() != bytes.len() {
        return Err(DecodeError::InvalidField {
            field: "length",
            reason: "bytes after the Golomb-Rice stream",
        });
    }
    Ok(words)
}

impl Codec for Adaptive {
    fn id(&self) -> CodecId {
        CodecId::Adaptive
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        let mut sel = std::mem::take(&mut self.sel);
        self.select(grad, &mut sel);
        let n = grad.len();
        Header::write(out, CodecId::Adaptive, n);
        let rec = self.record_len();
        out.reserve(4 + rec * self.cols.len() + word_bytes(n) * sel.indices.len());
        out.extend_from_slice(&(self.cols.len() as u32).to_le_bytes());
        for &(count, mp, mn, m0) in &self.cols {
            out.extend_from_slice(&count.to_le_bytes());
            out.extend_from_slice(&mp.to_le_bytes());
            out.extend_from_slice(&mn.to_le_bytes());
            if self.cfg.ternary {
                out.extend_from_slice(&m0.to_le_bytes());
            }
        }
        if self.cfg.golomb {
            let mut bits = BitWriter::new(out);
            let mut next = 0u32;
            for (&i, &v) in sel.indices.iter().zip(&sel.values) {
                let gap = i - next;
                let mut q = gap >> 4;
                while q >= 32 {
                    bits.put(u32::MAX, 32);
                    q -= 32;
                }
                if q > 0 {
                    bits.put((1u32 << q) - 1, q);
                }
                bits.put(0, 1);
                bits.put(gap & 15, 4);
                bits.put(u32::from(v < 0.0), 1);
                next = i + 1;
            }
            bits.finish();
            self.sel = sel;
            return;
        }
        let signs = sel.values.iter().map(|&v| v < 0.0);
        put_words(out, n, sel.indices.iter().copied().zip(signs));
        self.sel = sel;
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        let n = acc.len();
        Header::check(payload, CodecId::Adaptive, n)?;
        let ncols = read_u32(payload, HEADER_LEN)? as usize;
        let w = word_bytes(n);
        let rec = self.record_len();
        let body = HEADER_LEN + 4;
        if (payload.len() - body) / rec < ncols {
            return Err(DecodeError::Truncated {
                need: body.saturating_add(ncols.saturating_mul(rec)),
                have: payload.len(),
            });
        }
        // Ternary: the columns must be the decoder's (unsent entries decode to mu0).
        let ranges = if self.cfg.ternary {
            let r = self.columns(n);
            if r.len() != ncols {
                return Err(DecodeError::InvalidField {
                    field: "ncols",
                    reason: "column count differs from the decoder's columns",
                });
            }
            r
        } else {
            Vec::new()
        };
        let words_at = body + rec * ncols;
        let mut total = 0u64;
        for c in 0..ncols {
            let at = body + rec * c;
            total = total.saturating_add(read_u64(payload, at)?);
            for mu in [read_f32(payload, at + 8)?, read_f32(payload, at + 12)?] {
                if !(mu.is_finite() && mu >= 0.0) {
                    return Err(DecodeError::InvalidField {
                        field: "mu",
                        reason: "reconstruction value not finite and non-negative",
                    });
                }
            }
            if self.cfg.ternary && !read_f32(payload, at + 16)?.is_finite() {
                return Err(DecodeError::InvalidField {
                    field: "mu0",
                    reason: "unsent reconstruction value not finite",
                });
            }
        }
        if total > n as u64 {
            return Err(DecodeError::InvalidField {
                field: "count",
                reason: "more words than elements",
            });
        }
        let golomb = if self.cfg.golomb {
            golomb_words(&payload[words_at..], total as usize, n)?
        } else {
            check_len(words_at + w * total as usize, payload.len())?;
            Vec::new()
        };
        let words = &payload[words_at..];
        let word = |j: usize| -> u64 {
            if self.cfg.golomb {
                golomb[j]
            } else {
                word_at(words, w, j)
            }
        };
        let mut next = 0u64;
        let mut j = 0usize;
        for c in 0..ncols {
            let count = read_u64(payload, body + rec * c)? as usize;
            for _ in 0..count {
                let i = index_of(word(j));
                next = check_next(i, next, n)?;
                if let Some(r) = ranges.get(c) {
                    if !r.contains(&(i as usize)) {
                        return Err(DecodeError::InvalidField {
                            field: "index",
                            reason: "word outside its column",
                        });
                    }
                }
                j += 1;
            }
        }
        let mut j = 0usize;
        for c in 0..ncols {
            let at = body + rec * c;
            let count = read_u64(payload, at)? as usize;
            let mp = read_f32(payload, at + 8)?;
            let mn = read_f32(payload, at + 12)?;
            let value = |x: u64| if is_negative(x) { -mn } else { mp };
            match ranges.get(c) {
                Some(r) => {
                    let m0 = read_f32(payload, at + 16)?;
                    let end = j + count;
                    for i in r.clone() {
                        if j < end && index_of(word(j)) as usize == i {
                            acc[i] += value(word(j));
                            j += 1;
                        } else {
                            acc[i] += m0;
                        }
                    }
                }
                None => {
                    for _ in 0..count {
                        let x = word(j);
                        acc[index_of(x) as usize] += value(x);
                        j += 1;
                    }
                }
            }
        }
        Ok(())
    }

    fn caps(&self) -> Caps {
        Caps::biased(Feedback::Owned)
    }

    fn set_progress(&mut self, progress: Progress) {
        self.rng.set_step(progress.step);
    }

    fn save_state(&self) -> Vec<u8> {
        save_rng_residual(CodecId::Adaptive, &self.rng, &self.residual)
    }

    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        load_rng_residual(state, CodecId::Adaptive, &mut self.rng, &mut self.residual)
    }
}
