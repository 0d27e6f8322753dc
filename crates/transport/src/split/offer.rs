//! The split offer: the one message every rank sends every other rank when a transport is
//! split ([`crate::split`]), saying which group it joins and where it sorts in it, plus the
//! transport's own bytes (the TCP transport's fresh listening address). Pure and total:
//! malformed bytes give an [`OfferError`], never a panic; fuzzed by `split_offer`.
//!
//! Layout (little-endian), [`OFFER_HEADER_LEN`] bytes then the payload:
//!
//! ```text
//! 0..4    magic  "GWO1" (0x314F_5747)
//! 4..8    seq    how many splits of this transport came before (u32)
//! 8..12   color  the group to join (u32)
//! 12..16  key    the order within the group (u32)
//! 16..18  len    payload length (u16), at most MAX_PAYLOAD
//! 18..    payload, exactly len bytes
//! ```

/// Magic of an offer ("GWO1" little-endian).
pub const MAGIC_OFFER: u32 = 0x314F_5747;
/// Length of an offer without its payload.
pub const OFFER_HEADER_LEN: usize = 18;
/// Largest payload an offer carries (an address entry needs 23 bytes).
pub const MAX_PAYLOAD: usize = 256;

/// One rank's offer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer<'a> {
    /// How many splits of this transport came before this one (every rank must agree).
    pub seq: u32,
    /// The group to join.
    pub color: u32,
    /// The order within the group (ties go by rank).
    pub key: u32,
    /// The transport's own bytes.
    pub payload: &'a [u8],
}

/// Why an offer was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// Not an offer, or cut short.
    #[error("{len} bytes is no offer (a header is {OFFER_HEADER_LEN})")]
    Short {
        /// Bytes received.
        len: usize,
    },
    /// The magic number is wrong.
    #[error("wrong magic")]
    BadMagic,
    /// The announced payload does not match the bytes received.
    #[error("payload of {announced} bytes announced, {got} received (at most {MAX_PAYLOAD})")]
    BadLength {
        /// The announced payload length.
        announced: usize,
        /// The payload bytes received.
        got: usize,
    },
    /// The sender is at another split of the transport than this rank (calls out of step).
    #[error("the sender is at split {theirs}, this rank at split {ours}")]
    OutOfStep {
        /// This rank's split count.
        ours: u32,
        /// The sender's.
        theirs: u32,
    },
    /// The transport's payload was malformed.
    #[error("malformed payload: {what}")]
    BadPayload {
        /// What was wrong.
        what: &'static str,
    },
}

impl<'a> Offer<'a> {
    /// The offer's bytes; `None` when the payload exceeds [`MAX_PAYLOAD`].
    pub fn encode(&self) -> Option<Vec<u8>> {
        if self.payload.len() > MAX_PAYLOAD {
            return None;
        }
        let mut out = Vec::with_capacity(OFFER_HEADER_LEN + self.payload.len());
        out.extend_from_slice(&MAGIC_OFFER.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.color.to_le_bytes());
        out.extend_from_slice(&self.key.to_le_bytes());
        out.extend_from_slice(&(self.payload.len() as u16).to_le_bytes());
        out.extend_from_slice(self.payload);
        Some(out)
    }

    /// Decodes an offer; the payload borrows from `b`.
    pub fn decode(b: &'a [u8]) -> Result<Offer<'a>, OfferError> {
        if b.len() < OFFER_HEADER_LEN {
            return Err(OfferError::Short { len: b.len() });
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u32_at(0) != MAGIC_OFFER {
            return Err(OfferError::BadMagic);
        }
        let announced = usize::from(u16::from_le_bytes([b[16], b[17]]));
        let payload = &b[OFFER_HEADER_LEN..];
        if announced != payload.len() || announced > MAX_PAYLOAD {
            return Err(OfferError::BadLength {
                announced,
                got: payload.len(),
            });
        }
        Ok(Offer {
            seq: u32_at(4),
            color: u32_at(8),
            key: u32_at(12),
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let o = Offer {
            seq: 3,
            color: 7,
            key: u32::MAX,
            payload: &[1, 2, 3],
        };
        let b = o.encode().unwrap();
        assert_eq!(b.len(), OFFER_HEADER_LEN + 3);
        assert_eq!(Offer::decode(&b).unwrap(), o);
        for cut in 0..b.len() {
            assert!(Offer::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(matches!(
            Offer::decode(&longer),
            Err(OfferError::BadLength {
                announced: 3,
                got: 4
            })
        ));
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(Offer::decode(&bad), Err(OfferError::BadMagic));
        let big = vec![0u8; MAX_PAYLOAD + 1];
        assert!(Offer { payload: &big, ..o }.encode().is_none());
    }

    /// What the `split_offer` fuzz target asserts of any input: decoding never panics, and
    /// an accepted offer encodes back to the same bytes.
    fn check(bytes: &[u8]) {
        if let Ok(o) = Offer::decode(bytes) {
            assert!(o.payload.len() <= MAX_PAYLOAD);
            let again = o.encode().expect("a decoded payload fits an offer");
            assert_eq!(again, bytes);
            assert_eq!(Offer::decode(&again), Ok(o));
        }
    }

    /// A cheap stand-in for the fuzz target: truncations and single-byte mutations of valid
    /// offers (with payloads of 0, 23 and `MAX_PAYLOAD` bytes), then random byte strings,
    /// half of them with the right magic and a length field that matches.
    #[test]
    fn mutations_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for len in [0, 23, MAX_PAYLOAD] {
            let payload: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let good = Offer {
                seq: rng.gen(),
                color: rng.gen(),
                key: rng.gen(),
                payload: &payload,
            }
            .encode()
            .unwrap();
            check(&good);
            for cut in 0..good.len() {
                check(&good[..cut]);
            }
            for i in 0..good.len().min(OFFER_HEADER_LEN + 4) {
                for v in [0u8, 1, 0x7F, 0x80, 0xFF] {
                    let mut c = good.clone();
                    c[i] = v;
                    check(&c);
                }
            }
        }
        let mut accepted = 0;
        for _ in 0..2_000 {
            let n = rng.gen_range(0..OFFER_HEADER_LEN + MAX_PAYLOAD + 8);
            let mut c: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            if n >= OFFER_HEADER_LEN && rng.gen_bool(0.5) {
                c[..4].copy_from_slice(&MAGIC_OFFER.to_le_bytes());
                let announced = (n - OFFER_HEADER_LEN) as u16;
                c[16..18].copy_from_slice(&announced.to_le_bytes());
            }
            accepted += usize::from(Offer::decode(&c).is_ok());
            check(&c);
        }
        assert!(accepted > 0, "no random offer was well formed");
    }
}
