//! Shared driver of the codec fuzz targets.
//!
//! Input: `mode` byte, element count (u16 LE, mod 3000), seed byte, then `rest`.
//! - `mode & 1 == 0`: the payload is a valid header for `n` elements followed by `rest`.
//! - `mode & 1 == 1`: a real payload (a deterministic gradient encoded by the codec) is
//!   mutated: `rest[0..2]` = offset, `rest[2..4]` = truncation length (applied when
//!   `mode & 4`), `rest[4..]` is XORed into the payload from the offset.
//! - `mode & 2`: the codec is built with a three-tensor layout.
//! - `mode & 8`: `rest` is also given to `load_state`.
//! - `mode & 16` (with `mode & 2`): the three tensors also get shapes and roles (a Linear
//!   weight, a bias, an output-layer weight), so column, 1-D and output-layer rules run.
//!
//! Every decoder must return (Ok or a `DecodeError`) without panicking; a payload the decoder
//! accepts must leave the accumulator finite when it was made from a finite gradient and not
//! mutated.

use gradwire_codec::{BuildContext, CodecConfig, Header, TensorInfo, TensorRole};

/// Runs one fuzz input against the decoder of `spec`.
pub fn decode(spec: &str, data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let cfg: CodecConfig = spec.parse().expect("fuzz target spec parses");
    let mode = data[0];
    let n = u16::from_le_bytes([data[1], data[2]]) as usize % 3000;
    let layout = if mode & 2 != 0 && n >= 3 {
        vec![n / 3, n / 3, n - 2 * (n / 3)]
    } else {
        Vec::new()
    };
    let mut ctx = BuildContext::new(data[3] as u64, 0, 2, layout);
    if mode & 16 != 0 && ctx.layout.len() == 3 {
        let (a, b, c) = (ctx.layout[0], ctx.layout[1], ctx.layout[2]);
        // A `rows x cols` weight needs `cols` to divide its count: pick a small divisor.
        let cols = (1..=8).rev().find(|d| a % d == 0).unwrap_or(1);
        let ocols = (1..=8).rev().find(|d| c % d == 0).unwrap_or(1);
        ctx = ctx.with_tensors(vec![
            TensorInfo::new([a / cols, cols], TensorRole::LinearWeight),
            TensorInfo::new([b], TensorRole::Bias),
            TensorInfo::new([c / ocols, ocols], TensorRole::Output),
        ]);
    }
    let mut codec = cfg.build(&ctx);
    let rest = &data[4..];
    let mut payload = Vec::new();
    if mode & 1 == 0 {
        Header::write(&mut payload, cfg.id(), n);
        payload.extend_from_slice(rest);
    } else {
        let seed = data[3] as usize;
        let g: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 + seed * 31) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        codec.encode(&g, &mut payload);
        if rest.len() < 4 {
            let mut acc = vec![0f32; n];
            codec
                .decode_add(&payload, &mut acc)
                .expect("a codec decodes its own payload");
            assert!(
                acc.iter().all(|v| v.is_finite()),
                "{spec}: non-finite decode"
            );
            return;
        }
        let off = u16::from_le_bytes([rest[0], rest[1]]) as usize % (payload.len() + 1);
        let trunc = u16::from_le_bytes([rest[2], rest[3]]) as usize;
        for (p, x) in payload[off..].iter_mut().zip(&rest[4..]) {
            *p ^= x;
        }
        if mode & 4 != 0 {
            payload.truncate(trunc % (payload.len() + 1));
        }
    }
    let mut acc = vec![0f32; n];
    let _ = codec.decode_add(&payload, &mut acc);
    if mode & 8 != 0 {
        let _ = codec.load_state(rest);
        let _ = codec.decode_add(&payload, &mut acc);
    }
}

/// Runs one fuzz input against the shared-memory ring header decoder of `gradwire-transport`.
///
/// Input: the claimed file length (u64 LE), then the header bytes. The decoder must answer
/// Ok or a typed error without panicking; an accepted header must describe a consistent ring
/// and survive an encode/decode round trip.
pub fn shm_header(data: &[u8]) {
    use gradwire_transport::shm::header;
    if data.len() < 8 {
        return;
    }
    let file_len = u64::from_le_bytes(data[..8].try_into().expect("8 bytes"));
    let bytes = &data[8..];
    if let Ok(h) = header::decode(bytes, file_len) {
        assert!(h.capacity.is_power_of_two());
        assert_eq!(header::HEADER_LEN as u64 + h.capacity, file_len);
        assert!(h.src < h.world_size && h.dst < h.world_size && h.src != h.dst);
        let mut again = vec![0u8; header::HEADER_LEN];
        header::encode(&h, &mut again);
        assert_eq!(header::decode(&again, file_len), Ok(h));
    }
}
