//! All-gather of small byte messages for the negotiation rounds: recursive doubling on
//! power-of-two worlds (`log2 P` steps instead of the ring's `P-1`; the messages are a few
//! bytes to a few hundred, so latency is all that counts), the collective layer's ring
//! otherwise.
//!
//! At step `k` a rank swaps with `rank ^ 2^k` every message it holds so far (those of its
//! aligned block of `2^k` ranks), each framed as a u32 length and the bytes.

use gradwire_collective::Result;
use gradwire_transport::Transport;

use crate::wire::Reader;

/// Afterwards `out[r]` holds rank `r`'s `mine` (`out` is resized to the world size).
pub(crate) fn all_gather_small(
    t: &mut dyn Transport,
    mine: &[u8],
    out: &mut Vec<Vec<u8>>,
    send: &mut Vec<u8>,
    recv: &mut Vec<u8>,
) -> crate::Result<()> {
    let (rank, world) = (t.rank(), t.world_size());
    if !world.is_power_of_two() {
        let r: Result<()> = gradwire_collective::gather::all_gather_bytes(t, mine, out);
        return Ok(r?);
    }
    out.resize_with(world, Vec::new);
    out[rank].clear();
    out[rank].extend_from_slice(mine);
    let mut mask = 1;
    while mask < world {
        let partner = rank ^ mask;
        let (lo, theirs) = (rank & !(mask - 1), partner & !(mask - 1));
        send.clear();
        for m in &out[lo..lo + mask] {
            send.extend_from_slice(&(m.len() as u32).to_le_bytes());
            send.extend_from_slice(m);
        }
        t.send_recv(partner, send, partner, recv)
            .map_err(gradwire_collective::Error::from)?;
        let mut r = Reader::new(partner, recv);
        for slot in out[theirs..theirs + mask].iter_mut() {
            let n = r.u32()? as usize;
            let b = r.bytes(n)?;
            slot.clear();
            slot.extend_from_slice(b);
        }
        if r.remaining() != 0 {
            return Err(r.err("trailing bytes in a negotiation exchange"));
        }
        mask <<= 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathers_every_rank_in_order() {
        for n in 1..=8 {
            let got = crate::tests::world(n, |mut t| {
                let me = t.rank();
                let mut out = Vec::new();
                let mine = vec![me as u8; me];
                all_gather_small(&mut t, &mine, &mut out, &mut Vec::new(), &mut Vec::new())
                    .unwrap();
                out
            });
            for out in got {
                let want: Vec<Vec<u8>> = (0..n).map(|r| vec![r as u8; r]).collect();
                assert_eq!(out, want, "world {n}");
            }
        }
    }
}
